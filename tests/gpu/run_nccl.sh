#!/usr/bin/env bash
# NCCL through Flyt on a GPU host (issue 19): two `flyt-server --backend cuda` (one GPU each,
# or both on the one GPU of a one-GPU host, standing in for two GPUs of two servers), whose
# workers run NVIDIA's NCCL for their clients (Flyt's libnccl.so.2 forwards the calls):
#   1. the e2e program nccl_ranks: two rank processes across the two servers (every
#      collective, a group ring, PreMulSum, split, errors) over tcp and unix, and one process
#      driving both servers' GPUs (ncclCommInitAll, one group); natively one rank on one GPU;
#   2. torchrun --nproc-per-node 2 with the nccl backend across the two servers:
#      collectives with known results and DDP steps of an MLP (tests/gpu/nccl/ddp_check.py),
#      compared with the same training in one process natively (losses and parameters);
#   3. the same with one server and --nproc-per-node 1;
#   4. one process driving both servers' GPUs with nn.DataParallel, against the same.
# The servers get distinct NCCL_HOSTIDs: on one GPU, NCCL would otherwise refuse two ranks on
# one device; so their ranks meet over NCCL's socket transport, as on two hosts.
#
# Usage: tests/gpu/run_nccl.sh BUILD_DIR PROGRAMS_DIR OUTFILE
# Environment: GPU_A=0, GPU_B (1, or 0 on a one-GPU host), MODES="tcp unix", RUN_TIMEOUT=300,
# NCCL_LIB (default: torch's libnccl.so.2, else the loader's).
set -uo pipefail

