#!/usr/bin/env bash
# Native probe of local memory and module placement (see probe.cc). Usage: run.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd); t=$(mktemp -d); CUDA=${CUDA_HOME:-/usr/local/cuda}
"$CUDA/bin/nvcc" -cubin -arch=sm_90 -o "$t/a.cubin" "$here/a.cu"
"$CUDA/bin/nvcc" -cubin -arch=sm_90 -o "$t/b.cubin" "$here/b.cu"
g++ -O1 -I"$CUDA/include" "$here/probe.cc" -o "$t/probe" -L"$CUDA/lib64/stubs" -lcuda
for m in 1 2; do setarch -R "$t/probe" $m "$t/a.cubin" "$t/b.cubin"; done
st=$(setarch -R "$t/probe" 2 "$t/a.cubin" "$t/b.cubin" | sed -n 's/.*after \([0-9]*\).*/\1/p')
for m in 3 4; do setarch -R "$t/probe" $m "$t/a.cubin" "$t/b.cubin" "$st"; done
