#!/usr/bin/env bash
# Flyt's SM share and memory quota on a GPU host, changed live while a program runs.
#
# Usage: tests/gpu/run_sm_share.sh BUILD_DIR BIN_DIR OUTFILE
#   BUILD_DIR  Flyt build (BUILD_DIR/bin/flyt-server, BUILD_DIR/bin/flyt)
#   BIN_DIR    output of tests/gpu/build.sh (BIN_DIR/flyt-only/sm_share.<variant>)
#   OUTFILE    markdown report (also printed at the end)
#
# Starts `flyt-server --backend cuda --listen tcp://127.0.0.1:0 --sm-count $SM1
# --memory-quota $MEM1 --control unix://...`, reads the real port from `stats`, runs
# sm_share for $RUN_S seconds through `flyt run`, and $CHANGE_AFTER_S seconds in asks
# for $SM2 SMs and $MEM2 bytes with set-share. Checks:
#   - sm_share passed (no sample used more SMs than the attribute said, and the
#     allocation over the quota failed with cudaErrorMemoryAllocation);
#   - samples before the change show the first share (attribute = granted SMs,
#     cudaMemGetInfo total = MEM1), later samples the second; both phases seen;
#   - with green contexts (stats sm_mechanism), kernels used at most the granted
#     SMs in each phase, and more SMs after growing the share;
#   - set-share answered ok with pause_us; stats after the run show no session
#     and no memory in use;
#   - ordinary programs (ALSO_PROGRAMS, from programs.tsv's set) give the same exit
#     code and stdout through this server, whose sessions run in green contexts, as
#     natively.
# Environment: SM1=16 SM2=64 MEM1=8G MEM2=4G RUN_S=8 CHANGE_AFTER_S=3 VARIANT=static
#   ALSO_PROGRAMS="vector_add streams_events multithread_streams cuda_graphs async_mempool"
#   RUN_TIMEOUT=60 (each of those runs)
#   SERVER_LOG_LEVEL=info FLYT_GPU_WORKDIR= (default: a new temp dir, kept)
#   SERVER_BACKEND=cuda (sim: plumbing checks without a GPU; no kernel runs there)
# Exit status: 0 when every check passed, 1 otherwise, 2 on bad usage.
set -uo pipefail

usage() { sed -n '2,8p' "$0" >&2; exit 2; }
[[ $# -eq 3 ]] || usage
BUILD_DIR=$(cd "$1" 2>/dev/null && pwd) || { echo "no build dir: $1" >&2; exit 2; }
BIN_DIR=$(cd "$2" 2>/dev/null && pwd) || { echo "no bin dir: $2" >&2; exit 2; }
OUTFILE=$3
mkdir -p "$(dirname "$OUTFILE")"

SM1=${SM1:-16}
SM2=${SM2:-64}
MEM1=${MEM1:-8G}
MEM2=${MEM2:-4G}
RUN_S=${RUN_S:-8}
CHANGE_AFTER_S=${CHANGE_AFTER_S:-3}
VARIANT=${VARIANT:-static}
SERVER_LOG_LEVEL=${SERVER_LOG_LEVEL:-info}
SERVER_BACKEND=${SERVER_BACKEND:-cuda}
ALSO_PROGRAMS=${ALSO_PROGRAMS-vector_add streams_events multithread_streams cuda_graphs async_mempool}
RUN_TIMEOUT=${RUN_TIMEOUT:-60}
WORK=${FLYT_GPU_WORKDIR:-$(mktemp -d "${TMPDIR:-/tmp}/flyt-sm-share.XXXXXX")}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
SERVER_BIN="$BUILD_DIR/bin/flyt-server"
FLYT_BIN="$BUILD_DIR/bin/flyt"
PROGRAM="$BIN_DIR/flyt-only/sm_share.$VARIANT"
CTL="$WORK/control.sock"
log() { echo "[run_sm_share $(date +%H:%M:%S)] $*" >&2; }

to_bytes() {  # 8G -> bytes (binary multiples, as flyt-server reads them)
  local v=$1 n=${1%[KkMmGgTt]} shift=0
  case ${v: -1} in
    K | k) shift=10 ;; M | m) shift=20 ;; G | g) shift=30 ;; T | t) shift=40 ;;
  esac
  echo $((n << shift))
}

