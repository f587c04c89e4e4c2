#!/usr/bin/env bash
# The e2e programs that cover process-level behaviour, on a GPU host: natively and
# through one `flyt-server --backend cuda` per transport, compared.
#
# Usage: tests/gpu/run_e2e_programs.sh BUILD_DIR PROGRAMS_DIR OUTFILE
#   BUILD_DIR     Flyt build (bin/flyt-server, bin/flyt)
#   PROGRAMS_DIR  tests/e2e's built programs (build/tests/e2e/programs, sm_90)
#   OUTFILE       markdown report
# Each case runs natively (FLYT_E2E_NATIVE=1) and through Flyt over tcp, unix and shm
# against the same server; a case passes when the Flyt run exits as the native run did
# and prints the same key lines (lines with '=' or ': PASS'/': FAIL', less free-memory
# readings), and when the
# server is alive afterwards. Cases (CASES to choose): ipc (CUDA IPC between two
# processes), vmm_share (VMM shareable handle passed to a child process), contexts
# (cuCtxCreate/push/pop/destroy), isolation_fault (a sticky fault in one process while
# `isolation work` runs beside it in another), stream_event_order (streams, events, host
# functions, stream attributes and profiler control), jit_link (the JIT linker: PTX
# string and file, logs, a bad input; its Flyt-only misuse checks are not compared),
# module_functions (the private table cuFFT uses to take the function of a module),
# graph_nodes (graphs built by hand: memcpy to and from host memory, memset, kernel,
# host, conditional IF/IF-ELSE/WHILE/SWITCH, memory alloc/free, child, empty and event
# nodes, SetParams, clone, update), stream_memops, managed_memory (unified memory:
# host and device writes interleaved, copies, prefetch, advice, threads, fork), mapped_host
# (pinned host memory kernels read and write: cudaHostAllocMapped, cudaHostRegisterMapped,
# cudaMallocHost + cudaHostGetDevicePointer, pointer attributes, host functions, events),
# memory_roundtrip (copies of every shape, texture and surface descriptors read back),
# driver_queries (module/library/kernel handle queries, graph kernel node parameters and
# attributes, instantiate with parameters, context flags and affinity, host atomics,
# pointer SYNC_MEMOPS, cluster size, the pre-11.7 stream memory operations),
# migrate_state (the state a move carries, not moved here: the app's VMM, captured and
# hand-built graphs changed in place, cudaMallocAsync, texture objects read in kernels;
# tests/gpu/migrate/run_migrate.py moves it), rma_copies (pinned and registered memory copied both ways at odd sizes and
# offsets, in stream order with host functions and events; over ucx:// the server reads and
# writes it one-sided), staged_copies (device-to-host copies into pageable memory at odd
# sizes around the staging chunk, several threads, errors; over shm:// through the staging
# area the GPU writes), p2p_devices (two GPUs of the server: peer capability and
# attributes, peer access both ways and its errors, peer copies both directions at odd
# sizes, cudaMemcpyDefault between devices, per-device streams and events, pointer
# devices; with one GPU it prints "skip=needs 2 GPUs, found 1" and passes, natively and
# through Flyt alike).
# Environment: CASES, RUN_TIMEOUT=60, MODES="tcp unix shm" (add ucx for ucx://, with UCX_TLS
# as set, e.g. UCX_TLS=tcp), SERVER_BACKEND=cuda (sim: plumbing only, on a machine without a
# GPU, where the native runs fail).
set -uo pipefail
# The driver's JIT cache makes JIT logs depend on which run compiled first
# (natively "ptxas info : ...", from the cache "info : ..."): no cache, for
# the native runs and for the server started here alike.
export CUDA_CACHE_DISABLE=1

