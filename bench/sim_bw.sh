#!/usr/bin/env bash
# Bulk-copy bandwidth without a GPU: bench/cuda_bench's copy groups through `flyt run`
# against flyt-server --backend sim (device memory is host memory there, so the figures
# are the data plane's: transport, staging, RMA), over tcp://, unix://, shm:// and ucx://
# with each UCX_TLS given, plus tcp_loopback_bw as the socket reference.
#
# Usage: bench/sim_bw.sh BUILD_DIR [BENCH_BIN_DIR]
#   BENCH_BIN_DIR holds cuda_bench and tcp_loopback_bw (bench/build.sh DIR makes them;
#   default BUILD_DIR/bench).
# Environment (optional):
#   SIM_BW_MODES   "tcp unix shm ucx"   transports to measure
#   SIM_BW_TLS     "tcp sm,self"         UCX_TLS values for the ucx mode
#   SIM_BW_MIB     64                    bytes per copy (MiB)
#   SIM_BW_GROUPS  "bw bwasync"          cuda_bench groups
#   SIM_BW_ENV     ""                    extra VAR=VALUE words for the client (e.g. FLYT_RMA=off)
# Prints one line per figure: MODE NAME VALUE UNIT.
set -u
if [[ $# -lt 1 ]]; then
  echo "usage: $0 BUILD_DIR [BENCH_BIN_DIR]" >&2
  exit 1
fi
BUILD=$(cd "$1" && pwd) || exit 1
BIN=${2:-$BUILD/bench}
MODES=${SIM_BW_MODES:-"tcp unix shm ucx"}
TLS_LIST=${SIM_BW_TLS:-"tcp sm,self"}
MIB=${SIM_BW_MIB:-64}
GROUPS_=${SIM_BW_GROUPS:-"bw bwasync"}
read -r -a EXTRA_ENV <<<"${SIM_BW_ENV:-}"
SERVER=$BUILD/bin/flyt-server
FLYT=$BUILD/bin/flyt
DIR=$(mktemp -d /tmp/flyt-simbw.XXXXXX) || exit 1
SPID=""
cleanup() {
  [[ -n $SPID ]] && kill -TERM "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
  rm -rf "$DIR"
}
trap cleanup EXIT
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

start_server() {  # $1: UCX_TLS for the server ("" = none)
  [[ -n $SPID ]] && kill -TERM "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
  TCP_URL=tcp://127.0.0.1:$(free_port)
  UCX_URL=ucx://127.0.0.1:$(free_port)
  UNIX_URL=unix://$DIR/s.sock
  SHM_URL=shm://$DIR/s.shm.sock
  rm -f "$DIR"/s.sock "$DIR"/s.shm.sock
  UCX_TLS=$1 "$SERVER" --backend sim --listen "$TCP_URL" --listen "$UNIX_URL" \
    --listen "$SHM_URL" --listen "$UCX_URL" >"$DIR/server.log" 2>&1 </dev/null &
  SPID=$!
  for _ in $(seq 100); do
    [[ -S $DIR/s.sock && -S $DIR/s.shm.sock ]] && return 0
    sleep 0.1
  done
  echo "flyt-server did not start:" >&2
  cat "$DIR/server.log" >&2
  return 1
}

run_mode() {  # $1 label, $2 url, $3 UCX_TLS
  local out
  # shellcheck disable=SC2086
  out=$(env FLYT_SHM=off UCX_TLS="$3" "${EXTRA_ENV[@]}" timeout 300 "$FLYT" run --server "$2" -- \
    "$BIN/cuda_bench" --bw-mib "$MIB" $GROUPS_ 2>"$DIR/client.log")
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "$1 FAILED rc=$rc" >&2
    tail -5 "$DIR/client.log" >&2
    return
  fi
  awk -v m="$1" '$1 == "RESULT" { print m, $2, $3, $4 }' <<<"$out"
}

if [[ -x $BIN/tcp_loopback_bw ]]; then
  "$BIN/tcp_loopback_bw" 2>/dev/null | awk '$1 == "RESULT" { print "socket", $2, $3, $4 }'
fi
start_server "" || exit 1
for m in $MODES; do
  case $m in
    tcp) run_mode tcp "$TCP_URL" "" ;;
    unix) run_mode unix "$UNIX_URL" "" ;;
    shm) run_mode shm "$SHM_URL" "" ;;
  esac
done
if [[ " $MODES " == *" ucx "* ]]; then
  for t in $TLS_LIST; do
    start_server "$t" || exit 1
    run_mode "ucx[$t]" "$UCX_URL" "$t"
  done
fi
