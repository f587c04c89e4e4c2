#!/usr/bin/env bash
# Runs the whole test suite (unit, end-to-end against the sim backend, fuzz smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2 --timeout 300
if [ -x "$BUILD_DIR/fuzz/frame_fuzzer" ]; then
  mkdir -p "$BUILD_DIR/fuzz/corpus"
  # fuzz/seeds: hand-made inputs, read only (frame_fuzzer.cc says what "RMA!" starts).
  "$BUILD_DIR/fuzz/frame_fuzzer" -max_total_time=30 -max_len=4096 "$BUILD_DIR/fuzz/corpus" fuzz/seeds
fi
