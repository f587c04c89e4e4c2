#!/usr/bin/env bash
# Installs every build and test dependency of Flyt from Debian packages.
# The CUDA toolkit (nvcc and headers, /usr/local/cuda) is expected to be present:
# Flyt builds against NVIDIA's headers and builds its test programs with nvcc, but
# links none of NVIDIA's libraries.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake python3 libgtest-dev libgmock-dev libzstd-dev liblz4-dev \
  clang libclang-rt-14-dev clang-format procps \
  nlohmann-json3-dev libtoml11-dev libssl-dev libsqlite3-dev libpq-dev postgresql \
  libcpp-httplib-dev libxxhash-dev prometheus chromium debootstrap dpkg-dev \
  libucx-dev openssl >/dev/null
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps: the CUDA toolkit (nvcc, cuda.h) was not found under /usr/local/cuda;" >&2
  echo "install CUDA 13 from NVIDIA and re-run" >&2
  exit 1
fi
echo "install-deps: done"
