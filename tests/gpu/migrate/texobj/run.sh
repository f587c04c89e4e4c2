#!/usr/bin/env bash
# Native probe of texture object values (see probe.cc). Usage: run.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd); t=$(mktemp -d); CUDA=${CUDA_HOME:-/usr/local/cuda}
g++ -O1 -I"$CUDA/include" "$here/probe.cc" -o "$t/probe" -L"$CUDA/lib64/stubs" -lcuda
for extra in 0 0 3; do "$t/probe" "$extra"; done
