#!/usr/bin/env bash
# package_test: Flyt's Debian packages on a clean Debian root, their daemons started from
# their systemd units' command lines.
#
#   1. cpack -G DEB in BUILD_DIR: flyt-client, flyt-server, flyt-manager;
#   2. a minimal Debian bookworm root (debootstrap --variant=minbase; cached as a tarball
#      in BUILD_DIR/packaging-cache, so later runs skip the download);
#   3. apt-get install of the three .deb files inside it (apt pulls their dependencies);
#   4. each unit's ExecStart line (from /usr/lib/systemd/system in the root, with the
#      unit's Environment= lines) run inside the root: the cluster manager, a node manager
#      with a sim inventory and sim flyt-servers (no GPU here) and a client manager;
#   5. flytctl (installed) sees the node with its GPUs; an allocation starts the packaged
#      flyt-server; the dashboard and /metrics answer; and the README's quickstart from
#      the packages: `flyt run -- memory_roundtrip` (the e2e program, nvcc-built with the
#      static cudart) finds its GPU server through the client manager and passes.
# Needs root (or sudo), debootstrap, dpkg-dev and network access to Debian's mirror.
# Usage: tests/packaging/package_test.sh BUILD_DIR
set -euo pipefail
BUILD=$(cd "${1:?usage: package_test.sh BUILD_DIR}" && pwd)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/flyt-pkg.XXXXXX")
ROOT=$WORK/root
PIDS_FILE=$WORK/pids
cleanup() {
  if [ -f "$PIDS_FILE" ]; then $SUDO kill $(cat "$PIDS_FILE") 2>/dev/null || true; fi
  sleep 1
  # Whatever still runs inside the root (a tenant's flyt-server, say) goes too.
  for p in /proc/[0-9]*; do
    [ "$($SUDO readlink "$p/root" 2>/dev/null)" = "$ROOT" ] && $SUDO kill -9 "${p#/proc/}" 2>/dev/null
  done
  sleep 0.5
  $SUDO umount "$ROOT/proc" 2>/dev/null || true
  $SUDO umount "$ROOT/dev" 2>/dev/null || true
  $SUDO rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "package_test: FAIL: $*" >&2; for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -30 "$f"; }; done >&2; exit 1; }

