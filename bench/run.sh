#!/usr/bin/env bash
# Native vs Flyt benchmark on a GPU host; writes OUTDIR/bench.md.
#
# Usage: bench/run.sh BUILD_DIR OUTDIR
#
# Runs bench/cuda_bench natively, through `flyt run` over TCP loopback, over a Unix
# socket and over shared memory (shm://) against one BUILD_DIR/bin/flyt-server --backend
# cuda, plus the plain-socket reference bench/tcp_loopback_bw and, with shm in the modes,
# bench/shm_latency (small synchronous calls natively and over shm:// in one run); then renders
# OUTDIR/bench.md with bench/report.awk (native/tcp/unix table), followed by the same
# table with the shm column in the tcp column's place, and the same for tls:// (TCP with
# TLS 1.3; the script makes a throw-away CA and server certificate with openssl) when
# FLYT_BENCH_MODES has tls, and for ucx:// (UCX; UCX_TLS as set in the environment,
# e.g. UCX_TLS=tcp or sm,self; unset: UCX's choice) when it has ucx.
# Every step has a timeout; a missing binary or a failed step yields 'n/a' cells. The
# server is stopped on exit, whatever happens.
#
# Benchmark binaries are looked up in $FLYT_BENCH_BIN_DIR, BUILD_DIR/bench,
# BUILD_DIR/bin, BUILD_DIR; if absent they are built into OUTDIR/bin with bench/build.sh.
#
# Environment (all optional):
#   FLYT_BENCH_MODES      modes to run            (default "native tcp unix shm"; also tls, ucx)
#   FLYT_BENCH_GROUPS     cuda_bench groups       (default "init launch memcpy bw bwasync malloc query")
#   FLYT_BENCH_ARGS       extra cuda_bench args   (e.g. "--quick 0.5")
#   FLYT_BENCH_TIMEOUT    seconds per invocation  (default 120)
#   FLYT_BENCH_DEADLINE   seconds for everything  (default 420; later steps are skipped)
#   FLYT_BENCH_IDLE       idle sessions held open to measure server RSS (default 4; 0 = skip)
#   FLYT_BENCH_SERVER_ARGS extra flyt-server args
set -u

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUTDIR" >&2
  exit 1
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=$(cd "$1" 2>/dev/null && pwd || echo "$1")
mkdir -p "$2/raw" || exit 1
OUT=$(cd "$2" && pwd)
RAW=$OUT/raw

MODES=${FLYT_BENCH_MODES:-"native tcp unix shm"}
# The server also listens on shm://: without this a tcp or unix client on this host
# would move to it by itself, and those columns would measure shared memory.
export FLYT_SHM=off
BENCH_GROUPS=${FLYT_BENCH_GROUPS:-"init launch memcpy bw bwasync malloc query"}
read -r -a BENCH_ARGS <<<"${FLYT_BENCH_ARGS:-}"
read -r -a SERVER_ARGS <<<"${FLYT_BENCH_SERVER_ARGS:-}"
T_RUN=${FLYT_BENCH_TIMEOUT:-120}
DEADLINE=${FLYT_BENCH_DEADLINE:-420}
IDLE_N=${FLYT_BENCH_IDLE:-4}
SERVER=$BUILD/bin/flyt-server
FLYT=$BUILD/bin/flyt

