#!/usr/bin/env bash
# Process isolation through one flyt-server on a GPU host (issue 12): many
# programs at once, three of them faulting on purpose, each compared with its
# native run; then process start -> first kernel, native vs Flyt (pool warm
# and cold).
#
# Usage: tests/gpu/isolation/run_isolation.sh BUILD_DIR BIN_DIR OUTFILE
#   BUILD_DIR  Flyt build (BUILD_DIR/bin/flyt-server, BUILD_DIR/bin/flyt)
#   BIN_DIR    output of tests/gpu/build.sh (<name>.<variant>, isolation/*.static)
#   OUTFILE    markdown report (also printed at the end)
#
# Rounds (isolation.py does the work; see its header):
#   native   the schedule below, natively, all at once
#   per MODE one flyt-server --backend $SERVER_BACKEND --listen tcp://127.0.0.1:0
#            --listen unix://... --listen shm://... --control unix://... serves the
#            same schedule; every run must match its native run (exit code and
#            stdout), the server must survive and then still serve vector_add
#   timing   first_kernel natively, via the warm server (default pool), via a
#            server started with --worker-pool 0 (cold), TIMING_RUNS each per MODE
# Schedule: wave 1 ($ISO_WAVE1), then, once both `steady` runs have a working
# context, the faulting programs ($ISO_FAULTS), then wave 2 ($ISO_WAVE2) and the
# faulting programs again; a token NAME:ARG passes ARG to the program.
#
# Environment:
#   MODES="tcp unix shm"   transports
#   SERVER_BACKEND=cuda    (sim: plumbing checks without a GPU; results differ there)
#   VARIANT=static         which build of the programs (static | shared)
#   RUN_TIMEOUT=60         seconds per run
#   BUDGET_S=240           the whole script ends (and reports) within this many seconds
#   TIMING_RUNS=10         first_kernel runs per series
#   ISO_STEADY_S=6         how long each `steady` neighbour keeps working
#   ISO_WORKER_POOL=       --worker-pool of the warm server (empty: its default)
#   ISO_COLD_POOL_ARGS="--worker-pool 0"
#   ISO_WAVE1, ISO_FAULTS, ISO_WAVE2 (program lists), ISO_CTL_PROTO=auto|framed|lines
#   SERVER_LOG_LEVEL=info CLIENT_LOG_LEVEL=warn FLYT_TOKEN=
#   FLYT_GPU_WORKDIR=      where logs, outputs and stats samples go (default: a new
#                          temp dir, kept)
#   ISO_LOGS_TGZ=          also pack the work dir into this .tgz (when < 15 MiB)
# Exit status: 0 when every isolation check passed, 1 otherwise, 2 on bad usage.
# Timings are reported, never judged.
set -uo pipefail

