#!/usr/bin/env bash
# Builds the GPU test programs (tests/gpu/programs) for Hopper, twice each:
#   OUTDIR/<name>.static   default (static) cudart
#   OUTDIR/<name>.shared   -cudart shared (libcudart.so.13 is copied into OUTDIR)
# A program is either programs/<name>.cu or a folder programs/<name>/ whose
# .cu files are compiled separately and linked together (main.cu holds the
# markers). Markers, one per line, in the main source:
#   // FLYT_NVCC: <extra nvcc flags>        (compile and link)
#   // FLYT_ARCH: <-gencode ...>            (replaces the default sm_90 SASS + compute_90 PTX)
#   // FLYT_LIBS: <-lfoo ...>               (link; e.g. -lcublas, -lcublasLt, -lnvrtc)
#   // FLYT_EXPECT_RC: <n>                  (exit code of a correct run; default 0)
#   // FLYT_RUN_LAST: 1                     (run alone after all others: it may break a shared
#                                           context, or prints from the device)
# Binaries are stripped and carry RUNPATH $ORIGIN:/usr/local/cuda/lib64, so the
# .shared ones find the copied libcudart and cuBLAS/NVRTC come from the GPU
# host's CUDA toolkit. Also writes OUTDIR/programs.tsv (name, expected rc,
# run-last flag) for run_programs.sh, and OUTDIR/BUILD_INFO.
# Flyt-only programs (FLYT_ONLY below: tests/gpu/<name>.cu, whose output depends
# on Flyt's settings, so no native comparison) go to OUTDIR/flyt-only/<name>.static
# and .shared, outside programs.tsv; their own scripts run them (run_sm_share.sh).
# Isolation programs (tests/gpu/isolation/*.cu: first_kernel, steady, printf_tag)
# go to OUTDIR/isolation/<name>.static, outside programs.tsv; run_isolation.sh
# runs them.
#
# Usage: tests/gpu/build.sh OUTDIR        (env: NVCC, JOBS; default JOBS = nproc)
# Exit status: 0 when every program built in both variants.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROG_DIR="$HERE/programs"
FLYT_ONLY=(sm_share)
ISOLATION=()
for f in "$HERE"/isolation/*.cu; do [[ -f "$f" ]] && ISOLATION+=("$(basename "$f" .cu)"); done
DEFAULT_ARCH="-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90"

find_nvcc() {
  if [[ -n "${NVCC:-}" ]]; then echo "$NVCC"; return 0; fi
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then echo /usr/local/cuda/bin/nvcc; return 0; fi
  command -v nvcc || { echo "nvcc not found (set NVCC)" >&2; return 1; }
}

# marker FILE NAME -> value of the first "// NAME: value" line, or nothing.
marker() {
  sed -n "s|^// $2: *||p" "$1" | head -n 1
}

main_source() {  # NAME -> the file that holds the markers
  if [[ -f "$PROG_DIR/$1.cu" ]]; then echo "$PROG_DIR/$1.cu"; else echo "$PROG_DIR/$1/main.cu"; fi
}

# build_one OUTDIR LOGDIR NAME VARIANT: compile one program in one variant.
build_one() {
  local outdir=$1 logdir=$2 name=$3 variant=$4
  local nvcc main arch extra libs out work
  nvcc=$(find_nvcc) || return 1
  main=$(main_source "$name")
  arch=$(marker "$main" FLYT_ARCH)
  [[ -n "$arch" ]] || arch=$DEFAULT_ARCH
  extra=$(marker "$main" FLYT_NVCC)
  libs=$(marker "$main" FLYT_LIBS)
  out="$outdir/$name.$variant"
  work="$outdir/.obj/$name.$variant"
  rm -rf "$work" "$out"
  mkdir -p "$work" || return 1
  # shellcheck disable=SC2206  # marker values are flag lists: split on purpose
  local common=(-O2 -std=c++17 $arch $extra -I"$PROG_DIR")
  # shellcheck disable=SC2206
  local libv=($libs)
  # RUNPATH (not RPATH), so LD_LIBRARY_PATH keeps precedence.
  # shellcheck disable=SC2016  # $ORIGIN is for the dynamic linker, not the shell
  local link=(-cudart "$variant" -Xlinker --enable-new-dtags
              -Xlinker -rpath -Xlinker '$ORIGIN:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib')
  local rc=0
  if [[ -d "$PROG_DIR/$name" ]]; then
    local objs=() src obj
    for src in "$PROG_DIR/$name"/*.cu; do
      obj="$work/$(basename "$src" .cu).o"
      echo "+ nvcc ${common[*]} -c $src -o $obj"
      "$nvcc" "${common[@]}" -c "$src" -o "$obj" || { rc=1; break; }
      objs+=("$obj")
    done
    if [[ $rc -eq 0 ]]; then
      echo "+ nvcc ${common[*]} ${link[*]} ${objs[*]} ${libv[*]} -o $out"
      "$nvcc" "${common[@]}" "${link[@]}" "${objs[@]}" "${libv[@]}" -o "$out" || rc=1
    fi
  else
    echo "+ nvcc ${common[*]} ${link[*]} $main ${libv[*]} -o $out"
    "$nvcc" "${common[@]}" "${link[@]}" "$main" "${libv[@]}" -o "$out" || rc=1
  fi
  [[ $rc -eq 0 ]] && { strip "$out" || rc=1; }
  rm -rf "$work"
  return $rc
}

# build_flyt_only OUTDIR NAME VARIANT: tests/gpu/NAME.cu -> OUTDIR/flyt-only/NAME.VARIANT
build_flyt_only() {
  local outdir=$1 name=$2 variant=$3 nvcc out
  nvcc=$(find_nvcc) || return 1
  out="$outdir/flyt-only/$name.$variant"
  mkdir -p "$outdir/flyt-only" || return 1
  rm -f "$out"
  # shellcheck disable=SC2206
  local arch=($DEFAULT_ARCH)
  echo "+ nvcc -O2 -std=c++17 ${arch[*]} -cudart $variant $HERE/$name.cu -o $out"
  # shellcheck disable=SC2016  # $ORIGIN is for the dynamic linker, not the shell
  "$nvcc" -O2 -std=c++17 "${arch[@]}" -cudart "$variant" -Xlinker --enable-new-dtags \
    -Xlinker -rpath -Xlinker '$ORIGIN/..:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib' \
    "$HERE/$name.cu" -o "$out" && strip "$out"
}

# build_isolation OUTDIR NAME: tests/gpu/isolation/NAME.cu -> OUTDIR/isolation/NAME.static
build_isolation() {
  local outdir=$1 name=$2 nvcc out
  nvcc=$(find_nvcc) || return 1
  out="$outdir/isolation/$name.static"
  mkdir -p "$outdir/isolation" || return 1
  rm -f "$out"
  # shellcheck disable=SC2206
  local arch=($DEFAULT_ARCH)
  echo "+ nvcc -O2 -std=c++17 ${arch[*]} -I$PROG_DIR -cudart static $HERE/isolation/$name.cu -o $out"
  # shellcheck disable=SC2016  # $ORIGIN is for the dynamic linker, not the shell
  "$nvcc" -O2 -std=c++17 "${arch[@]}" -I"$PROG_DIR" -cudart static -Xlinker --enable-new-dtags \
    -Xlinker -rpath -Xlinker '$ORIGIN/..:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib' \
    "$HERE/isolation/$name.cu" -o "$out" && strip "$out"
}

# Internal: one job of the parallel build (called through xargs).
if [[ "${1:-}" == "--one" ]]; then
  shift
  outdir=$1 logdir=$2 name=$3 variant=$4
  if [[ $name == isolation/* ]]; then
    name=${name#isolation/}
    if build_isolation "$outdir" "$name" >"$logdir/isolation.$name.log" 2>&1; then
      echo "  ok      isolation/$name.static"
      exit 0
    fi
    echo "  FAILED  isolation/$name.static"
    exit 1
  fi
  if [[ " ${FLYT_ONLY[*]} " == *" $name "* && ! -f "$PROG_DIR/$name.cu" ]]; then
    if build_flyt_only "$outdir" "$name" "$variant" >"$logdir/$name.$variant.log" 2>&1; then
      echo "  ok      flyt-only/$name.$variant"
      exit 0
    fi
    echo "  FAILED  flyt-only/$name.$variant"
    exit 1
  fi
  if build_one "$outdir" "$logdir" "$name" "$variant" >"$logdir/$name.$variant.log" 2>&1; then
    echo "  ok      $name.$variant"
    exit 0
  fi
  echo "  FAILED  $name.$variant"
  exit 1
fi

OUTDIR=${1:?usage: $0 OUTDIR}
mkdir -p "$OUTDIR" || exit 1
OUTDIR=$(cd "$OUTDIR" && pwd)
NVCC_BIN=$(find_nvcc) || exit 2
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/flyt-gpu-build.XXXXXX")
trap 'rm -rf "$LOGDIR"' EXIT

names=()
for f in "$PROG_DIR"/*.cu; do names+=("$(basename "$f" .cu)"); done
for d in "$PROG_DIR"/*/; do
  [[ -f "$d/main.cu" ]] && names+=("$(basename "$d")")
