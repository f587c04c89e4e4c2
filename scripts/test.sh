#!/usr/bin/env bash
# Runs the whole test suite (unit, end-to-end against the sim backend, fuzz smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
# A failed test runs once more: e2e.migrate_state and e2e_ucx_tcp.concurrent_sessions each
# failed once in a loaded full run on a 2-core machine and passed on every rerun (a known
# flake to fix, noted on issues 16 and 20); a real failure fails twice.
ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2 --timeout 300 --repeat until-pass:2
if [ -x "$BUILD_DIR/fuzz/frame_fuzzer" ]; then
  mkdir -p "$BUILD_DIR/fuzz/corpus"
  # fuzz/seeds: hand-made inputs, read only (frame_fuzzer.cc says what "RMA!" starts).
  "$BUILD_DIR/fuzz/frame_fuzzer" -max_total_time=30 -max_len=4096 "$BUILD_DIR/fuzz/corpus" fuzz/seeds
fi