usage() { sed -n '7,10p' "$0" >&2; exit 2; }
[[ $# -eq 3 ]] || usage
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD_DIR=$(cd "$1" 2>/dev/null && pwd) || { echo "no build dir: $1" >&2; exit 2; }
BIN_DIR=$(cd "$2" 2>/dev/null && pwd) || { echo "no bin dir: $2" >&2; exit 2; }
OUTFILE=$3
mkdir -p "$(dirname "$OUTFILE")" || exit 2
OUTFILE=$(cd "$(dirname "$OUTFILE")" && pwd)/$(basename "$OUTFILE")
command -v python3 >/dev/null || { echo "python3 is needed" >&2; exit 2; }

export MODES=${MODES:-tcp unix shm}
export SERVER_BACKEND=${SERVER_BACKEND:-cuda}
export VARIANT=${VARIANT:-static}
export RUN_TIMEOUT=${RUN_TIMEOUT:-60}
export TIMING_RUNS=${TIMING_RUNS:-10}
export SERVER_LOG_LEVEL=${SERVER_LOG_LEVEL:-info}
export CLIENT_LOG_LEVEL=${CLIENT_LOG_LEVEL:-warn}
BUDGET_S=${BUDGET_S:-240}
WORK=${FLYT_GPU_WORKDIR:-$(mktemp -d "${TMPDIR:-/tmp}/flyt-isolation.XXXXXX")}
mkdir -p "$WORK" || exit 2
WORK=$(cd "$WORK" && pwd)
log() { echo "[run_isolation $(date +%H:%M:%S)] $*" >&2; }

# Isolation programs missing from BIN_DIR (an older build): build them here
# when nvcc is at hand, into the work dir.
if [[ ! -x "$BIN_DIR/isolation/first_kernel.static" || ! -x "$BIN_DIR/isolation/steady.static" ||
      ! -x "$BIN_DIR/isolation/printf_tag.static" ]]; then
  NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  if [[ -x "$NVCC" ]]; then
    log "isolation programs missing from $BIN_DIR; building them with $NVCC"
    # A copy of BIN_DIR made of links, plus the isolation programs.
    mkdir -p "$WORK/bins/isolation"
    for f in "$BIN_DIR"/*; do [[ -e "$WORK/bins/$(basename "$f")" ]] || ln -s "$f" "$WORK/bins/"; done
    for n in first_kernel steady printf_tag; do
      # shellcheck disable=SC2016  # $ORIGIN is for the dynamic linker
      "$NVCC" -O2 -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
        -I"$HERE/../programs" -cudart static -Xlinker --enable-new-dtags \
        -Xlinker -rpath -Xlinker '$ORIGIN/..:/usr/local/cuda/lib64' \
        "$HERE/$n.cu" -o "$WORK/bins/isolation/$n.static" >"$WORK/build-$n.log" 2>&1 ||
        log "building $n failed (see $WORK/build-$n.log)"
    done
    BIN_DIR="$WORK/bins"
  else
    log "isolation programs missing from $BIN_DIR and no nvcc: those runs will fail"
  fi
fi

PY_PID=""
# Kills what isolation.py started if it could not do so itself (killed hard).
# shellcheck disable=SC2317  # reached through the traps
cleanup() {
  if [[ -n "$PY_PID" ]] && kill -0 "$PY_PID" 2>/dev/null; then
    kill -TERM "$PY_PID" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$PY_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PY_PID" 2>/dev/null
  fi
  local f pid
  for f in "$WORK"/pids/*; do
    [[ -f "$f" ]] || continue
    pid=$(basename "$f")
    [[ "$pid" =~ ^[0-9]+$ ]] || continue
    # Only a process that still runs one of our binaries (pids are reused).
    if kill -0 "$pid" 2>/dev/null &&
       tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -e "$BUILD_DIR" -e "$BIN_DIR"; then
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
      sleep 1
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$f"
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "work dir $WORK; modes $MODES; backend $SERVER_BACKEND; budget ${BUDGET_S}s"
python3 "$HERE/isolation.py" --build "$BUILD_DIR" --bins "$BIN_DIR" --out "$OUTFILE" \
  --work "$WORK" --budget "$BUDGET_S" &
PY_PID=$!
wait "$PY_PID"
rc=$?
PY_PID=""
if [[ ! -s "$OUTFILE" ]]; then
  { echo "## Isolation"; echo; echo "isolation.py ended with rc $rc and wrote no report; work dir $WORK"; } >"$OUTFILE"
  cat "$OUTFILE"
fi
if [[ -n "${ISO_LOGS_TGZ:-}" ]]; then
  tar -C "$(dirname "$WORK")" -czf "$ISO_LOGS_TGZ" --exclude='*.sock' --exclude='bins' \
    "$(basename "$WORK")" 2>/dev/null
  if [[ -f "$ISO_LOGS_TGZ" && $(stat -c %s "$ISO_LOGS_TGZ") -ge $((15 << 20)) ]]; then
    log "log archive over 15 MiB; dropped"
    rm -f "$ISO_LOGS_TGZ"
  fi
fi
exit "$rc"