done
mapfile -t names < <(printf '%s\n' "${names[@]}" | sort)

echo "building ${#names[@]} programs (+ ${#FLYT_ONLY[@]} Flyt-only) x 2 variants + ${#ISOLATION[@]} isolation programs with $JOBS jobs into $OUTDIR"
start=$(date +%s)
{
  for n in "${names[@]}" "${FLYT_ONLY[@]}"; do printf '%s static\n%s shared\n' "$n" "$n"; done
  for n in "${ISOLATION[@]}"; do printf 'isolation/%s static\n' "$n"; done
} | xargs -P "$JOBS" -n 2 bash "$HERE/build.sh" --one "$OUTDIR" "$LOGDIR"
xargs_rc=$?
rmdir "$OUTDIR/.obj" 2>/dev/null

# Shared-cudart binaries find libcudart next to them ($ORIGIN).
cudart=""
for c in "$(dirname "$NVCC_BIN")/../lib64/libcudart.so.13" \
         "$(dirname "$NVCC_BIN")/../targets/x86_64-linux/lib/libcudart.so.13"; do
  [[ -f "$c" ]] && { cudart=$c; break; }
done
if [[ -n "$cudart" ]]; then
  cp -L "$cudart" "$OUTDIR/libcudart.so.13"
else
  echo "warning: libcudart.so.13 not found next to $NVCC_BIN; .shared binaries need it on the GPU host" >&2