[[ $# -eq 3 ]] || { sed -n '2,8p' "$0" >&2; exit 2; }
BUILD=$(cd "$1" && pwd) || exit 2
PROGS=$(cd "$2" && pwd) || exit 2
OUTFILE=$3
CASES=${CASES:-"ipc vmm_share contexts isolation_fault stream_event_order jit_link module_functions graph_nodes cupti_activity cupti_activity_clock cupti_callbacks cupti_callbacks_driver cupti_callbacks_driver_all tensor_map stream_memops managed_memory mapped_host memory_roundtrip driver_queries migrate_state rma_copies staged_copies p2p_devices"}
MODES=${MODES:-"tcp unix shm"}
RUN_TIMEOUT=${RUN_TIMEOUT:-60}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/flyt-e2e-gpu.XXXXXX")
SERVER_PID=""
trap '[[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null' EXIT

cmd_of() {  # case -> program and arguments
  case $1 in
    ipc) echo "$PROGS/ipc" ;;
    vmm_share) echo "$PROGS/vmm share" ;;
    contexts) echo "$PROGS/contexts" ;;
    isolation_fault) echo "$PROGS/isolation fault" ;;
    stream_event_order) echo "$PROGS/stream_event_order" ;;
    jit_link) echo "$PROGS/jit_link" ;;
    module_functions) echo "$PROGS/module_functions" ;;
    graph_nodes) echo "$PROGS/graph_nodes" ;;
    cupti_activity) echo "$PROGS/cupti_activity" ;;  # natively: E2E_CUPTI=path of libcupti.so.13
    cupti_activity_clock) echo "$PROGS/cupti_activity clock" ;;
    cupti_callbacks) echo "$PROGS/cupti_callbacks" ;;  # natively: E2E_CUPTI as above
    cupti_callbacks_driver) echo "$PROGS/cupti_callbacks driver" ;;
    cupti_callbacks_driver_all) echo "$PROGS/cupti_callbacks driver_all" ;;
    tensor_map) echo "$PROGS/tensor_map" ;;
    stream_memops) echo "$PROGS/stream_memops" ;;
    managed_memory) echo "$PROGS/managed_memory" ;;
    mapped_host) echo "$PROGS/mapped_host" ;;
    memory_roundtrip) echo "$PROGS/memory_roundtrip" ;;
    driver_queries) echo "$PROGS/driver_queries" ;;
    migrate_state) echo "$PROGS/migrate_state 12 0" ;;
    rma_copies) echo "$PROGS/rma_copies" ;;
    staged_copies) echo "$PROGS/staged_copies" ;;
    p2p_devices) echo "$PROGS/p2p_devices" ;;
  esac
}

# Compared: key=value lines and the verdict; not which library answered, nor device-wide
# free-memory readings (they depend on what else the GPU holds at that moment: other
# processes, a server's idle workers), nor the error of destroying a destroyed context,
# which driver 580 itself answers either way (201 in one run, 709 in the next, H200).
key_lines() {
  grep -E '=|: (PASS|FAIL)' "$1" |
    grep -vE '^(under_flyt|freed_by_destroy|free_after_all|destroy_destroyed|misuse|flyt\.[a-z_.]*)=' || true
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
ucx_listen=()
if [[ " $MODES " == *" ucx "* ]]; then
  ucx_port=$(free_port)
  ucx_listen=(--listen "ucx://127.0.0.1:$ucx_port")
fi
FLYT_LOG=${FLYT_LOG:-info} "$BUILD/bin/flyt-server" --backend "${SERVER_BACKEND:-cuda}" --listen "tcp://127.0.0.1:$port" \
  --listen "unix://$WORK/flyt.sock" --listen "shm://$WORK/flyt-shm.sock" "${ucx_listen[@]}" \
  --control "unix://$WORK/control.sock" >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 300); do [[ -S $WORK/control.sock ]] && break; sleep 0.1; done

url() {
  case $1 in
    tcp) echo "tcp://127.0.0.1:$port" ;;
    unix) echo "unix://$WORK/flyt.sock" ;;
    shm) echo "shm://$WORK/flyt-shm.sock" ;;
    ucx) echo "ucx://127.0.0.1:$ucx_port" ;;
  esac
}

