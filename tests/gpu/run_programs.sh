#!/usr/bin/env bash
# Runs the GPU test programs natively and through Flyt, and compares.
#
# Usage: tests/gpu/run_programs.sh BUILD_DIR BIN_DIR OUTFILE
#   BUILD_DIR  Flyt build (BUILD_DIR/bin/flyt-server, BUILD_DIR/bin/flyt)
#   BIN_DIR    output of tests/gpu/build.sh (<name>.static, <name>.shared, programs.tsv)
#   OUTFILE    markdown report (also printed at the end)
#
# On a GPU host: starts flyt-server --backend cuda with one TCP and one Unix
# listener, then for every binary runs it natively, via `flyt run` over TCP
# and via the Unix socket, each under `timeout`. A Flyt run passes when its
# exit code and stdout equal the native run's. Programs marked run-last in
# programs.tsv (faulting kernels, device printf) run after all others, one at
# a time, and are followed by a health check (vector_add over TCP on the same server). A
# server that dies is noted and restarted. Exit status: 0 when nothing failed
# (skips do not count), 1 otherwise, 2 on bad usage.
#
# Environment:
#   RUN_TIMEOUT=120        seconds per run
#   DEADLINE_S=0           stop starting runs this many seconds after start (0: none);
#                          what is left is reported as SKIP
#   JOBS=1                 programs run in parallel (needs flock when > 1)
#   MODES="tcp unix"       Flyt transports to test (also: shm)
#   PROGRAMS=""            only these programs (space-separated names)
#   FLYT_TOKEN=""          pass --token to server and clients
#   SERVER_BACKEND=cuda    --backend of the server (sim: plumbing checks without a GPU)
#   SERVER_ARGS=""         more flyt-server options, e.g. --movable-memory (stream-ordered
#                          pools served by the session, server/session_pools.cc)
#   SERVER_LOG_LEVEL=info  FLYT_LOG of the server
#   CLIENT_LOG_LEVEL=warn  FLYT_LOG of the clients (written to per-run files)
#   FLYT_GPU_WORKDIR=      where logs and outputs go (default: a new temp dir, kept)
set -uo pipefail