[[ $# -eq 3 ]] || { sed -n '2,19p' "$0" >&2; exit 2; }
BUILD=$(cd "$1" && pwd) || exit 2
PROGS=$(cd "$2" && pwd) || exit 2
OUTFILE=$3
HERE=$(cd "$(dirname "$0")" && pwd)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 1)
GPU_A=${GPU_A:-0}
GPU_B=${GPU_B:-$([[ $gpus -gt 1 ]] && echo 1 || echo 0)}
MODES=${MODES:-"tcp unix"}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
NCCL_LIB=${NCCL_LIB:-$(python3 -c 'import os, torch; p=os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "nccl", "lib", "libnccl.so.2"); print(os.path.realpath(p) if os.path.exists(p) else "")' 2>/dev/null)}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/flyt-nccl.XXXXXX")
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
  CUDA_VISIBLE_DEVICES=$gpu NCCL_HOSTID="flyt-server-$name" NCCL_SOCKET_IFNAME=lo \
    FLYT_NCCL_LIBRARY="$NCCL_LIB" FLYT_LOG=${FLYT_LOG:-info} "$BUILD/bin/flyt-server" \
    --backend cuda --listen "${TCP[$name]}" --listen "${UNIX[$name]}" \
    --control "unix://$WORK/$name.ctl" >"$WORK/server-$name.log" 2>&1 &
  PIDS+=($!)
done
for name in a b; do
  for _ in $(seq 300); do [[ -S $WORK/$name.ctl ]] && break; sleep 0.1; done
  [[ -S $WORK/$name.ctl ]] || { echo "server $name did not start:" >&2; cat "$WORK/server-$name.log" >&2; exit 1; }
done

failed=0
row() { echo "| $1 | $2 | $3 | $4 |" >>"$OUTFILE"; }
{
  echo "# NCCL through Flyt: two flyt-servers' GPUs"
  echo
  echo "GPU_A=$GPU_A GPU_B=$GPU_B ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)), $(date -u +%Y-%m-%dT%H:%MZ), commit $(cat "$BUILD/COMMIT" 2>/dev/null || echo unknown), servers' NCCL: ${NCCL_LIB:-libnccl.so.2}"
  echo
  echo "| run | transport | result | details |"
  echo "|---|---|---|---|"
} >"$OUTFILE"

verdict() {  # name mode rc out log pattern
  local name=$1 mode=$2 rc=$3 out=$4 log=$5 pat=$6 keys
  keys=$(grep -E '^(version|rank[0-9]+\.count)=' "$out" 2>/dev/null | tr '\n' ' ')
  if [[ $rc -eq 0 ]] && grep -q "$pat" "$out" && ! grep -q 'not served\|not supported' "$out" "$log" 2>/dev/null; then
    row "$name" "$mode" pass "$keys"
  else
    row "$name" "$mode" "FAIL (exit $rc)" "$(tail -3 "$out" | tr '\n|' '  ')"
    failed=1
    echo "--- $name over $mode:" >&2
    tail -n 30 "$out" "$log" >&2
  fi
}

# 1. nccl_ranks natively (one rank: one GPU) and through Flyt across the two servers.
timeout "$RUN_TIMEOUT" "$PROGS/nccl_ranks" ranks 1 >"$WORK/native.out" 2>&1
verdict "nccl_ranks ranks 1 (native)" native $? "$WORK/native.out" /dev/null '^nccl_ranks: PASS'
for mode in $MODES; do
  if [[ $mode == tcp ]]; then list="${TCP[a]},${TCP[b]}"; else list="${UNIX[a]},${UNIX[b]}"; fi
  for args in "ranks 2" "single 2"; do
    out="$WORK/ranks-${args// /-}-$mode.out"
    log="$WORK/ranks-${args// /-}-$mode.log"
    # The app's NCCL_DEBUG reaches the servers' NCCL, whose output reaches the app.
    NCCL_DEBUG=VERSION FLYT_LOG=warn FLYT_LOG_FILE="$log" timeout "$RUN_TIMEOUT" \
      "$BUILD/bin/flyt" run --server "$list" -- "$PROGS/nccl_ranks" $args >"$out" 2>&1
    rc=$?
    verdict "nccl_ranks $args, two servers (NCCL_DEBUG=VERSION: $(grep -c 'NCCL version' "$out") version lines)" "$mode" $rc "$out" "$log" '^nccl_ranks: PASS'
  done
done

# 2. and 3. torchrun through Flyt, against one process natively.
python3 "$HERE/nccl/ddp_check.py" --reference --out "$WORK/ref.json" >"$WORK/ref.out" 2>&1 ||
  { row "DDP reference (native, one process)" native "FAIL" "$(tail -2 "$WORK/ref.out" | tr '\n|' '  ')"; failed=1; }
compare() {  # name mode json out
  python3 - "$WORK/ref.json" "$3" <<'PY' >>"$4" 2>&1
import json, sys, torch
ref, got = (json.load(open(p)) for p in sys.argv[1:3])
a, b = torch.load(sys.argv[1] + ".pt"), torch.load(sys.argv[2] + ".pt")
diff = (a - b).abs().max().item()
ldiff = max(abs(x - y) for x, y in zip(ref["losses"], got["losses"]))
ok = all(got["checks"].values()) and diff < 1e-4 and ldiff < 1e-4
print("DETAILS checks %s; losses %s vs native %s (max diff %.2e); parameters max diff %.2e; "
      "init %.1f s, step %.1f ms; 256 MiB all-reduce %.1f ms, %.2g bytes through the client's "
      "sockets per byte reduced; NCCL %s" % (
          ",".join(k for k, v in got["checks"].items() if v) or "none",
          ["%.5f" % x for x in got["losses"]], ["%.5f" % x for x in ref["losses"]], ldiff, diff,
          got["init_s"], got["step_s"] * 1e3, got["allreduce_256mib_s"] * 1e3,
          got["client_bytes_per_allreduced_byte"], got["nccl_version"]))
sys.exit(0 if ok else 1)
PY
}
for mode in $MODES; do
  if [[ $mode == tcp ]]; then list="${TCP[a]},${TCP[b]}"; one="${TCP[a]}"; else list="${UNIX[a]},${UNIX[b]}"; one="${UNIX[a]}"; fi
  for n in 2 1; do
    servers=$list
    [[ $n == 1 ]] && servers=$one
    tag="torchrun-$n-$mode"
    out="$WORK/$tag.out"
    log="$WORK/$tag.log"
    FLYT_LOG=warn FLYT_LOG_FILE="$log" timeout "$RUN_TIMEOUT" \
      "$BUILD/bin/flyt" run --server "$servers" -- torchrun --nproc-per-node "$n" \
      --master-port "$(free_port)" "$HERE/nccl/ddp_check.py" --out "$WORK/$tag.json" >"$out" 2>&1
    rc=$?
    [[ $rc -eq 0 ]] && { compare "$tag" "$mode" "$WORK/$tag.json" "$out"; rc=$?; }
    name="torchrun --nproc-per-node $n, DDP vs one native process"
    [[ $n == 2 ]] && name="$name, two servers" || name="$name, one server"
    if [[ $rc -eq 0 ]] && ! grep -q 'not served\|not supported' "$log" 2>/dev/null; then
      row "$name" "$mode" pass "$(grep '^DETAILS' "$out" | sed 's/^DETAILS //' | tr '|' ' ')"
    else
      row "$name" "$mode" "FAIL (exit $rc)" "$(grep -v '^\s*$' "$out" | tail -3 | tr '\n|' '  ')"
      failed=1
      echo "--- $name over $mode:" >&2
      tail -n 60 "$out" "$log" >&2
    fi
  done
done
# 4. One process driving both servers' GPUs: nn.DataParallel (NCCL broadcast and reduce).
for mode in $MODES; do
  if [[ $mode == tcp ]]; then list="${TCP[a]},${TCP[b]}"; else list="${UNIX[a]},${UNIX[b]}"; fi
  tag="dataparallel-$mode"
  out="$WORK/$tag.out"
  log="$WORK/$tag.log"
  FLYT_LOG=warn FLYT_LOG_FILE="$log" timeout "$RUN_TIMEOUT" "$BUILD/bin/flyt" run --server "$list" -- \
    python3 "$HERE/nccl/ddp_check.py" --dataparallel --out "$WORK/$tag.json" >"$out" 2>&1
  rc=$?
  [[ $rc -eq 0 ]] && { compare "$tag" "$mode" "$WORK/$tag.json" "$out"; rc=$?; }
  name="nn.DataParallel over both servers' GPUs (one process) vs one native process"
  if [[ $rc -eq 0 ]] && ! grep -q 'not served\|not supported' "$log" 2>/dev/null; then
    row "$name" "$mode" pass "$(grep '^DETAILS' "$out" | sed 's/^DETAILS //' | tr '|' ' ')"
  else
    row "$name" "$mode" "FAIL (exit $rc)" "$(grep -v '^\s*$' "$out" | tail -3 | tr '\n|' '  ')"
    failed=1
    echo "--- $name over $mode:" >&2
    tail -n 40 "$out" "$log" >&2
  fi
done
exit $failed