# ctl JSON: one request on the control socket; prints the JSON answer.
ctl() {
  python3 - "$CTL" "$1" <<'PY'
import json, socket, struct, sys, time
path, request = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + 10
while True:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    try:
        s.connect(path)
        break
    except OSError:
        s.close()
        if time.monotonic() > deadline:
            print(json.dumps({"ok": False, "error": "cannot connect to " + path}))
            sys.exit(1)
        time.sleep(0.1)
body = request.encode()
s.sendall(struct.pack("<I", len(body)) + body)
def recv(n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise SystemExit("control socket closed")
        data += chunk
    return data
(n,) = struct.unpack("<I", recv(4))
print(recv(n).decode())
PY
}

field() {  # field JSON KEY
  python3 -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2]); print(json.dumps(v) if isinstance(v,(list,dict)) else v)' "$1" "$2"
}

SERVER_PID=""
cleanup() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null
  fi
}
trap cleanup EXIT

failures=()
fail() { failures+=("$*"); log "FAIL: $*"; }

for f in "$SERVER_BIN" "$FLYT_BIN" "$PROGRAM"; do
  [[ -x "$f" ]] || { echo "missing $f (build Flyt and tests/gpu/build.sh first)" >&2; exit 2; }
done

rm -f "$CTL"
FLYT_LOG=$SERVER_LOG_LEVEL setsid "$SERVER_BIN" --backend "$SERVER_BACKEND" --listen tcp://127.0.0.1:0 \
  --sm-count "$SM1" --memory-quota "$MEM1" --control "unix://$CTL" \
  </dev/null >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 300); do
  [[ -S "$CTL" ]] && break
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
STATS0=$(ctl '{"verb":"stats"}')
log "stats at start: $STATS0"
if [[ $(field "$STATS0" ok) != True ]]; then
  fail "flyt-server did not answer on its control socket"
  URL=""
else
  URL=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["listen"][0])' "$STATS0")
fi
GRANTED1=$(field "$STATS0" sm)
MECHANISM=$(field "$STATS0" sm_mechanism)

CHANGE=""
rc=""
if [[ -n "$URL" ]]; then
  (
    sleep "$CHANGE_AFTER_S"
    ctl "{\"verb\":\"set-share\",\"sm\":$SM2,\"memory_bytes\":$(to_bytes "$MEM2")}" >"$WORK/set-share.json"
  ) &
  changer=$!
  env "FLYT_LOG=warn" "FLYT_LOG_FILE=$WORK/client.log" "$FLYT_BIN" run --server "$URL" -- \
    timeout -k 5 $((RUN_S + 60)) "$PROGRAM" "$RUN_S" >"$WORK/program.out" 2>"$WORK/program.err"
  rc=$?
  wait "$changer"
  CHANGE=$(cat "$WORK/set-share.json" 2>/dev/null)
  log "set-share answer: $CHANGE"
  [[ $rc -eq 0 ]] || fail "sm_share exited with $rc"
  [[ $(field "$CHANGE" ok) == True ]] || fail "set-share was refused: $CHANGE"
  [[ -n "$(field "$CHANGE" pause_us)" && "$(field "$CHANGE" pause_us)" != None ]] ||
    fail "set-share gave no pause_us"
fi
GRANTED2=""
[[ -n "$CHANGE" ]] && GRANTED2=$(field "$CHANGE" sm)

# Ordinary programs under the (changed) share, compared with native runs.
also_rows=()
if [[ -n "$URL" ]]; then
  for name in $ALSO_PROGRAMS; do
    bin="$BIN_DIR/$name.$VARIANT"
    if [[ ! -x "$bin" ]]; then
      also_rows+=("| $name | - | - | SKIP (not built) |")
      continue
    fi
    (cd "$BIN_DIR" && timeout -k 5 "$RUN_TIMEOUT" "$bin" </dev/null >"$WORK/$name.native.out" \
      2>"$WORK/$name.native.err")
    nrc=$?
    (cd "$BIN_DIR" && env "FLYT_LOG=warn" "FLYT_LOG_FILE=$WORK/$name.client.log" \
      timeout -k 5 "$RUN_TIMEOUT" "$FLYT_BIN" run --server "$URL" -- "$bin" </dev/null \
      >"$WORK/$name.flyt.out" 2>"$WORK/$name.flyt.err")
    frc=$?
    verdict_one=PASS
    if [[ $frc != "$nrc" ]] || ! cmp -s "$WORK/$name.native.out" "$WORK/$name.flyt.out"; then
      verdict_one="FAIL (rc $frc, native $nrc$(cmp -s "$WORK/$name.native.out" \
        "$WORK/$name.flyt.out" || echo ', stdout differs'))"
      fail "$name under the share: $verdict_one"
    fi
    also_rows+=("| $name | $nrc | $frc | $verdict_one |")
    log "$name: $verdict_one"
  done
fi

