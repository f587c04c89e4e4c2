#!/usr/bin/env bash
# The control plane on one GPU host, end to end (issue "Control plane"):
#   bash tests/gpu/control_flow.sh        (repository root; $OUT set by the runner)
# Starts flyt-cluster-manager (SQLite), flyt-node-manager (NVML inventory, MPS,
# real flyt-servers) and one flyt-client-manager per VM, then:
#   1. two VMs with different SM shares and quotas run the sm_share program at
#      once; each prints the SMs its kernels actually ran on, the SM count it
#      sees and its memory, and checks that an allocation over its quota fails;
#   2. while they run, `flytctl change-config` resizes VM A live;
#   3. allocation latency: through the client manager with the server already
#      running, and with a server to start.
# Writes $OUT/control_flow.md (summary) and $OUT/control_flow-logs.tgz.
set -uo pipefail
BUILD_DIR=${BUILD_DIR:-build}
BIN=$BUILD_DIR/bin
PROG=${SM_SHARE_PROG:-$BUILD_DIR/gpu-tests/flyt-only/sm_share.static}
OUT=${OUT:-$(mktemp -d)}
W=$(mktemp -d /tmp/flyt-ctl.XXXXXX)
S="$OUT/control_flow.md"
export FLYT_SECRET=gpu-flow-$$ FLYT_STATE_DIR=$W/state
CM=127.0.0.1:12400
CTL="$BIN/flytctl --cluster-manager $CM"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 2
  tar -C "$W" -czf "$OUT/control_flow-logs.tgz" --exclude='*.sock' --exclude='mps-pipe' . 2>/dev/null
}
trap cleanup EXIT
now_ms() { date +%s%3N; }
wait_for() {  # wait_for SECONDS CMD...
  local end=$(($(date +%s) + $1)); shift
  until "$@" >/dev/null 2>&1; do [[ $(date +%s) -ge $end ]] && return 1; sleep 0.2; done
}

{
  echo "# Control plane on one GPU host"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
  echo "- commit: $(cat "$BUILD_DIR/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
  echo
} >"$S"

mkdir -p "$W/state"
"$BIN/flyt-cluster-manager" --listen $CM --database "sqlite:$W/flyt.db" --heartbeat-ms 500 \
  --idle-grace-ms 0 >"$W/cluster-manager.log" 2>&1 &
pids+=($!)
wait_for 10 $CTL list-nodes || { echo "cluster manager did not start" >>"$S"; exit 1; }
"$BIN/flyt-node-manager" --listen 127.0.0.1:12401 --advertise-host 127.0.0.1 \
  --host-ip 127.0.0.1 --node-id gpu-host --cluster-manager $CM --heartbeat-ms 500 \
  --inventory ${INVENTORY:-nvml} --mps ${MPS:-true} --server-backend ${BACKEND:-cuda} \
  --server-binary "$BIN/flyt-server" \
  --run-dir "$W/node" >"$W/node-manager.log" 2>&1 &
pids+=($!)
wait_for 30 bash -c "$CTL --json list-nodes | grep -q '\"uuid\"'" || {
  echo "node manager did not register; its log:" >>"$S"
  echo '```' >>"$S"; tail -20 "$W/node-manager.log" >>"$S"; echo '```' >>"$S"
  exit 1
}
echo "## Inventory" >>"$S"
echo '```' >>"$S"; $CTL list-nodes >>"$S" 2>&1; echo '```' >>"$S"

declare -A IP=([a]=10.9.0.1 [b]=10.9.0.2 [c]=10.9.0.3)
for vm in a b c; do
  "$BIN/flyt-client-manager" --socket "$W/cm-$vm.sock" --cluster-manager $CM \
    --vm-ip ${IP[$vm]} >"$W/client-manager-$vm.log" 2>&1 &
  pids+=($!)
