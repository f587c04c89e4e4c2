#!/usr/bin/env bash
# Builds the benchmark programs into OUTDIR:
#   OUTDIR/cuda_bench        (nvcc -arch=sm_90 -O2, static cudart)
#   OUTDIR/tcp_loopback_bw   (g++ -O2)
#   OUTDIR/mapped_host_bench (nvcc, as cuda_bench)
#   OUTDIR/driver_call_overhead (g++ -O2; CUDA headers only: the cost of a driver call
#                            through a libcuda.so.1, with and without a CUPTI subscriber)
#   OUTDIR/shm_latency       (g++ -O2; CUDA headers only: small synchronous calls (4 B / 4 KiB
#                            device-to-host copies, launch + synchronize) through one or more
#                            libcuda.so.1, e.g. the real driver and Flyt's, compared in one run)
# Usage: bench/build.sh OUTDIR
# Environment: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc),
#              CXX (default g++), CUDA_ARCH (default sm_90).
# Each program is built independently; the exit status is non-zero if either failed.
set -u
if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUTDIR" >&2
  exit 1
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$1
mkdir -p "$out" || exit 1

nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
cxx=${CXX:-g++}
arch=${CUDA_ARCH:-sm_90}
rc=0

# libstdc++/libgcc linked statically so the binaries run on any GPU host with glibc.
if ! "$cxx" -std=c++17 -O2 -Wall -Wextra -pthread -static-libstdc++ -static-libgcc \
    -o "$out/tcp_loopback_bw" "$here/tcp_loopback_bw.cc"; then
  echo "build.sh: tcp_loopback_bw failed" >&2
  rc=1
fi

cuda_inc=$(dirname "$(dirname "$nvcc")")/include
if ! "$cxx" -std=c++17 -O2 -Wall -Wextra -static-libstdc++ -static-libgcc -I"$cuda_inc" \
    -o "$out/driver_call_overhead" "$here/driver_call_overhead.cc" -ldl; then
  echo "build.sh: driver_call_overhead failed" >&2
  rc=1
fi

if ! "$cxx" -std=c++17 -O2 -Wall -Wextra -static-libstdc++ -static-libgcc -I"$cuda_inc" \
    -o "$out/shm_latency" "$here/shm_latency.cc" -ldl; then
  echo "build.sh: shm_latency failed" >&2
  rc=1
fi

if [[ ! -x "$nvcc" ]]; then
  echo "build.sh: nvcc not found ($nvcc); cuda_bench not built" >&2
  rc=1
elif ! "$nvcc" -std=c++17 -O2 -arch="$arch" -cudart static \
    -Xcompiler -Wall,-Wextra -Xcompiler -static-libstdc++,-static-libgcc \
    -o "$out/cuda_bench" "$here/cuda_bench.cu"; then
  echo "build.sh: cuda_bench failed" >&2
  rc=1
fi
if [[ -x "$nvcc" ]] && ! "$nvcc" -std=c++17 -O2 -arch="$arch" -cudart static \
    -Xcompiler -Wall,-Wextra -Xcompiler -static-libstdc++,-static-libgcc \
    -o "$out/mapped_host_bench" "$here/mapped_host_bench.cu"; then
  echo "build.sh: mapped_host_bench failed" >&2
  rc=1
fi
exit $rc