sleep 0.5
STATS1=$(ctl '{"verb":"stats"}')
log "stats after the run: $STATS1"
[[ $(field "$STATS1" sessions) == 0 ]] || fail "a session is still open after the run: $STATS1"
[[ $(field "$STATS1" memory_used) == 0 ]] || fail "memory still counted after the run: $STATS1"

# The samples, phase by phase.
if [[ -s "$WORK/program.out" ]]; then
  verdict=$(python3 - "$WORK/program.out" "$GRANTED1" "$GRANTED2" "$(to_bytes "$MEM1")" \
    "$(to_bytes "$MEM2")" "$MECHANISM" <<'PY'
import re, sys
path, g1, g2, m1, m2, mechanism = sys.argv[1:]
g1, m1, m2 = int(g1), int(m1), int(m2)
g2 = int(g2) if g2 not in ("", "None") else None
samples = []
for line in open(path):
    m = re.match(r"sample t_ms=(\d+) sms_used=(\d+) attr_sm=(\d+) mem_free=(\d+) mem_total=(\d+)", line)
    if m:
        samples.append(tuple(int(x) for x in m.groups()))
problems = []
first = [s for s in samples if s[2] == g1 and s[4] == m1]
second = [s for s in samples if g2 is not None and s[2] == g2 and s[4] == m2]
other = [s for s in samples if s not in first and s not in second]
if not first:
    problems.append("no sample showed the first share (%d SMs, %d bytes)" % (g1, m1))
if g2 is not None and not second:
    problems.append("no sample showed the second share (%d SMs, %d bytes)" % (g2, m2))
if other:
    problems.append("%d samples showed neither share, e.g. %s" % (len(other), other[0]))
if first and second and max(s[0] for s in first) > min(s[0] for s in second):
    problems.append("samples of the first share came after samples of the second")
used1 = max((s[1] for s in first), default=0)
used2 = max((s[1] for s in second), default=0)
if mechanism == "green_context":
    if used1 > g1:
        problems.append("kernels used %d SMs under a share of %d" % (used1, g1))
    if g2 is not None and used2 > g2:
        problems.append("kernels used %d SMs under a share of %d" % (used2, g2))
    if g2 is not None and g2 > g1 and second and used2 <= g1:
        problems.append("after growing the share to %d SMs kernels still used only %d" % (g2, used2))
print("first share: %d samples, at most %d SMs used of %d granted" % (len(first), used1, g1))
if g2 is not None:
    print("second share: %d samples, at most %d SMs used of %d granted" % (len(second), used2, g2))
for p in problems:
    print("PROBLEM " + p)
PY
  )
  log "$verdict"
  while IFS= read -r line; do
    [[ $line == PROBLEM* ]] && fail "${line#PROBLEM }"
  done <<<"$verdict"
else
  fail "sm_share printed nothing"
fi

cleanup
{
  echo "## Flyt SM share and memory quota, changed live"
  echo
  echo "- server: \`flyt-server --backend $SERVER_BACKEND --sm-count $SM1 --memory-quota $MEM1\`, then set-share sm=$SM2 memory_bytes=$MEM2 after ${CHANGE_AFTER_S} s; sm_share.$VARIANT for ${RUN_S} s"
  echo "- mechanism: **${MECHANISM:-unknown}**; granted ${GRANTED1:-?} SMs, then ${GRANTED2:-?}"
  echo "- set-share answer: \`${CHANGE:-none}\`"
  echo "- stats at start: \`${STATS0:-none}\`"
  echo "- stats after: \`${STATS1:-none}\`"
  echo
  echo '```'
  echo "${verdict:-no samples}"
  echo '```'
  echo
  echo "sm_share output (exit ${rc:-not run}):"
  echo '```'
  head -n 80 "$WORK/program.out" 2>/dev/null
  tail -n 20 "$WORK/program.err" 2>/dev/null
  echo '```'
  if [[ ${#also_rows[@]} -gt 0 ]]; then
    echo "Programs through this server (sessions in its share) vs native:"
    echo
    echo "| program | native rc | flyt rc | result |"
    echo "|---|---|---|---|"
    printf '%s\n' "${also_rows[@]}"
    echo
  fi
  echo "server log (switches):"
  echo '```'
  grep -E "share|green|moved|SM" "$WORK/server.log" | head -n 40
  echo '```'
  echo
  if [[ ${#failures[@]} -eq 0 ]]; then
    echo "**Result: PASS**"
  else
    echo "**Result: FAIL**"
    for f in "${failures[@]}"; do echo "- $f"; done
  fi
  echo
  echo "Logs: $WORK"
} >"$OUTFILE"
cat "$OUTFILE"
[[ ${#failures[@]} -eq 0 ]]
