#!/usr/bin/env bash
# One GPU-machine run of everything, for the device runner:
#   bash tests/gpu/run_suite.sh            (from the repository root, $OUT set)
# Steps (each runs even if an earlier one failed; the whole run stays within
# SUITE_BUDGET_S, default 530 s):
#   1. environment: nvidia-smi -L, GPU name + driver, CUDA, date, commit
#      (git, or build/COMMIT when .git is absent)
#   2. test binaries: $GPU_BIN_DIR (default build/gpu-tests, made on the CI
#      machine by tests/gpu/build.sh); built here with nvcc if absent
#   3. tests/gpu/run_programs.sh build $GPU_BIN_DIR (native vs flyt over TCP and Unix)
#   3b. tests/gpu/run_sm_share.sh (Flyt-only: SM share and memory quota changed live)
#   3c. tests/gpu/isolation/run_isolation.sh (unless ISOLATION_SUITE=0): many programs at
#       once through one server per transport, faulting ones included, vs native;
#       process start -> first kernel, native vs Flyt (pool warm and cold)
#   4. bash bench/run.sh build "$OUT", if bench/run.sh exists
#   5. with ML_SUITE=1: tests/gpu/ml/run_ml.py (ml.md, ml-logs.tgz), if torch imports
# Writes to $OUT (at most 8 files come back):
#   summary.md        everything above, rewritten after every step
#   server.log        the flyt-server logs of step 3 (capped at 15 MiB)
#   gpu-run-logs.tgz  outputs, stderr and client logs of every run, step 3's and 3c's
#                     (if < 15 MiB)
#   isolation.md      step 3c's report, as it wrote it
#   bench.md          bench/run.sh's report, as it wrote it
#   bench-files.tgz   every other file bench/run.sh left in $OUT (raw/, *.tsv, ...),
#                     packed so that $OUT stays under 8 files; bench's built
#                     binaries ($OUT/bin) are dropped
# Environment: SUITE_BUDGET_S=530, PROGRAMS_BUDGET_S=300 (step 3's share),
#   SUITE_JOBS=4 (programs run in parallel), RUN_TIMEOUT=60, GPU_BIN_DIR,
#   BUILD_DIR=build, plus run_programs.sh's (MODES, PROGRAMS, FLYT_TOKEN, ...).
#   ISOLATION_SUITE=1, ISOLATION_BUDGET_S=150 (step 3c's share, cut to what is left
#   less 60 s), ISO_MODES="tcp unix shm", ISO_RUN_TIMEOUT=30, plus
#   run_isolation.sh's (TIMING_RUNS, ISO_WAVE1, ...).
set -uo pipefail

SUITE_START=$(date +%s)
SUITE_BUDGET_S=${SUITE_BUDGET_S:-530}
PROGRAMS_BUDGET_S=${PROGRAMS_BUDGET_S:-300}
SUITE_JOBS=${SUITE_JOBS:-4}
RUN_TIMEOUT=${RUN_TIMEOUT:-60}
BUILD_DIR=${BUILD_DIR:-build}
GPU_BIN_DIR=${GPU_BIN_DIR:-$BUILD_DIR/gpu-tests}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [[ -z "${OUT:-}" ]]; then
  OUT=$(mktemp -d "${TMPDIR:-/tmp}/flyt-suite-out.XXXXXX")
  echo "OUT not set; writing to $OUT" >&2
fi
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/flyt-suite.XXXXXX")
SUMMARY="$OUT/summary.md"
STEPS="$WORK/steps.tsv"   # step \t status \t seconds \t note
: >"$STEPS"

left() { echo $((SUITE_BUDGET_S - ($(date +%s) - SUITE_START))); }
exec 3>&2  # progress lines go to the original stderr even inside redirected steps
say() { echo "[run_suite $(date +%H:%M:%S) +$(($(date +%s) - SUITE_START))s] $*" >&3; }