{
  echo "## e2e programs on the GPU: native vs Flyt"
  echo
  echo "| case | native rc | $(echo $MODES | sed 's/ / | /g') |"
  echo "|---|---|$(for _ in $MODES; do printf -- '---|'; done)"
} >"$OUTFILE"
fails=0
for c in $CASES; do
  read -r -a cmd <<<"$(cmd_of "$c")"
  if [[ ${#cmd[@]} -eq 0 ]]; then  # a name this script does not know
    echo "| $c | unknown case | $(for _ in $MODES; do printf -- '- | '; done)" >>"$OUTFILE"
    fails=$((fails + 1))
    continue
  fi
  if [[ ! -x ${cmd[0]} ]]; then
    echo "| $c | missing ${cmd[0]##*/} | $(for _ in $MODES; do printf -- '- | '; done)" >>"$OUTFILE"
    continue
  fi
  npeer=""
  if [[ $c == isolation_fault ]]; then  # a neighbour works while this process faults
    FLYT_E2E_NATIVE=1 timeout "$RUN_TIMEOUT" "$PROGS/isolation" work 3 >"$WORK/$c.native.peer" 2>&1 &
    npeer=$!
  fi
  FLYT_E2E_NATIVE=1 timeout "$RUN_TIMEOUT" "${cmd[@]}" >"$WORK/$c.native.out" 2>&1
  nrc=$?
  [[ -n $npeer ]] && wait "$npeer"
  row="| $c | $nrc |"
  for m in $MODES; do
    env=(FLYT_LOG=warn FLYT_LOG_FILE="$WORK/$c.$m.log")
    [[ $m != shm ]] && env+=(FLYT_SHM=off)
    peer_ok=1
    if [[ $c == isolation_fault ]]; then
      env "${env[@]}" timeout "$RUN_TIMEOUT" "$BUILD/bin/flyt" run --server "$(url "$m")" -- \
        "$PROGS/isolation" work 3 >"$WORK/$c.$m.peer" 2>&1 &
      peer=$!
    fi
    env "${env[@]}" timeout "$RUN_TIMEOUT" "$BUILD/bin/flyt" run --server "$(url "$m")" -- \
      "${cmd[@]}" >"$WORK/$c.$m.out" 2>&1
    rc=$?
    if [[ $c == isolation_fault ]]; then
      wait "$peer" || peer_ok=0
      grep -q '^isolation: PASS' "$WORK/$c.$m.peer" || peer_ok=0
    fi
    if [[ $rc == "$nrc" && $peer_ok == 1 ]] &&
      diff <(key_lines "$WORK/$c.native.out") <(key_lines "$WORK/$c.$m.out") >"$WORK/$c.$m.diff"; then
      row+=" PASS |"
    else
      row+=" FAIL (rc $rc$([[ $peer_ok == 1 ]] || echo ', neighbour failed')) |"
      fails=$((fails + 1))
    fi
  done
  echo "$row" >>"$OUTFILE"
done
alive=yes
kill -0 "$SERVER_PID" 2>/dev/null || alive=no
{
  echo
  echo "Server alive afterwards: $alive. Failures: $fails."
  for f in "$WORK"/*.diff; do
    [[ -s $f ]] || continue
    echo
    echo "### ${f##*/}"
    echo '```'
    head -40 "$f"
    echo '```'
    out=${f%.diff}.out
    echo '```'
    tail -15 "$out"
    echo '```'
  done
  if [[ " $MODES " == *" ucx "* ]]; then
    echo
    echo "ucx:// (UCX_TLS=${UCX_TLS:-unset}): what carried the pinned copies, from the server's log:"
    echo '```'
    grep -h 'pinned client memory by' "$WORK/server.log" | sed 's/^.* I //' | sort -u | head -5
    echo '```'
  fi
  echo
  echo '### server log (tail)'
  echo '```'
  tail -30 "$WORK/server.log"
  echo '```'
} >>"$OUTFILE"
[[ $fails == 0 && $alive == yes ]]
