#!/usr/bin/env bash
# Stages a local build for the GPU machine: stripped binaries and client
# libraries, plus the e2e test programs, into a folder small enough to carry
# (default build-gpu/). GPU test programs (tests/gpu/build.sh) and bench/ are
# left as they are. Usage: tests/gpu/stage_build.sh [BUILD_DIR] [STAGE_DIR]
set -euo pipefail
B=${1:-build}
D=${2:-build-gpu}
mkdir -p "$D/bin" "$D/lib/flyt" "$D/e2e-programs"
install -s "$B/bin/flyt-server" "$B/bin/flyt" "$D/bin/"
rm -f "$D"/lib/flyt/*
cp -a "$B"/lib/flyt/. "$D/lib/flyt/"
for f in "$D"/lib/flyt/*; do [ -L "$f" ] || strip --strip-unneeded "$f"; done
for p in "$B"/tests/e2e/programs/*; do
  case "$p" in *.o) continue ;; esac
  [ -x "$p" ] && [ -f "$p" ] && install -s "$p" "$D/e2e-programs/" 2>/dev/null || true
done
git rev-parse --short HEAD > "$D/COMMIT"
du -sh "$D"