# step NAME TIMEOUT_S CMD...: runs CMD with a time limit, records the outcome.
step() {
  local name=$1 limit=$2 t0 rc status
  shift 2
  if [[ $limit -lt 5 ]]; then
    printf '%s\tskipped\t0\tno time left\n' "$name" >>"$STEPS"
    say "$name: skipped (no time left)"
    return 1
  fi
  say "$name: start (limit ${limit}s)"
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@"
  rc=$?
  case $rc in
    0) status=ok ;;
    124 | 137) status="timeout after ${limit}s" ;;
    *) status="failed (rc $rc)" ;;
  esac
  printf '%s\t%s\t%s\t\n' "$name" "$status" "$(($(date +%s) - t0))" >>"$STEPS"
  say "$name: $status"
  return $rc
}

# ------------------------------------------------------------ environment --
ENV_MD="$WORK/env.md"
collect_env() {
  local smi_l gpu drv commit cuda
  smi_l=$(timeout 20 nvidia-smi -L 2>&1) || smi_l="nvidia-smi -L failed: $smi_l"
  gpu=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  drv=$(timeout 20 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  if git rev-parse --git-dir >/dev/null 2>&1 && commit=$(git rev-parse HEAD 2>/dev/null); then
    [[ -n "$(git status --porcelain 2>/dev/null | head -n 1)" ]] && commit+=" (working tree modified)"
  elif [[ -f "$BUILD_DIR/COMMIT" ]]; then
    commit="$(head -n 1 "$BUILD_DIR/COMMIT") (from $BUILD_DIR/COMMIT)"
  else
    commit="unknown (no .git, no $BUILD_DIR/COMMIT)"
  fi
  cuda=$(python3 -c 'import json; print(json.load(open("/usr/local/cuda/version.json"))["cuda"]["version"])' 2>/dev/null)
  [[ -n "$cuda" ]] || cuda=$(/usr/local/cuda/bin/nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  {
    echo "| | |"
    echo "|---|---|"
    echo "| date (UTC) | $(date -u +%Y-%m-%dT%H:%M:%SZ) |"
    echo "| GPU | ${gpu:-unknown} |"
    echo "| driver | ${drv:-unknown} |"
    echo "| CUDA toolkit on host | ${cuda:-unknown} |"
    echo "| commit | $commit |"
    echo "| host | $(uname -r), $(nproc) CPUs |"
    echo
    echo '```'
    echo "$smi_l"
    echo '```'
  } >"$ENV_MD"
}

write_summary() {
  {
    echo "# Flyt GPU suite"
    echo
    cat "$ENV_MD" 2>/dev/null
    echo
    echo "## Steps"
    echo
    echo "| step | status | seconds | note |"
    echo "|---|---|---|---|"
    while IFS=$'\t' read -r n s t note; do echo "| $n | $s | $t | $note |"; done <"$STEPS"
    echo
    echo "Total so far: $(($(date +%s) - SUITE_START)) s of a ${SUITE_BUDGET_S} s budget."
    if [[ -s "$WORK/build.txt" ]]; then
      echo
      echo "## Test binaries"
      echo
      echo '```'
      tail -n 60 "$WORK/build.txt"
      echo '```'
    fi
    if [[ -f "$WORK/programs.md" ]]; then
      echo
      sed '/^### Failure details/,$d' "$WORK/programs.md"   # details go last
    elif [[ -s "$WORK/programs.txt" ]]; then
      echo
      echo "## Programs (no report written; console tail)"
      echo '```'
      tail -n 60 "$WORK/programs.txt"
      echo '```'
    fi
    if [[ -s "$OUT/ml.md" ]]; then
      echo
      sed -n '/^## Cases/,/^## Failure details/p' "$OUT/ml.md" | sed '$d'
    fi
    if [[ -s "$OUT/bench.md" ]]; then
      echo
      echo "## Bench (bench.md)"
      echo
      cat "$OUT/bench.md"
    fi
    if [[ -s "$WORK/bench.txt" ]]; then
      echo
      echo "## Bench console (last 40 lines)"
      echo
      echo '```'
      tail -n 40 "$WORK/bench.txt"
      echo '```'
    fi
    if [[ -f "$WORK/sm_share.md" ]]; then
      echo
      cat "$WORK/sm_share.md"
    fi
    if [[ -s "$OUT/isolation.md" ]]; then
      echo
      sed '/^### Isolation failure details/,$d' "$OUT/isolation.md"   # details go last
    elif [[ -s "$WORK/isolation.txt" ]]; then
      echo
      echo "## Isolation (no report written; console tail)"
      echo '```'
      tail -n 40 "$WORK/isolation.txt"
      echo '```'
    fi
    if grep -q '^### Failure details' "$WORK/programs.md" 2>/dev/null; then
      echo
      echo "## Programs: failure details"
      sed -n '/^### Failure details/,$p' "$WORK/programs.md" | sed '1d'
    fi
    if grep -q '^### Isolation failure details' "$OUT/isolation.md" 2>/dev/null; then
      echo
      echo "## Isolation: failure details"
      sed -n '/^### Isolation failure details/,$p' "$OUT/isolation.md" | sed '1d'
    fi
    echo
    echo "## Files in OUT"
    echo
    local count=0 f
    for f in "$OUT"/* "$OUT"/*/* "$OUT"/*/*/*; do
      [[ -f "$f" && "$f" != "$SUMMARY" ]] || continue
      count=$((count + 1))
      echo "- ${f#"$OUT"/} ($(stat -c %s "$f") bytes)"
    done
    if [[ $count -gt 8 ]]; then
      echo
      echo "**Warning: $count files in OUT; only 8 come back.**"
    fi
  } >"$WORK/summary.md"
  cp "$WORK/summary.md" "$SUMMARY"
}

collect_env
write_summary
say "environment recorded: $(grep -m1 '^| GPU' "$ENV_MD")"

# --------------------------------------------------------------- binaries --
if [[ -f "$GPU_BIN_DIR/programs.tsv" ]]; then
  echo "using prebuilt test binaries in $GPU_BIN_DIR ($(du -sh "$GPU_BIN_DIR" | cut -f1))" >"$WORK/build.txt"
  cat "$GPU_BIN_DIR/BUILD_INFO" >>"$WORK/build.txt" 2>/dev/null
  printf 'test binaries\tprebuilt\t0\t%s\n' "$GPU_BIN_DIR" >>"$STEPS"
else
  GPU_BIN_DIR="$WORK/gpu-tests"
  step "build test binaries here" "$(( $(left) < 150 ? $(left) : 150 ))" \
    bash "$HERE/build.sh" "$GPU_BIN_DIR" >"$WORK/build.txt" 2>&1
fi
write_summary

# --------------------------------------------------------------- programs --
budget=$(left)
budget=$(( budget - 60 ))                      # keep a minute for bench and the wrap-up
[[ $budget -gt $PROGRAMS_BUDGET_S ]] && budget=$PROGRAMS_BUDGET_S
if [[ -f "$GPU_BIN_DIR/programs.tsv" ]] || compgen -G "$GPU_BIN_DIR/*.static" >/dev/null; then
  # run_programs starts no run after its deadline and cuts each run's timeout
  # to the time left, so 20 s are enough for it to write its report.
  deadline=$(( budget - 20 ))
  [[ $deadline -lt 30 ]] && deadline=30
  step "run_programs (native vs flyt)" "$budget" \
    env FLYT_GPU_WORKDIR="$WORK/programs" DEADLINE_S="$deadline" JOBS="$SUITE_JOBS" RUN_TIMEOUT="$RUN_TIMEOUT" \
    bash "$HERE/run_programs.sh" "$BUILD_DIR" "$GPU_BIN_DIR" "$WORK/programs.md" >"$WORK/programs.txt" 2>&1
  # If run_programs was killed before its own clean-up, stop its server.
  spid=$(cat "$WORK/programs/server.pid" 2>/dev/null)
  if [[ -n "$spid" ]] && kill -0 "$spid" 2>/dev/null; then
    say "stopping a flyt-server left running (pid $spid)"
    kill -TERM "$spid" 2>/dev/null; sleep 2; kill -0 "$spid" 2>/dev/null && kill -KILL "$spid" 2>/dev/null
  fi
  # The table's last line says what passed; copy it into the steps table.
  result=$(grep -m1 '^\*\*Result' "$WORK/programs.md" 2>/dev/null | tr -d '*')
  [[ -n "$result" ]] && sed -i "\$s|\t\$|\t$result|" "$STEPS"
else
  printf 'run_programs (native vs flyt)\tskipped\t0\tno test binaries\n' >>"$STEPS"
fi
# Server logs: one file, capped.
if compgen -G "$WORK/programs/logs/server.*.log" >/dev/null; then
  for f in "$WORK"/programs/logs/server.*.log; do
    echo "===== $(basename "$f") ====="
    cat "$f"
  done >"$WORK/server.log"
  if [[ $(stat -c %s "$WORK/server.log") -gt $((15 << 20)) ]]; then
    { head -c $((5 << 20)) "$WORK/server.log"; echo; echo "===== [cut: middle of the log dropped] ====="; tail -c $((10 << 20)) "$WORK/server.log"; } >"$OUT/server.log"
  else
    cp "$WORK/server.log" "$OUT/server.log"
  fi
fi
# pack_run_logs: $OUT/gpu-run-logs.tgz from the work dirs of step 3 (programs/)
# and step 3c (isolation/), whichever exist; isolation/ is left out if both
# together pass 15 MiB.
pack_run_logs() {
  local dirs=() d
  for d in programs isolation; do [[ -d "$WORK/$d" ]] && dirs+=("$d"); done
  [[ ${#dirs[@]} -gt 0 ]] || return 0
  tar -C "$WORK" -czf "$WORK/gpu-run-logs.tgz" --exclude='*.sock' --exclude='isolation/bins' \
    "${dirs[@]}" 2>/dev/null
  if [[ $(stat -c %s "$WORK/gpu-run-logs.tgz" 2>/dev/null || echo 0) -ge $((15 << 20)) && -d "$WORK/programs" ]]; then
    tar -C "$WORK" -czf "$WORK/gpu-run-logs.tgz" --exclude='*.sock' programs 2>/dev/null
  fi
  if [[ -f "$WORK/gpu-run-logs.tgz" && $(stat -c %s "$WORK/gpu-run-logs.tgz") -lt $((15 << 20)) ]]; then
    cp "$WORK/gpu-run-logs.tgz" "$OUT/"
  fi
}
pack_run_logs
write_summary

# --------------------------------------------------------------- sm share --
if [[ -x "$GPU_BIN_DIR/flyt-only/sm_share.static" ]]; then
  limit=$(( $(left) - 60 ))
  [[ $limit -gt 150 ]] && limit=150
  step "run_sm_share (live SM/memory change)" "$limit" \
    env FLYT_GPU_WORKDIR="$WORK/sm_share" \
    bash "$HERE/run_sm_share.sh" "$BUILD_DIR" "$GPU_BIN_DIR" "$WORK/sm_share.md" >"$WORK/sm_share.txt" 2>&1
else
  printf 'run_sm_share\tskipped\t0\tno flyt-only/sm_share binary\n' >>"$STEPS"
fi
write_summary

# -------------------------------------------------------------- isolation --
# One flyt-server, many processes at once per transport, three of them faulting
# on purpose: each must match its native run; then time to first kernel.
if [[ "${ISOLATION_SUITE:-1}" == 1 ]]; then
  limit=$(( $(left) - 60 ))                     # keep a minute for bench and the wrap-up
  [[ $limit -gt ${ISOLATION_BUDGET_S:-150} ]] && limit=${ISOLATION_BUDGET_S:-150}
  if [[ ! -f "$HERE/isolation/run_isolation.sh" ]]; then
    printf 'isolation (tests/gpu/isolation)\tskipped\t0\tno run_isolation.sh\n' >>"$STEPS"
  else
    # run_isolation ends by itself (and writes isolation.md) 15 s before the step's limit.
    step "isolation (one server, faults, many processes)" "$limit" \
      env FLYT_GPU_WORKDIR="$WORK/isolation" BUDGET_S="$(( limit > 30 ? limit - 15 : 15 ))" \
      MODES="${ISO_MODES:-tcp unix shm}" RUN_TIMEOUT="${ISO_RUN_TIMEOUT:-30}" \
      bash "$HERE/isolation/run_isolation.sh" "$BUILD_DIR" "$GPU_BIN_DIR" "$OUT/isolation.md" \
      >"$WORK/isolation.txt" 2>&1
    result=$(grep -m1 '^\*\*Result' "$OUT/isolation.md" 2>/dev/null | tr -d '*')
    [[ -n "$result" ]] && sed -i "\$s|\t\$|\t$result|" "$STEPS"
    pack_run_logs
  fi
else
  printf 'isolation (tests/gpu/isolation)\tskipped\t0\tISOLATION_SUITE=0\n' >>"$STEPS"
fi
write_summary

# ------------------------------------------------------------------ bench --
if [[ -f bench/run.sh ]]; then
  limit=$(( $(left) - 15 ))
  # bench/run.sh has its own deadline: make it end (and write bench.md) before ours.
  step "bench/run.sh" "$limit" \
    env FLYT_BENCH_DEADLINE="${FLYT_BENCH_DEADLINE:-$(( limit > 40 ? limit - 30 : 10 ))}" \
    bash bench/run.sh "$BUILD_DIR" "$OUT" >"$WORK/bench.txt" 2>&1
else
  printf 'bench/run.sh\tskipped\t0\tbench/run.sh not found\n' >>"$STEPS"
fi

# ---------------------------------------------------------------- ML suite --
# ML_SUITE=1: PyTorch, CuPy and NVML cases and the training/decode benchmarks
# (tests/gpu/ml/run_ml.py) with what is left of the budget, when torch imports.
if [[ "${ML_SUITE:-0}" == 1 ]]; then
  limit=$(( $(left) - 15 ))
  if ! python3 -c 'import torch' >/dev/null 2>&1; then
    printf 'ML suite (tests/gpu/ml)\tskipped\t0\tpython3 cannot import torch\n' >>"$STEPS"
  else
    step "ML suite (tests/gpu/ml)" "$limit" \
      python3 "$HERE/ml/run_ml.py" --build "$BUILD_DIR" --out "$OUT" \
      --budget "$(( limit > 60 ? limit - 20 : 40 ))" >"$WORK/ml.txt" 2>&1
  fi
  write_summary
fi

# Only 8 files come back: pack whatever else landed in $OUT into one archive.
KEEP=" summary.md server.log gpu-run-logs.tgz bench.md ml.md ml-logs.tgz isolation.md "
extra=()
while IFS= read -r -d '' f; do
  rel=${f#"$OUT"/}
  [[ "$KEEP" == *" $rel "* || $rel == bin/* || $rel == *.sock ]] && continue
  extra+=("$rel")
done < <(find "$OUT" -mindepth 1 \( -type f -o -type l \) -print0)
if [[ ${#extra[@]} -gt 0 ]]; then
  if tar -C "$OUT" -czf "$WORK/bench-files.tgz" "${extra[@]}" 2>/dev/null; then
    (cd "$OUT" && rm -f "${extra[@]}")
    cp "$WORK/bench-files.tgz" "$OUT/bench-files.tgz"
  fi
fi
rm -rf "${OUT:?}/bin"
find "$OUT" -mindepth 1 -type d -empty -delete 2>/dev/null

write_summary
say "done in $(($(date +%s) - SUITE_START)) s; summary: $SUMMARY"
cat "$SUMMARY"
# Exit status: 0 when every step that ran succeeded.
if cut -f2 "$STEPS" | grep -qvE '^(ok|prebuilt|skipped)$'; then exit 1; fi
exit 0