RESULTS=$OUT/results.tsv  # mode group name value unit
RUNS=$OUT/runs.tsv        # mode group rc wall_s
META=$OUT/meta.tsv        # key value
NOTES=$OUT/notes.txt
: >"$RESULTS"
: >"$RUNS"
: >"$META"
: >"$NOTES"
rm -f "$RAW"/*

t_start=$(date +%s)
now() { date +%s.%N; }
remaining() { echo $((DEADLINE - ($(date +%s) - t_start))); }
note() {
  echo "run.sh: $*" >&2
  echo "$*" >>"$NOTES"
}
meta() { printf '%s\t%s\n' "$1" "$2" >>"$META"; }
result() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RESULTS"; }

# ---- cleanup: idle clients, then the server; never hangs ---------------------------
SERVER_TPID=""
SERVER_PID=""
SOCKDIR=""
IDLE_PIDS=()
cleanup() {
  trap - EXIT INT TERM
  [[ -n $SOCKDIR ]] && touch "$SOCKDIR/release" 2>/dev/null
  local p
  for p in "${IDLE_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  stop_server
  [[ -n $SOCKDIR ]] && rm -rf "$SOCKDIR"
}
stop_server() {
  [[ -z $SERVER_TPID ]] && return 0
  kill -TERM "$SERVER_TPID" 2>/dev/null
  [[ -n $SERVER_PID ]] && kill -TERM "$SERVER_PID" 2>/dev/null
  local i
  for i in $(seq 50); do
    kill -0 "$SERVER_TPID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$SERVER_TPID" 2>/dev/null; then
    note "flyt-server ignored SIGTERM for 5 s; killed"
    [[ -n $SERVER_PID ]] && kill -KILL "$SERVER_PID" 2>/dev/null
    kill -KILL "$SERVER_TPID" 2>/dev/null
  fi
  wait "$SERVER_TPID" 2>/dev/null
  SERVER_TPID=""
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- binaries -------------------------------------------------------------------------
find_bin() {
  local d
  for d in "${FLYT_BENCH_BIN_DIR:-}" "$BUILD/bench" "$BUILD/bin" "$BUILD" "$OUT/bin"; do
    [[ -n $d && -x $d/$1 && -f $d/$1 ]] && {
      echo "$d/$1"
      return 0
    }
  done
  return 1
}
CUDA_BENCH=$(find_bin cuda_bench)
LOOPBACK=$(find_bin tcp_loopback_bw)
SHM_LATENCY=$(find_bin shm_latency)
if [[ -z $CUDA_BENCH || -z $LOOPBACK ]]; then
  note "benchmark binaries not in $BUILD; building them into $OUT/bin"
  timeout -k 5 300 "$here/build.sh" "$OUT/bin" >"$RAW/build.log" 2>&1 ||
    note "bench/build.sh failed (see raw/build.log)"
  CUDA_BENCH=$(find_bin cuda_bench)
  LOOPBACK=$(find_bin tcp_loopback_bw)
  SHM_LATENCY=$(find_bin shm_latency)
fi
[[ -z $CUDA_BENCH ]] && note "cuda_bench missing: every CUDA figure is n/a"
[[ -z $LOOPBACK ]] && note "tcp_loopback_bw missing: socket reference is n/a"
[[ -x $SERVER ]] || note "$SERVER missing: flyt columns are n/a"
[[ -x $FLYT ]] || note "$FLYT missing: flyt columns are n/a"

# ---- metadata -------------------------------------------------------------------------
meta date "$(date -u '+%Y-%m-%d %H:%M UTC')"
meta host "$(hostname 2>/dev/null || echo '?')"
if command -v nvidia-smi >/dev/null; then
  meta gpu "$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader 2>/dev/null | head -1 || echo n/a)"
else
  meta gpu "n/a (no nvidia-smi)"
fi
meta commit "$(git -C "$here/.." rev-parse --short HEAD 2>/dev/null || echo n/a)$(
  git -C "$here/.." status --porcelain 2>/dev/null | grep -q . && echo ' (dirty)')"
meta "build dir" "$BUILD"
meta "cuda_bench" "${CUDA_BENCH:-missing} ${BENCH_ARGS[*]}"
meta "cpu" "$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //') ($(nproc) cores)"
TIMER=()
if [[ -x /usr/bin/time ]]; then
  TIMER=(/usr/bin/time -v)
  meta "client RSS source" "/usr/bin/time -v (max RSS of the app process)"
else
  meta "client RSS source" "VmHWM read by cuda_bench from /proc/self/status at exit"
fi

# ---- one benchmark invocation ----------------------------------------------------------
# run_case MODE GROUP URL: runs cuda_bench GROUP natively (URL empty) or via flyt run.
run_case() {
  local mode=$1 group=$2 url=$3
  local base=$RAW/$mode-$group
  local t
  t=$(remaining)
  ((t > T_RUN)) && t=$T_RUN
  if [[ -z $CUDA_BENCH ]]; then
    printf '%s\t%s\t%s\t%s\n' "$mode" "$group" "missing" "-" >>"$RUNS"
    return
  fi
  if ((t < 10)); then
    printf '%s\t%s\t%s\t%s\n' "$mode" "$group" "skipped" "-" >>"$RUNS"
    note "$mode/$group skipped: deadline ${DEADLINE}s reached"
    return
  fi
  local pre=()
  if [[ -n $url ]]; then
    if [[ ! -x $FLYT || -z $SERVER_TPID ]]; then
      printf '%s\t%s\t%s\t%s\n' "$mode" "$group" "no-server" "-" >>"$RUNS"
      return
    fi
    pre=("$FLYT" run --server "$url" --)
  fi
  local timer=()
  ((${#TIMER[@]})) && timer=("${TIMER[@]}" -o "$base.time")
  local t0 rc
  t0=$(now)
  timeout -k 5 "$t" "${pre[@]}" "${timer[@]}" "$CUDA_BENCH" "${BENCH_ARGS[@]}" "$group" \
    >"$base.out" 2>"$base.err" </dev/null
  rc=$?
  local wall
  wall=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  printf '%s\t%s\t%s\t%s\n' "$mode" "$group" "$rc" "$wall" >>"$RUNS"
  awk -v m="$mode" -v g="$group" '$1 == "RESULT" && NF >= 4 {
    printf "%s\t%s\t%s\t%s\t%s\n", m, g, $2, $3, $4 }' "$base.out" >>"$RESULTS"
  if [[ -f $base.time ]]; then
    local kb
    kb=$(awk -F: '/Maximum resident set size/ { gsub(/ /, "", $2); print $2 }' "$base.time")
    [[ -n $kb && $rc == 0 ]] && result "$mode" "$group" rss_time_kb "$kb" kB
  fi
  if [[ $rc != 0 ]]; then
    note "$mode/$group exited with $rc$( ((rc == 124 || rc == 137)) && echo " (timeout ${t}s)"): $(
      grep -v '^\s*$' "$base.err" | tail -n 2 | tr '\n' ' ' | cut -c1-300)"
  fi
  [[ $mode == warmup-* ]] || grep -h '^INFO device' "$base.out" 2>/dev/null | head -1 | sed 's/^INFO //' |
    while read -r l; do grep -q "^device ($mode)" "$META" || meta "device ($mode)" "$l"; done
}

# ---- server ---------------------------------------------------------------------------
free_port() {
  local p
  if [[ -n $LOOPBACK ]] && p=$("$LOOPBACK" --free-port 2>/dev/null) && [[ -n $p ]]; then
    echo "$p"
    return
  fi
  if command -v python3 >/dev/null && p=$(python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null); then
    echo "$p"
    return
  fi
  local i hex
  for i in $(seq 50); do
    p=$((20000 + RANDOM % 40000))
    hex=$(printf ':%04X ' "$p")
    grep -q "$hex" /proc/net/tcp /proc/net/tcp6 2>/dev/null || {
      echo "$p"
      return
    }
  done
  echo 0
}
rss_kb() { awk -v k="${2:-VmRSS}:" '$1 == k { print $2 }' "/proc/$1/status" 2>/dev/null; }
# The server's RSS: its main process and its worker processes (one per client, plus
# the pool kept ready), as that is what a tenant's server costs the host.
server_rss_kb() {
  local total pid kb
  total=$(rss_kb "$SERVER_PID")
  [[ -n $total ]] || return 0
  for pid in $(cat /proc/"$SERVER_PID"/task/*/children 2>/dev/null); do
    kb=$(rss_kb "$pid")
    total=$((total + ${kb:-0}))
  done
  echo "$total"
}
server_alive() { [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; }

TCP_URL=""
UNIX_URL=""
SHM_URL=""
TLS_URL=""
# A CA and a certificate for 127.0.0.1 in $1 (tls mode); prints the server's arguments.
tls_files() {
  local d=$1 ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  openssl req -x509 "${ec[@]}" -keyout "$d/ca.key" -out "$d/ca.pem" -days 2 \
    -subj "/CN=flyt bench ca" >/dev/null 2>&1 &&
    openssl req "${ec[@]}" -keyout "$d/server.key" -out "$d/server.csr" \
      -subj "/CN=flyt bench server" >/dev/null 2>&1 &&
    printf 'subjectAltName=IP:127.0.0.1\n' >"$d/server.ext" &&
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" \
      -CAcreateserial -out "$d/server.pem" -days 2 -extfile "$d/server.ext" >/dev/null 2>&1 &&
    echo "--tls-cert $d/server.pem --tls-key $d/server.key"
}
start_server() {
  [[ -x $SERVER && -x $FLYT ]] || return 1
  SOCKDIR=$(mktemp -d /tmp/flyt-bench.XXXXXX) || return 1
  local port
  port=$(free_port)
  TCP_URL=tcp://127.0.0.1:$port
  UNIX_URL=unix://$SOCKDIR/server.sock
  SHM_URL=shm://$SOCKDIR/server.shm.sock
  local tls=()
  if [[ " $MODES " == *" ucx "* ]]; then
    UCX_URL=ucx://127.0.0.1:$(free_port)
    tls+=(--listen "$UCX_URL")
  fi
  if [[ " $MODES " == *" tls "* ]]; then
    local args
    if args=$(tls_files "$SOCKDIR"); then
      TLS_URL=tls://127.0.0.1:$(free_port)
      local more
      read -r -a more <<<"--listen $TLS_URL $args"
      tls+=("${more[@]}")
      export FLYT_TLS_CA=$SOCKDIR/ca.pem
    else
      note "openssl could not make the TLS test certificates: tls is n/a"
    fi
  fi
  meta "server" "$SERVER --listen $TCP_URL --listen $UNIX_URL --listen $SHM_URL ${tls[*]} --backend cuda ${SERVER_ARGS[*]}"
  FLYT_LOG=info timeout -k 5 $((DEADLINE + 120)) "$SERVER" --listen "$TCP_URL" --listen "$UNIX_URL" \
    --listen "$SHM_URL" "${tls[@]}" --backend cuda "${SERVER_ARGS[@]}" >"$RAW/server.log" 2>&1 </dev/null &
  SERVER_TPID=$!
  local i
  for i in $(seq 300); do
    if ! kill -0 "$SERVER_TPID" 2>/dev/null; then
      wait "$SERVER_TPID"
      note "flyt-server exited during start-up with $? (see raw/server.log)"
      SERVER_TPID=""
      return 1
    fi
    if [[ -z $SERVER_PID ]]; then
      SERVER_PID=$(awk '{ print $1 }' "/proc/$SERVER_TPID/task/$SERVER_TPID/children" 2>/dev/null)
      [[ -z $SERVER_PID ]] && command -v pgrep >/dev/null &&
        SERVER_PID=$(pgrep -P "$SERVER_TPID" | head -1)
    fi
    if [[ -n $SERVER_PID && -S $SOCKDIR/server.sock && -S $SOCKDIR/server.shm.sock ]] &&
      (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      sleep 0.2
      return 0
    fi
    sleep 0.1
  done
  note "flyt-server not accepting on $TCP_URL, $UNIX_URL and $SHM_URL after 30 s"
  stop_server
  return 1
}

# Holds IDLE_N sessions open (one tiny kernel run each) and measures the server's RSS
# (main process and workers).
idle_sessions() {
  local n=$1 url=$2
  local rel=$SOCKDIR/release
  rm -f "$rel"
  local before
  before=$(server_rss_kb)
  local i
  IDLE_PIDS=()
  for i in $(seq "$n"); do
    timeout -k 5 90 "$FLYT" run --server "$url" -- "$CUDA_BENCH" idle --hold 80 \
      --release-file "$rel" >"$RAW/idle-$i.out" 2>"$RAW/idle-$i.err" </dev/null &
    IDLE_PIDS+=($!)
  done
  local ready=0
  for _ in $(seq 600); do  # up to 60 s
    ready=0
    local alive=0
    for i in $(seq "$n"); do
      grep -q '^READY' "$RAW/idle-$i.out" 2>/dev/null && ready=$((ready + 1))
      kill -0 "${IDLE_PIDS[$((i - 1))]}" 2>/dev/null && alive=$((alive + 1))
    done
    ((ready == n || alive == 0 || $(remaining) < 5)) && break
    sleep 0.1
  done
  sleep 0.5
  local held
  held=$(server_rss_kb)
  touch "$rel"
  for i in "${IDLE_PIDS[@]}"; do wait "$i" 2>/dev/null; done
  IDLE_PIDS=()
  sleep 0.5
  local after
  after=$(server_rss_kb)
  result server idle idle_sessions "$ready" sessions
  [[ -n $before ]] && result server idle rss_before_idle_kb "$before" kB
  [[ -n $held ]] && result server idle rss_idle_held_kb "$held" kB
  [[ -n $after ]] && result server idle rss_after_idle_kb "$after" kB
  ((ready < n)) && note "only $ready of $n idle sessions became ready (see raw/idle-*.err)"
}

# ---- the runs -------------------------------------------------------------------------
# 1. plain socket reference
if [[ -n $LOOPBACK ]]; then
  t0=$(now)
  timeout -k 5 120 "$LOOPBACK" >"$RAW/ref-loopback.out" 2>"$RAW/ref-loopback.err" </dev/null
  rc=$?
  printf '%s\t%s\t%s\t%s\n' ref loopback "$rc" \
    "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')" >>"$RUNS"
  awk '$1 == "RESULT" && NF >= 4 { printf "ref\tloopback\t%s\t%s\t%s\n", $2, $3, $4 }' \
    "$RAW/ref-loopback.out" >>"$RESULTS"
  ((rc != 0)) && note "tcp_loopback_bw exited with $rc"
fi

# 2. native (before the server holds a context on the GPU)
# A discarded warm-up run first, so that driver load / persistence-off start-up is not
# charged to the first measured group.
if [[ " $MODES " == *" native "* ]]; then
  run_case warmup-native init ""
  for g in $BENCH_GROUPS; do run_case native "$g" ""; done
fi

# 3. through flyt
if [[ " $MODES " == *" tcp "* || " $MODES " == *" unix "* || " $MODES " == *" shm "* ||
  " $MODES " == *" tls "* || " $MODES " == *" ucx "* ]]; then
  if start_server; then
    kb=$(rss_kb "$SERVER_PID") && [[ -n $kb ]] && result server start rss_start_kb "$kb" kB
    # Discarded warm-up session: the server's first session creates its CUDA context.
    if [[ " $MODES " == *" tcp "* ]]; then
      run_case warmup-tcp init "$TCP_URL"
    elif [[ " $MODES " == *" unix "* ]]; then
      run_case warmup-unix init "$UNIX_URL"
    else
      run_case warmup-shm init "$SHM_URL"
    fi
    for mode in tcp unix shm tls ucx; do
      [[ " $MODES " == *" $mode "* ]] || continue
      url=$TCP_URL
      [[ $mode == unix ]] && url=$UNIX_URL
      [[ $mode == shm ]] && url=$SHM_URL
      [[ $mode == tls ]] && url=$TLS_URL
      [[ $mode == ucx ]] && url=$UCX_URL
      [[ -n $url ]] || continue
      for g in $BENCH_GROUPS; do
        server_alive || {
          note "flyt-server died before $mode/$g (see raw/server.log)"
          break 2
        }
        run_case "$mode" "$g" "$url"
      done
    done
    # Small synchronous calls natively and over shm:// in one run (bench/shm_latency):
    # each library in a child of its own, medians with ratio and difference.
    if [[ " $MODES " == *" shm "* && -n $SHM_LATENCY && -f $BUILD/lib/flyt/libcuda.so.1 ]] &&
      server_alive && (($(remaining) > 60)); then
      real_lib=${FLYT_REAL_LIBCUDA:-$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')}
      if [[ -n $real_lib && -f $real_lib ]]; then
        FLYT_SERVER=$SHM_URL timeout -k 5 120 "$SHM_LATENCY" --seconds 1 "native=$real_lib" \
          "shm=$BUILD/lib/flyt/libcuda.so.1" >"$RAW/shm-latency.out" 2>"$RAW/shm-latency.err" </dev/null ||
          note "shm_latency exited with $? (see raw/shm-latency.err)"
      else
        note "NVIDIA's libcuda.so.1 not found (set FLYT_REAL_LIBCUDA): shm_latency not run"
      fi
    fi
    if server_alive; then
      sleep 0.5
      kb=$(rss_kb "$SERVER_PID") && [[ -n $kb ]] && result server runs rss_after_runs_kb "$kb" kB
      if ((IDLE_N > 0)) && [[ -n $CUDA_BENCH ]] && (($(remaining) > 20)); then
        url=$TCP_URL
        [[ " $MODES " == *" tcp "* ]] || url=$UNIX_URL
        [[ " $MODES " == *" tcp "* || " $MODES " == *" unix "* ]] || url=$SHM_URL
        idle_sessions "$IDLE_N" "$url"
      fi
      kb=$(rss_kb "$SERVER_PID" VmHWM) && [[ -n $kb ]] && result server end hwm_kb "$kb" kB
    fi
    server_alive || note "flyt-server was not running at the end (see raw/server.log)"
    stop_server
  else
    [[ -x $SERVER && -x $FLYT ]] && note "flyt-server did not start; flyt columns are n/a"
  fi
fi

# ---- report ---------------------------------------------------------------------------
meta "total wall" "$(($(date +%s) - t_start)) s"
if awk -F'\t' -f "$here/report.awk" "$META" "$RESULTS" "$RUNS" "$NOTES" >"$OUT/bench.md.tmp"; then
  mv "$OUT/bench.md.tmp" "$OUT/bench.md"
  # The shm and tls columns: report.awk's results table rendered again with that mode's
  # rows in the tcp column's place (and the header says so), each its own section.
  for extra in shm tls ucx; do
    [[ " $MODES " == *" $extra "* ]] || continue
    mkdir -p "$OUT/$extra-table"
    awk -F'\t' -v OFS='\t' -v m="$extra" '$1 == "tcp" { next } $1 == m { $1 = "tcp" } { print }' \
      "$RESULTS" >"$OUT/$extra-table/results.tsv"
    {
      echo ""
      if [[ $extra == shm ]]; then
        echo "## Shared memory (shm://, same server)"
      elif [[ $extra == ucx ]]; then
        echo "## UCX (ucx://, same server; UCX_TLS=${UCX_TLS:-unset, UCX chooses})"
      else
        echo "## TLS 1.3 over TCP (tls://, same server)"
      fi
      echo ""
      echo "The results table again, with the $extra column in place of tcp (unix for comparison)."
      echo ""
      awk -F'\t' -f "$here/report.awk" "$META" "$OUT/$extra-table/results.tsv" "$RUNS" "$NOTES" |
        awk -v m="$extra" '/^\| metric \|/ { on = 1; gsub(/tcp/, m) } on && /^$/ { exit } on'
      if [[ $extra == ucx ]]; then
        # What carried the one-sided copies of pinned memory, as the server's workers said.
        paths=$(grep -h 'pinned client memory by' "$RAW/server.log" 2>/dev/null |
          sed 's/^.* I session [0-9]*: //' | sort -u | head -3)
        echo ""
        echo "Pinned copies over ucx://: ${paths:-no one-sided access reported (server log level below info, or FLYT_RMA=off)}"
      fi
    } >>"$OUT/bench.md"
    rm -rf "$OUT/$extra-table"
  done
  if [[ -s $RAW/shm-latency.out ]] && grep -q '^| ' "$RAW/shm-latency.out"; then
    {
      echo ""
      echo "## Small synchronous calls, natively and over shm:// (bench/shm_latency, same run)"
      echo ""
      grep '^|' "$RAW/shm-latency.out"
    } >>"$OUT/bench.md"
  fi
  echo "run.sh: wrote $OUT/bench.md" >&2
else
  note "report.awk failed"
  exit 1
fi
