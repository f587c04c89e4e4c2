#!/usr/bin/env bash
# Times bench/managed_bench natively and through Flyt over TCP loopback, TCP
# under the emulator (25 Gbit/s, 20 us one way) and shared memory, against one
# flyt-server --backend cuda; writes OUTDIR/managed.md (one row per measure,
# native and each mode with its ratio to native).
# Usage: bench/managed_run.sh BUILD_DIR BENCH_BINARY OUTDIR
set -u
if [[ $# -ne 3 ]]; then
  echo "usage: $0 BUILD_DIR BENCH_BINARY OUTDIR" >&2
  exit 1
fi
BUILD=$(cd "$1" && pwd)
BIN=$2
OUT=$3
mkdir -p "$OUT"
PORT=${FLYT_BENCH_PORT:-47311}
SOCK=$(mktemp -u /tmp/flyt-managed-XXXXXX).shm.sock
EMU="rtt_us=40,bandwidth_gbit=25"
"$BUILD/bin/flyt-server" --listen "tcp://127.0.0.1:$PORT" --listen "shm://$SOCK" \
  --backend cuda >"$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
for _ in $(seq 50); do [[ -S $SOCK ]] && break; sleep 0.2; done
run() {  # mode, then the command's environment
  local mode=$1
  shift
  if [[ $mode == native ]]; then
    timeout 300 "$BIN" >"$OUT/$mode.txt" 2>"$OUT/$mode.err"
  else
    timeout 300 env "$@" "$BUILD/bin/flyt" run -- "$BIN" >"$OUT/$mode.txt" 2>"$OUT/$mode.err"
  fi
  echo "$mode rc=$?" >>"$OUT/runs.txt"
}
: >"$OUT/runs.txt"
run native
run tcp FLYT_SHM=off FLYT_SERVER="tcp://127.0.0.1:$PORT"
run emu25 FLYT_SHM=off FLYT_SERVER="tcp://127.0.0.1:$PORT" FLYT_EMULATE="$EMU"
run shm FLYT_SERVER="shm://$SOCK"
{
  echo "| measure | native | tcp | emu25 (25 Gbit/s, 20 us) | shm |"
  echo "|---|---|---|---|---|"
  awk '
    FNR == 1 { mode = FILENAME; sub(/.*\//, "", mode); sub(/\.txt$/, "", mode) }
    NF == 3 { v[$1, mode] = $2; unit[$1] = $3; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
    END {
      for (i = 1; i <= n; ++i) {
        k = order[i]; line = "| " k " (" unit[k] ") | " v[k, "native"]
        split("tcp emu25 shm", ms, " ")
        for (j = 1; j <= 3; ++j) {
          m = ms[j]
          if ((k, m) in v && v[k, "native"] > 0) line = line sprintf(" | %s (%.2fx) ", v[k, m], v[k, m] / v[k, "native"])
          else line = line " | n/a "
        }
        print line "|"
      }
    }' "$OUT/native.txt" "$OUT/tcp.txt" "$OUT/emu25.txt" "$OUT/shm.txt"
} >"$OUT/managed.md"
cat "$OUT/managed.md"
