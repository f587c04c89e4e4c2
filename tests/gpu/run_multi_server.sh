#!/usr/bin/env bash
# GPUs of two flyt-servers as one ordinal list (docs/architecture.md §8.4) on a GPU host:
# two `flyt-server --backend cuda`, each given one GPU (GPU_A, GPU_B: CUDA_VISIBLE_DEVICES
# of each; both 0 on a one-GPU host, where the two servers share the GPU as two tenants
# would), and the e2e program multi_server (static and shared cudart) through
# `flyt run --server A,B` over tcp and unix: 2 devices with distinct PCI bus ids, no peer
# access between them, memory, copies and a kernel on each, copies between the servers both
# ways (server to server), calls once refused on the second GPU (`later`), managed memory on
# each GPU (`managed`), a __managed__ variable's code refused on the second server's GPU
# (multi_server_managed_global), nothing refused but what the programs expect. The program's own
# checks decide; its key lines go into the report.
#
# Usage: tests/gpu/run_multi_server.sh BUILD_DIR PROGRAMS_DIR OUTFILE
# Environment: GPU_A=0, GPU_B=1 (0 when the host has one GPU), MODES="tcp unix",
# RUN_TIMEOUT=120, SERVER_BACKEND=cuda (sim: the plumbing on a machine without a GPU).
set -uo pipefail

[[ $# -eq 3 ]] || { sed -n '2,15p' "$0" >&2; exit 2; }
BUILD=$(cd "$1" && pwd) || exit 2
PROGS=$(cd "$2" && pwd) || exit 2
OUTFILE=$3
BACKEND=${SERVER_BACKEND:-cuda}
gpus=1
if [[ $BACKEND == cuda ]] && command -v nvidia-smi >/dev/null; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 1)
fi
GPU_A=${GPU_A:-0}
GPU_B=${GPU_B:-$([[ $gpus -gt 1 ]] && echo 1 || echo 0)}
MODES=${MODES:-"tcp unix"}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/flyt-multi-gpu.XXXXXX")
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

declare -A TCP UNIX
for name in a b; do
  gpu=$GPU_A
  [[ $name == b ]] && gpu=$GPU_B
  port=$(free_port)
  TCP[$name]="tcp://127.0.0.1:$port"
  UNIX[$name]="unix://$WORK/$name.sock"
  CUDA_VISIBLE_DEVICES=$gpu FLYT_LOG=${FLYT_LOG:-info} "$BUILD/bin/flyt-server" \
    --backend "$BACKEND" --listen "${TCP[$name]}" --listen "${UNIX[$name]}" \
    --control "unix://$WORK/$name.ctl" >"$WORK/server-$name.log" 2>&1 &
  PIDS+=($!)
done
for name in a b; do
  for _ in $(seq 300); do [[ -S $WORK/$name.ctl ]] && break; sleep 0.1; done
  [[ -S $WORK/$name.ctl ]] || { echo "server $name did not start:" >&2; cat "$WORK/server-$name.log" >&2; exit 1; }
done

failed=0
{
  echo "# multi_server: two flyt-servers as one list"
  echo
  echo "backend $BACKEND, GPU_A=$GPU_A GPU_B=$GPU_B, $(date -u +%Y-%m-%dT%H:%MZ), commit $(cat "$BUILD/COMMIT" 2>/dev/null || git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null)"
  echo
  echo "| program | transport | result | key lines |"
  echo "|---|---|---|---|"
} >"$OUTFILE"
for run in multi_server multi_server_shared "multi_server later" "multi_server managed" \
  multi_server_managed_global; do
  prog=${run%% *}
  args=${run#"$prog"}
  for mode in $MODES; do
    if [[ $mode == tcp ]]; then list="${TCP[a]},${TCP[b]}"; else list="${UNIX[a]},${UNIX[b]}"; fi
    out="$WORK/$prog${args// /-}-$mode.out"
    shared_gpu=0
    [[ $BACKEND == cuda && $GPU_A == "$GPU_B" ]] && shared_gpu=1
    MULTI_SERVER_SHARED_GPU=$shared_gpu FLYT_SHM=off FLYT_LOG=warn FLYT_LOG_FILE="$WORK/$prog${args// /-}-$mode.log" \
      timeout "$RUN_TIMEOUT" "$BUILD/bin/flyt" run --server "$list" -- "$PROGS/$prog" $args >"$out" 2>&1
    rc=$?
    keys=$(grep -E '=' "$out" | grep -v '^device\.' | tr '\n' ' ')
    if [[ $rc -eq 0 ]] && grep -q "^${prog%_shared}: PASS" "$out" &&
       ! grep -q 'not supported\|not served' "$out" "$WORK/$prog${args// /-}-$mode.log"; then
      verdict=pass
    else
      verdict="FAIL (exit $rc)"
      failed=1
      echo "--- $prog over $mode:" >&2
      tail -n 20 "$out" "$WORK/$prog${args// /-}-$mode.log" >&2
    fi
    echo "| $prog$args | $mode | $verdict | $keys |" >>"$OUTFILE"
  done
done
for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || { echo "a server died" >&2; failed=1; }; done
echo "report: $OUTFILE"
exit $failed
