#!/usr/bin/env bash
# Stages a local build for the GPU machine: stripped binaries and client
# libraries, the UCX libraries ucx:// loads (lib/ucx/), plus the e2e test programs,
# into a folder small enough to carry (default build-gpu/). GPU test programs (tests/gpu/build.sh) and bench/ are
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
# UCX for ucx:// (GPU hosts have none): the libraries in lib/ucx/, its transport modules
# in lib/ucx/ucx/ (UCX looks for them beside libucs). flyt-server and libcuda.so.1 find
# lib/ucx/ relative to themselves (transport/ucx_api.h) and load it at the first ucx://
# use. Skipped when this machine has no UCX (ucx:// then says it is not available).
UCX_SRC=${FLYT_UCX_LIB_DIR:-/usr/lib/x86_64-linux-gnu}
rm -rf "$D/lib/ucx"
if [ -f "$UCX_SRC/libucp.so.0" ]; then
  mkdir -p "$D/lib/ucx/ucx"
  for l in libucp.so.0 libucs.so.0 libuct.so.0 libucm.so.0 libnuma.so.1; do
    src="$UCX_SRC/$l"
    [ -e "$src" ] || src="/lib/x86_64-linux-gnu/$l"
    [ -e "$src" ] && install -m 0644 "$(readlink -f "$src")" "$D/lib/ucx/$l"
  done
  for m in "$UCX_SRC"/ucx/*.so.0; do
    [ -e "$m" ] && install -m 0644 "$(readlink -f "$m")" "$D/lib/ucx/ucx/$(basename "$m")"
  done
  strip --strip-unneeded "$D"/lib/ucx/*.so.* "$D"/lib/ucx/ucx/*.so.* 2>/dev/null || true
else
  echo "stage_build: no UCX in $UCX_SRC: ucx:// will not be available on the GPU host" >&2
fi
git rev-parse --short HEAD > "$D/COMMIT"
du -sh "$D"