echo "== packages"
(cd "$BUILD" && cpack -G DEB -B "$WORK/debs" >"$WORK/cpack.log" 2>&1) || fail "cpack"
ls "$WORK"/debs/*.deb
[ "$(ls "$WORK"/debs/*.deb | wc -l)" -eq 3 ] || fail "expected three packages"

echo "== a clean Debian root"
CACHE=$BUILD/packaging-cache/bookworm-minbase.tar
mkdir -p "$ROOT" "$(dirname "$CACHE")"
if [ -f "$CACHE" ]; then
  $SUDO tar -xf "$CACHE" -C "$ROOT"
else
  $SUDO debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
    fail "debootstrap (network access to $MIRROR needed)"
  $SUDO tar -cf "$CACHE" -C "$ROOT" .
fi
$SUDO mount -t proc proc "$ROOT/proc"
$SUDO mount --bind /dev "$ROOT/dev"
$SUDO cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
$SUDO mkdir -p "$ROOT/tmp/debs"
$SUDO cp "$WORK"/debs/*.deb "$ROOT/tmp/debs/"

echo "== apt-get install"
in_root() { $SUDO chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
in_root apt-get update -qq >"$WORK/apt.log" 2>&1 || fail "apt-get update in the root"
debs=()
for f in "$WORK"/debs/*.deb; do debs+=("/tmp/debs/$(basename "$f")"); done
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${debs[@]}" >>"$WORK/apt.log" 2>&1 || fail "apt-get install of the packages"
for f in /usr/bin/flyt /usr/bin/flyt-server /usr/bin/flyt-node-manager /usr/bin/flyt-client-manager \
  /usr/bin/flyt-cluster-manager /usr/bin/flytctl /usr/lib/flyt/libcuda.so.1 \
  /usr/lib/flyt/libnvidia-ml.so.1 /usr/lib/flyt/libcupti.so.13 /usr/lib/flyt/libnccl.so.2; do
  [ -x "$ROOT$f" ] || [ -f "$ROOT$f" ] || fail "$f is not installed"
done

# Runs a unit's ExecStart inside the root, with the unit's Environment= settings plus
# the extra NAME=VALUE arguments, in the background; its output goes to WORK/<unit>.log.
start_unit() {
  local unit=$1; shift
  local file=$ROOT/usr/lib/systemd/system/$unit.service
  [ -f "$file" ] || fail "no unit $unit"
  local exec env=()
  exec=$(sed -n 's/^ExecStart=//p' "$file")
  [ -n "$exec" ] || fail "$unit has no ExecStart"
  while IFS= read -r line; do env+=("$line"); done < <(sed -n 's/^Environment=//p' "$file")
  $SUDO mkdir -p "$ROOT/var/lib/flyt" "$ROOT/run/flyt"
  $SUDO chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    "${env[@]}" "$@" $exec >"$WORK/$unit.log" 2>&1 &
  echo $! >>"$PIDS_FILE"
  echo "started $unit: $exec"
}
CM=127.0.0.1:$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ctl() { in_root env FLYT_STATE_DIR=/var/lib/flyt FLYT_CLUSTER_MANAGER=$CM flytctl "$@"; }
wait_for() {  # seconds, command...
  local until=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $until ] || return 1
    sleep 0.5
  done
}

echo "== the daemons from their units"
start_unit flyt-cluster-manager FLYT_CM_LISTEN=$CM FLYT_CM_METRICS_LISTEN=127.0.0.1:0
wait_for 30 ctl list-nodes || fail "the cluster manager does not answer flytctl"
start_unit flyt-node-manager FLYT_NM_INVENTORY=sim:2 FLYT_NM_SERVER_BACKEND=sim \
  FLYT_NM_NODE_ID=pkg-node FLYT_NM_HOST_IP=10.0.0.1 FLYT_NM_LISTEN=127.0.0.1:0 \
  FLYT_NM_ADVERTISE_HOST=127.0.0.1 FLYT_NM_CLUSTER_MANAGER=$CM
wait_for 30 sh -c "$SUDO chroot '$ROOT' env FLYT_STATE_DIR=/var/lib/flyt FLYT_CLUSTER_MANAGER=$CM flytctl list-nodes --json | grep -q '\"state\": *\"up\"'" ||
  fail "the node manager did not register"
start_unit flyt-client-manager FLYT_CLM_VM_IP=10.1.0.5 FLYT_CLM_CLUSTER_MANAGER=$CM
ctl vm add --vm 10.1.0.5 --host 10.0.0.1 --sm 16 --memory 2 >/dev/null || fail "vm add"
ctl allocate --vm 10.1.0.5 >"$WORK/allocate.log" 2>&1 || fail "allocate"
wait_for 30 sh -c "$SUDO chroot '$ROOT' env FLYT_STATE_DIR=/var/lib/flyt FLYT_CLUSTER_MANAGER=$CM flytctl list-servers --json | grep -q '\"state\": *\"running\"'" ||
  fail "the packaged flyt-server did not start"
pgrep -f "^/usr/bin/flyt-server" >/dev/null || fail "no /usr/bin/flyt-server process"
URL=$(grep -o 'http://[0-9.]*:[0-9]*' "$WORK/flyt-cluster-manager.log" | head -1)
[ -n "$URL" ] || fail "the cluster manager printed no HTTP address"
python3 - "$URL" <<'PY' || fail "dashboard or metrics"
import sys, urllib.request
base = sys.argv[1]
page = urllib.request.urlopen(base + "/", timeout=10).read().decode()
assert "<title>Flyt cluster</title>" in page, page[:200]
metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
assert 'flyt_tenant_sms{vm="10.1.0.5"' in metrics, metrics[:2000]
print("dashboard and metrics answer")
PY

echo "== flyt run through the client manager"
PROG=$BUILD/tests/e2e/programs/memory_roundtrip
[ -x "$PROG" ] || fail "$PROG is not built"
$SUDO cp "$PROG" "$ROOT/tmp/memory_roundtrip"
wait_for 30 test -S "$ROOT/run/flyt/client-manager.sock" || fail "no client manager socket"
in_root flyt run -- /tmp/memory_roundtrip >"$WORK/flyt-run.log" 2>&1 || fail "flyt run"
grep -q "memory_roundtrip: PASS" "$WORK/flyt-run.log" || fail "memory_roundtrip did not pass"
echo "package_test: PASS"