usage() { sed -n '2,10p' "$0" >&2; exit 2; }
[[ $# -eq 3 ]] || usage
BUILD_DIR=$(cd "$1" 2>/dev/null && pwd) || { echo "no build dir: $1" >&2; exit 2; }
BIN_DIR=$(cd "$2" 2>/dev/null && pwd) || { echo "no bin dir: $2" >&2; exit 2; }
OUTFILE=$3
mkdir -p "$(dirname "$OUTFILE")"

RUN_TIMEOUT=${RUN_TIMEOUT:-120}
DEADLINE_S=${DEADLINE_S:-0}
JOBS=${JOBS:-1}
MODES=${MODES:-tcp unix}
PROGRAMS=${PROGRAMS:-}
FLYT_TOKEN=${FLYT_TOKEN:-}
# tcp and unix runs stay on their transport (the server also listens on shm://).
export FLYT_SHM=off
SERVER_BACKEND=${SERVER_BACKEND:-cuda}
SERVER_ARGS=${SERVER_ARGS:-}
SERVER_LOG_LEVEL=${SERVER_LOG_LEVEL:-info}
CLIENT_LOG_LEVEL=${CLIENT_LOG_LEVEL:-warn}
WORK=${FLYT_GPU_WORKDIR:-$(mktemp -d "${TMPDIR:-/tmp}/flyt-gpu-run.XXXXXX")}
mkdir -p "$WORK"/{out,rows,details,logs}
WORK=$(cd "$WORK" && pwd)

SERVER_BIN="$BUILD_DIR/bin/flyt-server"
FLYT_BIN="$BUILD_DIR/bin/flyt"
START_EPOCH=$(date +%s)
DEADLINE_EPOCH=0
[[ "$DEADLINE_S" -gt 0 ]] && DEADLINE_EPOCH=$((START_EPOCH + DEADLINE_S))
if [[ "$JOBS" -gt 1 ]] && ! command -v flock >/dev/null; then JOBS=1; fi

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
log() { echo "[run_programs $(date +%H:%M:%S)] $*" >&2; }

# ---------------------------------------------------------------- server --
# State shared with parallel jobs lives in files under $WORK:
#   server.pid, server.tcp (tcp://...), server.unix (unix://...), server.log (path),
#   server.count (how many servers were started), events (restarts, deaths).
free_port() {
  if command -v python3 >/dev/null; then
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
    return
  fi
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 40000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
  echo 23456
}

tcp_ready() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
unix_ready() {
  [[ -S "$1" ]] || return 1
  command -v python3 >/dev/null || return 0
  python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(sys.argv[1])' "$1" 2>/dev/null
}

# The server is not our child once a restart happened in a job's subshell, so
# an exited server can linger as a zombie: kill -0 alone is not enough.
server_alive() {
  local pid state
  pid=$(cat "$WORK/server.pid" 2>/dev/null) || return 1
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
  state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
  [[ "$state" != Z && "$state" != X ]]
}

# start_server: starts a new flyt-server; returns 0 once both listeners accept.
start_server() {
  local n port sock logf pid tokargs=()
  n=$(( $(cat "$WORK/server.count" 2>/dev/null || echo 0) + 1 ))
  echo "$n" >"$WORK/server.count"
  port=$(free_port)
  sock="$WORK/flyt-$n.sock"
  rm -f "$sock"
  logf="$WORK/logs/server.$n.log"
  [[ -n "$FLYT_TOKEN" ]] && tokargs=(--token "$FLYT_TOKEN")
  {
    echo "# flyt-server #$n started $(date -u +%H:%M:%S) port $port socket $sock"
    echo "# $SERVER_BIN --listen tcp://127.0.0.1:$port --listen unix://$sock --backend $SERVER_BACKEND ${tokargs[*]} $SERVER_ARGS"
  } >"$logf"
  local shmargs=()
  [[ " $MODES " == *" shm "* ]] && shmargs=(--listen "shm://$WORK/flyt-$n-shm.sock")
  FLYT_LOG=$SERVER_LOG_LEVEL setsid "$SERVER_BIN" --listen "tcp://127.0.0.1:$port" --listen "unix://$sock" \
    "${shmargs[@]}" --backend "$SERVER_BACKEND" "${tokargs[@]}" $SERVER_ARGS </dev/null >>"$logf" 2>&1 &
  pid=$!
  echo "$pid" >"$WORK/server.pid"
  echo "tcp://127.0.0.1:$port" >"$WORK/server.tcp"
  echo "unix://$sock" >"$WORK/server.unix"
  echo "shm://$WORK/flyt-$n-shm.sock" >"$WORK/server.shm"
  echo "$logf" >"$WORK/server.log"
  local i
  for i in $(seq 1 300); do  # up to 30 s
    if ! server_alive; then
      echo "server #$n exited during start-up (see $(basename "$logf"))" >>"$WORK/events"
      return 1
    fi
    if tcp_ready "$port" && unix_ready "$sock"; then
      log "server #$n ready after $((i / 10)).$((i % 10)) s (pid $pid, tcp port $port, $sock)"
      return 0
    fi
    sleep 0.1
  done
  echo "server #$n not ready after 30 s" >>"$WORK/events"
  return 1
}

# shellcheck disable=SC2317  # reached through the EXIT trap
stop_server() {
  local pid
  pid=$(cat "$WORK/server.pid" 2>/dev/null) || return 0
  [[ -n "$pid" ]] || return 0
  if server_alive; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do server_alive || break; sleep 0.1; done
    server_alive && kill -KILL "$pid" 2>/dev/null
  fi
  wait "$pid" 2>/dev/null
  : >"$WORK/server.pid"
}

# ensure_server WHY: restarts the server if it is not running (serialised).
# Gives up for good after MAX_SERVER_STARTS starts, so a server that cannot
# start costs 30 s once or a few times, not once per run.
MAX_SERVER_STARTS=${MAX_SERVER_STARTS:-5}
ensure_server() {
  server_alive && return 0
  [[ -e "$WORK/server.giveup" ]] && return 1
  (
    if command -v flock >/dev/null; then flock 9; fi
    server_alive && exit 0
    [[ -e "$WORK/server.giveup" ]] && exit 1
    n=$(cat "$WORK/server.count" 2>/dev/null || echo 0)
    if [[ "$n" -ge "$MAX_SERVER_STARTS" ]]; then
      echo "server started $n times; no more restarts" >>"$WORK/events"
      : >"$WORK/server.giveup"
      exit 1
    fi
    if [[ "$n" -gt 0 ]]; then
      echo "server #$n was found dead ($1); restarting" >>"$WORK/events"
      log "server #$n dead ($1); restarting"
    fi
    start_server
  ) 9>"$WORK/server.lock"
}

# shellcheck disable=SC2317  # reached through the EXIT trap
cleanup() {
  [[ ${#CHILD_PIDS[@]} -gt 0 ]] && kill "${CHILD_PIDS[@]}" 2>/dev/null
  stop_server
}
CHILD_PIDS=()
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- runs ----
# run_one MODE BIN TAG: runs BIN natively (MODE=native) or through flyt;
# writes $WORK/out/TAG.MODE.{out,err,rc,time,note}.
run_one() {
  local mode=$1 bin=$2 tag=$3 base="$WORK/out/$3.$1"
  local t0 t1 rc limit remaining
  limit=$RUN_TIMEOUT
  if [[ $DEADLINE_EPOCH -gt 0 ]]; then
    remaining=$((DEADLINE_EPOCH - $(date +%s)))
    if [[ $remaining -lt 10 ]]; then
      echo "skip" >"$base.rc"
      echo "deadline" >"$base.note"
      return
    fi
    [[ $remaining -lt $limit ]] && limit=$remaining
  fi
  echo "$limit" >"$base.limit"
  local cmd=() alive_before=0
  if [[ $mode == native ]]; then
    cmd=("$bin")
  else
    ensure_server "before $tag via $mode" && alive_before=1
    local url tokargs=()
    url=$(cat "$WORK/server.$mode" 2>/dev/null)
    [[ -n "$FLYT_TOKEN" ]] && tokargs=(--token "$FLYT_TOKEN")
    cmd=(env "FLYT_LOG=$CLIENT_LOG_LEVEL" "FLYT_LOG_FILE=$WORK/logs/$tag.$mode.client.log"
         "$FLYT_BIN" run --server "$url" "${tokargs[@]}" -- "$bin")
    local slog
    slog=$(cat "$WORK/server.log" 2>/dev/null)
    echo "$slog" >"$base.slog"
    stat -c %s "$slog" 2>/dev/null >"$base.soff" || echo 0 >"$base.soff"
  fi
  t0=$(now)
  (cd "$BIN_DIR" && timeout -k 5 "$limit" "${cmd[@]}" </dev/null >"$base.out" 2>"$base.err")
  rc=$?
  t1=$(now)
  echo "$rc" >"$base.rc"
  elapsed "$t0" "$t1" >"$base.time"
  if [[ $mode != native ]]; then
    stat -c %s "$(cat "$base.slog")" 2>/dev/null >"$base.send" || echo 0 >"$base.send"
    if [[ $alive_before == 0 ]]; then
      echo "no server running" >"$base.note"
    elif ! server_alive; then
      echo "server died" >"$base.note"
    fi
  fi
}

# cell TAG MODE: markdown cell for a Flyt run compared with the native run;
# also appends failure details. Prints "PASS ..." / "FAIL ..." / "SKIP ...".
cell() {
  local tag=$1 mode=$2 b="$WORK/out/$1" d="$WORK/details/$1.$2.md"
  local rc nrc t note reasons=()
  rc=$(cat "$b.$mode.rc" 2>/dev/null || echo skip)
  nrc=$(cat "$b.native.rc" 2>/dev/null || echo skip)
  note=$(cat "$b.$mode.note" 2>/dev/null)
  if [[ $rc == skip ]]; then echo "SKIP (${note:-not run})"; return; fi
  if [[ $nrc == skip ]]; then echo "SKIP (native run skipped)"; return; fi
  if grep -q "error while loading shared libraries" "$b.native.err" 2>/dev/null; then
    echo "SKIP (native run cannot load its libraries)"; return
  fi
  t=$(cat "$b.$mode.time")
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    reasons+=("timeout after $(cat "$b.$mode.limit") s")
  elif [[ $rc != "$nrc" ]]; then
    reasons+=("rc $rc, native $nrc")
  fi
  cmp -s "$b.native.out" "$b.$mode.out" || reasons+=("stdout differs")
  [[ -n "$note" ]] && reasons+=("$note")
  if [[ ${#reasons[@]} -eq 0 ]]; then
    echo "PASS ${t} s"
    return
  fi
  local why
  why=$(printf '%s; ' "${reasons[@]}")
  why=${why%; }
  echo "FAIL: $why (${t} s)"
  {
    echo "#### $tag via $mode: $why"
    echo
    echo "stdout diff (native vs $mode), first 40 lines:"
    echo '```diff'
    diff -u --label native --label "$mode" "$b.native.out" "$b.$mode.out" | head -n 40
    echo '```'
    echo "stderr of the $mode run (app and flyt), last 40 lines:"
    echo '```'
    tail -n 40 "$b.$mode.err"
    echo '```'
    local clog="$WORK/logs/$tag.$mode.client.log"
    if [[ -s "$clog" ]]; then
      echo "client log ($CLIENT_LOG_LEVEL), last 40 lines:"
      echo '```'
      tail -n 40 "$clog"
      echo '```'
    fi
    local slog off end
    slog=$(cat "$b.$mode.slog" 2>/dev/null)
    off=$(cat "$b.$mode.soff" 2>/dev/null || echo 0)
    end=$(cat "$b.$mode.send" 2>/dev/null || echo 0)
    if [[ -n "$slog" && -f "$slog" && $end -gt $off ]]; then
      echo "server log ($(basename "$slog")) written during this run, first 40 lines$([[ $JOBS -gt 1 ]] && echo ', other sessions interleaved'):"
      echo '```'
      tail -c +"$((off + 1))" "$slog" | head -c "$((end - off))" | head -n 40
      echo '```'
    fi
    if [[ "$note" == *"server died"* && -n "$slog" && -f "$slog" ]]; then
      echo "server log ($(basename "$slog")), last 40 lines:"
      echo '```'
      tail -n 40 "$slog"
      echo '```'
    fi
    echo
  } >"$d"
}

# run_program NAME VARIANT EXPECT_RC [ROWNAME [MODES]]: native + each mode (or
# only the given modes), one row in $WORK/rows.
run_program() {
  local name=$1 variant=$2 expect=$3 rowname=${4:-$1} modes_override=${5:-}
  local bin="$BIN_DIR/$name.$variant" tag="$rowname.$variant" row="$WORK/rows/$rowname.$variant"
  local native_cell mode cells=()
  if [[ ! -x "$bin" ]]; then
    local m; for m in $MODES; do cells+=("FAIL: binary missing"); done
    printf '%s\t%s\t%s' "$rowname" "$variant" "missing" >"$row"
    printf '\t%s' "${cells[@]}" >>"$row"
    echo >>"$row"
    return
  fi
  run_one native "$bin" "$tag"
  local nrc; nrc=$(cat "$WORK/out/$tag.native.rc" 2>/dev/null || echo skip)
  if [[ $nrc == skip ]]; then
    native_cell="SKIP"
  elif [[ $nrc == "$expect" ]]; then
    native_cell="$nrc ($(cat "$WORK/out/$tag.native.time") s)"
  else
    native_cell="**$nrc, expected $expect** ($(cat "$WORK/out/$tag.native.time") s)"
    {
      echo "#### $tag natively: exit code $nrc, expected $expect"
      echo '```'
      tail -n 20 "$WORK/out/$tag.native.out"
      tail -n 20 "$WORK/out/$tag.native.err"
      echo '```'
      echo
    } >"$WORK/details/$tag.native.md"
  fi
  for mode in $MODES; do
    if [[ -n "$modes_override" && " $modes_override " != *" $mode "* ]]; then
      cells+=("-")
      continue
    fi
    if [[ $nrc == skip ]]; then
      echo skip >"$WORK/out/$tag.$mode.rc"; echo "deadline" >"$WORK/out/$tag.$mode.note"
    else
      run_one "$mode" "$bin" "$tag"
    fi
    cells+=("$(cell "$tag" "$mode")")
  done
  printf '%s\t%s\t%s' "$rowname" "$variant" "$native_cell" >"$row"
  printf '\t%s' "${cells[@]}" >>"$row"
  echo >>"$row"
  log "$tag: native rc $nrc | $(printf '%s | ' "${cells[@]}" | sed 's/ | $//')"
}

# ---------------------------------------------------------------- main ----
missing=""
[[ -x "$SERVER_BIN" ]] || missing+=" $SERVER_BIN"
[[ -x "$FLYT_BIN" ]] || missing+=" $FLYT_BIN"

# Program list with expected exit codes and run-last flags.
declare -A EXPECT LAST
names=()
if [[ -f "$BIN_DIR/programs.tsv" ]]; then
  while IFS=$'\t' read -r n rc last; do
    [[ $n == name || -z $n ]] && continue
    names+=("$n"); EXPECT[$n]=$rc; LAST[$n]=$last
  done <"$BIN_DIR/programs.tsv"
else
  for f in "$BIN_DIR"/*.static "$BIN_DIR"/*.shared; do
    [[ -e $f ]] || continue
    n=$(basename "$f"); n=${n%.*}
    [[ -n ${EXPECT[$n]:-} ]] && continue
    names+=("$n"); EXPECT[$n]=0; LAST[$n]=0
  done
fi
if [[ -n "$PROGRAMS" ]]; then
  sel=()
  for n in "${names[@]}"; do [[ " $PROGRAMS " == *" $n "* ]] && sel+=("$n"); done
  names=("${sel[@]}")
fi
# vector_add first: if the basics fail, that shows before any deadline.
if [[ " ${names[*]} " == *" vector_add "* ]]; then
  sel=(vector_add)
  for n in "${names[@]}"; do [[ $n == vector_add ]] || sel+=("$n"); done
  names=("${sel[@]}")
fi
normal=() last=()
for n in "${names[@]}"; do
  if [[ ${LAST[$n]} == 1 ]]; then last+=("$n"); else normal+=("$n"); fi
done

server_ok=1
if [[ -n "$missing" ]]; then
  echo "Flyt binaries missing:$missing" >>"$WORK/events"
  : >"$WORK/server.giveup"
  server_ok=0
elif ! ensure_server "initial start"; then
  server_ok=0
fi
[[ $server_ok == 1 ]] || log "server could not be started; Flyt runs will fail"

log "${#names[@]} programs x 2 variants; modes: $MODES; timeout ${RUN_TIMEOUT}s; jobs $JOBS; work dir $WORK"
CHILD_PIDS=()
for n in "${normal[@]}"; do
  for v in static shared; do
    if [[ $JOBS -gt 1 ]]; then
      while [[ $(jobs -rp | wc -l) -ge $JOBS ]]; do wait -n; done
      run_program "$n" "$v" "${EXPECT[$n]}" &
      CHILD_PIDS+=("$!")
    else
      run_program "$n" "$v" "${EXPECT[$n]}"
    fi
  done
done
wait
CHILD_PIDS=()

# Programs that may break the server's context, one at a time, then a health check.
if [[ ${#last[@]} -gt 0 ]]; then
  for n in "${last[@]}"; do
    for v in static shared; do run_program "$n" "$v" "${EXPECT[$n]}"; done
  done
  if [[ -n ${EXPECT[vector_add]:-} ]]; then
    # Same server, not restarted: does it still serve new sessions?
    if server_alive; then
      run_program vector_add static 0 "vector_add-after-faults" "tcp"
    else
      echo "server died during the run-last programs (${last[*]})" >>"$WORK/events"
      printf '%s\t%s\t%s\t%s\n' "vector_add-after-faults" static "-" \
        "FAIL: server dead after the run-last programs" >"$WORK/rows/vector_add-after-faults.static"
    fi
  fi
fi

# ---------------------------------------------------------------- report --
pass=0 fail=0 skip=0 native_bad=0
rows=()
for n in "${normal[@]}" "${last[@]}" vector_add-after-faults; do
  for v in static shared; do
    f="$WORK/rows/$n.$v"
    [[ -f $f ]] && rows+=("$f")
  done
done
{
  echo "## Flyt GPU programs: native vs flyt run"
  echo
  echo "- programs: ${#names[@]} x {static, shared cudart}; modes: $MODES; timeout ${RUN_TIMEOUT} s per run; jobs $JOBS"
  echo "- server: \`$SERVER_BIN --backend $SERVER_BACKEND\`, log level $SERVER_LOG_LEVEL; clients FLYT_LOG=$CLIENT_LOG_LEVEL"
  echo "- PASS = same exit code and byte-identical stdout as the native run; times are wall seconds"
  [[ $JOBS -gt 1 ]] && echo "- $JOBS programs ran at once: a server death is charged to the run that noticed it, which may be a neighbour of the culprit; rerun with JOBS=1 to pin it"
  echo
  header="| program | variant | native rc |"
  sep="|---|---|---|"
  for m in $MODES; do header+=" $m |"; sep+="---|"; done
  echo "$header"
  echo "$sep"
  for f in "${rows[@]}"; do
    IFS=$'\t' read -r -a fields <"$f"
    line="|"
    for x in "${fields[@]}"; do line+=" $x |"; done
    echo "$line"
    [[ ${fields[2]} == *expected* ]] && native_bad=$((native_bad + 1))
    for x in "${fields[@]:3}"; do
      case $x in
        PASS*) pass=$((pass + 1)) ;;
        FAIL*) fail=$((fail + 1)) ;;
        SKIP*) skip=$((skip + 1)) ;;
      esac
    done
  done
  echo
  # Wall-time totals over programs that passed in every mode.
  tn=0; declare -A tm
  for f in "${rows[@]}"; do
    IFS=$'\t' read -r -a fields <"$f"
    all=1; for x in "${fields[@]:3}"; do [[ $x == PASS* ]] || all=0; done
    [[ $all == 1 && ${fields[2]} != SKIP && ${fields[2]} != missing && ${fields[2]} != - ]] || continue
    tag="${fields[0]}.${fields[1]}"
    tn=$(awk -v a="$tn" -v b="$(cat "$WORK/out/$tag.native.time")" 'BEGIN { print a + b }')
    for m in $MODES; do
      tm[$m]=$(awk -v a="${tm[$m]:-0}" -v b="$(cat "$WORK/out/$tag.$m.time")" 'BEGIN { print a + b }')
    done
  done
  echo "**Result: $pass passed, $fail failed, $skip skipped (Flyt runs); native runs with an unexpected exit code: $native_bad.**"
  line="Wall time over rows that passed everywhere: native ${tn} s"
  for m in $MODES; do line+=", $m ${tm[$m]:-0} s"; done
  echo "$line."
  if [[ -s "$WORK/events" ]]; then
    echo
    echo "### Server events"
    sed 's/^/- /' "$WORK/events"
  fi
  if compgen -G "$WORK/details/*.md" >/dev/null; then
    echo
    echo "### Failure details"
    echo
    cat "$WORK/details/"*.md
  fi
  echo
  echo "Logs and outputs: $WORK"
} >"$OUTFILE"

cat "$OUTFILE"
[[ $fail -eq 0 && $native_bad -eq 0 ]] && exit 0
exit 1