done
$CTL vm add --vm 10.9.0.1 --host 127.0.0.1 --sm 32 --memory 8 >/dev/null
$CTL vm add --vm 10.9.0.2 --host 127.0.0.1 --sm 64 --memory 16 >/dev/null
$CTL vm add --vm 10.9.0.3 --host 127.0.0.1 --sm 16 --memory 4 >/dev/null
wait_for 10 test -S "$W/cm-a.sock"

echo "## Two tenants at once, and a live change-config" >>"$S"
echo >>"$S"
echo "VM a: 32 SMs, 8 GiB; VM b: 64 SMs, 16 GiB. Each runs sm_share for 12 s (VM a on a stream and
an event it created before the change, VM b on the legacy default stream); after ~5 s" >>"$S"
echo "\`flytctl change-config --vm 10.9.0.1 --sm 48 --memory 12\` resizes VM a." >>"$S"
echo >>"$S"
t0=$(now_ms)
FLYT_CLIENT_MANAGER=$W/cm-a.sock timeout 120 "$BIN/flyt" run -- "$PROG" 12 stream >"$W/vm-a.out" 2>"$W/vm-a.err" &
pa=$!
FLYT_CLIENT_MANAGER=$W/cm-b.sock timeout 120 "$BIN/flyt" run -- "$PROG" 12 >"$W/vm-b.out" 2>"$W/vm-b.err" &
pb=$!
sleep 5
c0=$(now_ms)
$CTL change-config --vm 10.9.0.1 --sm 48 --memory 12 >"$W/change-config.out" 2>&1
crc=$?
c1=$(now_ms)
wait $pa; ra=$?
wait $pb; rb=$?
for vm in a b; do
  r=$([[ $vm == a ]] && echo $ra || echo $rb)
  echo "### VM $vm (exit $r)" >>"$S"
  echo "(samples shown when what the program sees changes)" >>"$S"
  echo '```' >>"$S"
  awk '!/^sample/ {print; next} {k=$3" "$4" "$6; if (k!=p) print; p=k}' "$W/vm-$vm.out" >>"$S"
  tail -3 "$W/vm-$vm.err" >>"$S"; echo '```' >>"$S"
done
echo "change-config (exit $crc, $((c1 - c0)) ms round trip):" >>"$S"
echo '```' >>"$S"; cat "$W/change-config.out" >>"$S"; echo '```' >>"$S"
echo '```' >>"$S"; $CTL list-servers >>"$S" 2>&1; echo '```' >>"$S"
echo "MPS servers:" >>"$S"
echo '```' >>"$S"
CUDA_MPS_PIPE_DIRECTORY=$W/node/mps-pipe bash -c 'echo get_server_list | nvidia-cuda-mps-control' >>"$S" 2>&1
echo '```' >>"$S"

echo "## Over-quota allocation refused by placement" >>"$S"
$CTL vm add --vm 10.9.0.4 --host 127.0.0.1 --sm 64 --memory 4096 >/dev/null
echo '```' >>"$S"; $CTL allocate --vm 10.9.0.4 >>"$S" 2>&1; echo "exit $?" >>"$S"; echo '```' >>"$S"

echo "## Allocation latency" >>"$S"
ask() {  # ask SOCKET: one ALLOCATE round trip, prints milliseconds
  python3 - "$1" <<'PY'
import socket, sys, time
t = time.perf_counter()
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"ALLOCATE\n")
line = s.makefile().readline().strip()
print("%.1f ms  %s" % ((time.perf_counter() - t) * 1e3, line.split(" ")[0] + " " + (line.split(" ")[1] if " " in line else "")))
PY
}
{
  echo '```'
  echo "server to be started (VM c, first ask): $(ask "$W/cm-c.sock")"
  for i in 1 2 3; do echo "server already running (VM c, ask $i): $(ask "$W/cm-c.sock")"; done
  echo '```'
  echo '```'; $CTL list-events --limit 30; echo '```'
} >>"$S" 2>&1
echo "control_flow: done; summary in $S"
