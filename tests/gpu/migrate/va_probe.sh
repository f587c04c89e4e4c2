#!/usr/bin/env bash
# Builds and runs va_probe natively on the GPU machine (see va_probe.cc).
# Usage: tests/gpu/migrate/va_probe.sh OUTFILE
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-/dev/stdout}
tmp=$(mktemp -d)
CUDA=${CUDA_HOME:-/usr/local/cuda}
g++ -std=c++17 -O1 -I"$CUDA/include" "$here/va_probe.cc" -o "$tmp/va_probe" -L"$CUDA/lib64/stubs" -lcuda \
  && "$tmp/va_probe" >"$out" 2>&1
rc=$?
rm -rf "$tmp"
exit $rc