fi

failed=0
{
  printf 'name\texpect_rc\trun_last\n'
  for n in "${names[@]}"; do
    m=$(main_source "$n")
    rc=$(marker "$m" FLYT_EXPECT_RC)
    last=$(marker "$m" FLYT_RUN_LAST)
    printf '%s\t%s\t%s\n' "$n" "${rc:-0}" "${last:-0}"
  done
} >"$OUTDIR/programs.tsv"
for n in "${names[@]}"; do
  for v in static shared; do
    if [[ ! -x "$OUTDIR/$n.$v" ]]; then
      failed=$((failed + 1))
      echo "---- build log of $n.$v (last 40 lines) ----"
      tail -n 40 "$LOGDIR/$n.$v.log" 2>/dev/null
    fi
  done
done
for n in "${FLYT_ONLY[@]}"; do
  for v in static shared; do
    if [[ ! -x "$OUTDIR/flyt-only/$n.$v" ]]; then
      failed=$((failed + 1))
      echo "---- build log of flyt-only/$n.$v (last 40 lines) ----"
      tail -n 40 "$LOGDIR/$n.$v.log" 2>/dev/null
    fi
  done
done
for n in "${ISOLATION[@]}"; do
  if [[ ! -x "$OUTDIR/isolation/$n.static" ]]; then
    failed=$((failed + 1))
    echo "---- build log of isolation/$n.static (last 40 lines) ----"
    tail -n 40 "$LOGDIR/isolation.$n.log" 2>/dev/null
  fi
done
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "nvcc: $("$NVCC_BIN" --version | tail -n 1)"
  echo "arch: $DEFAULT_ARCH"
  echo "programs: ${#names[@]}"
  echo "flyt-only programs: ${FLYT_ONLY[*]}"
  echo "isolation programs: ${ISOLATION[*]}"
  echo "failed: $failed"
} >"$OUTDIR/BUILD_INFO"

size=$(du -sh "$OUTDIR" | cut -f1)
bytes=$(du -sb "$OUTDIR" | cut -f1)
echo "built $(( (${#names[@]} + ${#FLYT_ONLY[@]}) * 2 + ${#ISOLATION[@]} - failed ))/$(( (${#names[@]} + ${#FLYT_ONLY[@]}) * 2 + ${#ISOLATION[@]} )) binaries in $(( $(date +%s) - start )) s; $OUTDIR holds $size ($bytes bytes)"
if [[ $failed -ne 0 || $xargs_rc -ne 0 ]]; then
  echo "build FAILED ($failed binaries missing)"
  exit 1
fi
exit 0
