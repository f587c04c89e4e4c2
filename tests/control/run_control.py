#!/usr/bin/env python3
"""Control-plane end-to-end tests: the real daemons as processes on loopback.

Each test starts, in its own temporary directory and on free ports:
  - flyt-cluster-manager on a real database (SQLite file, or a throwaway PostgreSQL server
    started by tests/support/pg_server.py),
  - flyt-node-managers with a simulated inventory (--inventory sim:2) that start real
    `flyt-server --backend sim` processes,
  - flyt-client-managers on Unix sockets,
and drives them with flytctl and with real nvcc-built CUDA programs run through
`flyt run -- PROGRAM` with FLYT_CLIENT_MANAGER set (no FLYT_SERVER), so that Flyt's client
library asks the client manager where its server is. Every wait polls with a generous
deadline; nothing asserts a timing. Every process is killed in tearDown, the flyt-servers
the node managers started too (found by their run directory).

Usage (CMake registers one ctest test per method and database, label "control"):

  python3 tests/control/run_control.py --bin-dir build/bin --database sqlite \\
      [--programs-dir build/tests/control/programs] \\
      [--e2e-programs-dir build/tests/e2e/programs] [--keep] [unittest args]

  --database postgres: each test starts its own PostgreSQL (needs initdb/postgres/pg_ctl
  on the PATH or where tests/support/pg_server.py finds them; a missing server fails the
  test with a message, it never skips).

Python 3 standard library only.
"""

import argparse
import contextlib
import inspect
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORT_DIR = os.path.join(HERE, os.pardir, "support")


class Config:
    bin_dir = None
    programs_dir = None      # quota_probe
    e2e_programs_dir = None  # memory_roundtrip
    database = "sqlite"
    keep = False


CFG = Config()

SECRET = "control-e2e-secret-5b1e9c"
HEARTBEAT_MS = 200
DEAD_AFTER_HEARTBEATS = 3

# Deadlines of the polling waits: generous, for a loaded 2-core machine.
START_S = 30          # a daemon comes up / registers
STATE_S = 20          # a state change shows (node down, resize, ...)
DEALLOC_S = 40        # an idle server is freed after its grace period
RUN_TIMEOUT_S = 150   # one program run
CTL_TIMEOUT_S = 90    # one flytctl run
CLIENT_TIMEOUT_MS = 20000

NODE_UP = ("up",)
NODE_DOWN = ("down", "dead", "lost")
NODE_DRAINING = ("draining", "drained")
SERVER_RUNNING = ("running",)

GiB = 1 << 30
MiB = 1 << 20

UNREACHABLE_TEXT = "cannot reach the cluster manager at"

SANITIZER_RE = re.compile(
    r"ERROR: AddressSanitizer|ERROR: ThreadSanitizer|WARNING: ThreadSanitizer|"
    r"runtime error:|ERROR: UndefinedBehaviorSanitizer")


# ---------------------------------------------------------------------------------------
# Helpers.


def tail(text, limit=4000):
    if text is None:
        return "<none>"
    return text if len(text) <= limit else "...[%d bytes cut]...\n%s" % (
        len(text) - limit, text[-limit:])


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError as e:
        return "<cannot read %s: %s>" % (path, e)


def describe_rc(rc):
    if rc is None:
        return "did not exit (killed after timeout)"
    if rc < 0:
        try:
            return "killed by %s" % signal.Signals(-rc).name
        except ValueError:
            return "killed by signal %d" % -rc
    return "exit %d" % rc


def clean_env(extra=None):
    """The caller's environment without FLYT_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYT_")}
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def free_tcp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tcp_open(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def unix_open(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def kill_group(proc):
    """SIGKILL a process started with start_new_session=True and its group."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def pids_with_arg(fragment, exe_name=None):
    """Pids of live processes whose command line contains `fragment` (and whose argv[0]
    ends with exe_name when given). Used to find the flyt-servers a node manager started:
    their command lines name the node's run directory, which lives in the test's tmp.
    A flyt-server's worker processes (same command line plus --worker) are not counted:
    they belong to their server."""
    out = []
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                argv = f.read().split(b"\0")
            with open("/proc/%s/stat" % entry, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            state = fields[0]
        except OSError:
            continue
        if state == b"Z":
            continue
        parents[int(entry)] = int(fields[1])
        args = [a.decode("utf-8", "replace") for a in argv if a]
        if not args or not any(fragment in a for a in args):
            continue
        if exe_name and os.path.basename(args[0]) != exe_name:
            continue
        if "--worker" in args:
            continue
        out.append(int(entry))
    # A worker between its fork and its exec still shows its server's command line.
    return sorted(p for p in out if parents.get(p) not in out)


def pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def mentions(obj, *needles):
    text = json.dumps(obj)
    return any(n in text for n in needles)


# ---------------------------------------------------------------------------------------
# PostgreSQL (tests/support/pg_server.py: a context manager that starts a throwaway
# server and yields its URL).


def postgres_context():
    """Returns tests/support/pg_server.py's postgres_server() context manager, or raises
    AssertionError with the reason (this variant never skips)."""
    path = os.path.abspath(os.path.join(SUPPORT_DIR, "pg_server.py"))
    if not os.path.isfile(path):
        raise AssertionError(
            "the PostgreSQL variant needs %s (a context manager that starts a throwaway "
            "PostgreSQL and yields its URL); it is missing" % path)
    if os.path.abspath(SUPPORT_DIR) not in sys.path:
        sys.path.insert(0, os.path.abspath(SUPPORT_DIR))
    import pg_server  # noqa: E402  (tests/support)
    return pg_server.postgres_server()


def url_of(value):
    if isinstance(value, str):
        return value
    for attr in ("url", "dsn", "uri"):
        v = getattr(value, attr, None)
        if isinstance(v, str):
            return v
    raise AssertionError("tests/support/pg_server.py yielded %r, not a URL" % (value,))


# ---------------------------------------------------------------------------------------
# Processes.


class Daemon:
    """One daemon process with its output in files under the test's directory."""

    def __init__(self, tmp, name, cmd, env):
        self.tmp = tmp
        self.name = name
        self.cmd = cmd
        self.env = env
        self.out_path = os.path.join(tmp, name + ".out")
        self.proc = None
        self.starts = 0

    def start(self):
        self.starts += 1
        with open(self.out_path, "ab") as out:
            out.write(("\n===== start #%d: %s\n" % (self.starts, " ".join(self.cmd))).encode())
            out.flush()
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env,
                                         start_new_session=True)
        return self

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def kill9(self):
        """SIGKILL the daemon alone (not its process group: a node manager's servers must
        outlive it, as they would after a crash)."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        finally:
            kill_group(self.proc)

    def output(self):
        return read_text(self.out_path) if os.path.exists(self.out_path) else ""

    def describe(self):
        state = "running" if self.alive() else (
            describe_rc(self.proc.returncode) if self.proc else "not started")
        return "--- %s (%s): %s\n%s" % (self.name, state, " ".join(self.cmd),
                                        tail(self.output(), 3000))


class Result:
    def __init__(self, cmd, rc, stdout, stderr, log_path=None, elapsed=0.0):
        self.cmd = cmd
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.log_path = log_path
        self.elapsed = elapsed
        self.json = None
        if stdout.strip().startswith("{"):
            try:
                self.json = json.loads(stdout)
            except ValueError:
                pass

    @property
    def log(self):
        return read_text(self.log_path) if self.log_path and os.path.exists(
            self.log_path) else ""

    def describe(self):
        return ("--- command: %s\n--- result: %s after %.1fs\n--- stdout:\n%s\n--- stderr:\n%s%s"
                % (" ".join(self.cmd), describe_rc(self.rc), self.elapsed, tail(self.stdout),
                   tail(self.stderr),
                   ("\n--- client log:\n" + tail(self.log)) if self.log_path else ""))


def run(cmd, env, timeout, log_path=None):
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        rc = None
    finally:
        kill_group(proc)
    return Result(cmd, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                  log_path, time.monotonic() - start)


_counter_lock = threading.Lock()
_counter = [0]


def next_id():
    with _counter_lock:
        _counter[0] += 1
        return _counter[0]


def binary(name):
    return os.path.join(CFG.bin_dir, name)


# ---------------------------------------------------------------------------------------
# The tests.


class Control(unittest.TestCase):
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        need = [binary(n) for n in ("flyt-cluster-manager", "flyt-node-manager",
                                    "flyt-client-manager", "flytctl", "flyt-server", "flyt")]
        need.append(os.path.join(CFG.bin_dir, os.pardir, "lib", "flyt", "libcuda.so.1"))
        need.append(os.path.join(CFG.programs_dir, "quota_probe"))
        need.append(os.path.join(CFG.e2e_programs_dir, "memory_roundtrip"))
        missing = [os.path.normpath(p) for p in need if not os.path.isfile(p)]
        if missing:
            raise AssertionError("missing binaries (build the flyt_control_tests target "
                                 "first):\n  " + "\n  ".join(missing))

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="flyt-control-")
        self.daemons = []
        self.cm = None
        self.cm_port = None
        self.cm_args = None
        self.nodes = {}
        self.stack = contextlib.ExitStack()
        self.db_url = None
        self.state_dir = os.path.join(self.tmp, "state")
        os.makedirs(self.state_dir)
        if CFG.database == "sqlite":
            self.db_url = "sqlite:" + os.path.join(self.tmp, "flyt.db")
        else:
            try:
                self.db_url = url_of(self.stack.enter_context(postgres_context()))
            except AssertionError:
                self.stack.close()
                raise
            except Exception as e:  # the helper's own failure (binaries missing, ...)
                self.stack.close()
                raise AssertionError("cannot start a throwaway PostgreSQL server for the "
                                     "postgres variant: %s: %s" % (type(e).__name__, e))

    def tearDown(self):
        problems = []
        for d in reversed(self.daemons):
            d.stop()
            m = SANITIZER_RE.search(d.output())
            if m:
                problems.append("sanitizer report from %s:\n%s" % (
                    d.name, tail(d.output()[m.start():])))
        # flyt-servers whose node manager was killed (or that a node manager left behind).
        for pid in pids_with_arg(self.tmp):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.stack.close()
        if CFG.keep:
            sys.stderr.write("\n[control] kept %s\n" % self.tmp)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if problems:
            self.fail("\n".join(problems))

    # -- diagnostics

    def logs(self):
        return "\n".join(d.describe() for d in self.daemons)

    def fail_with(self, message, *results):
        parts = [message] + [r.describe() for r in results] + [self.logs()]
        self.fail("\n".join(parts))

    def wait_for(self, what, probe, timeout=STATE_S, interval=0.2):
        """Polls probe() until it returns a true value (returned). On timeout fails with
        `what`, the last value seen and every daemon's output."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            try:
                value = probe()
            except AssertionError as e:
                value, last = None, "assertion: %s" % e
            else:
                if value:
                    return value
                last = value
            if time.monotonic() >= deadline:
                self.fail_with("timed out after %ds waiting for %s; last seen: %s" % (
                    timeout, what, tail(repr(last), 3000)))
            time.sleep(interval)

    # -- daemons

    def daemon_env(self, extra=None):
        e = {"FLYT_LOG": "info", "FLYT_STATE_DIR": self.state_dir}
        e.update(getattr(self, "env_for_all", {}))  # e.g. every side's TLS files
        e.update(extra or {})
        return clean_env(e)

    def start_cluster_manager(self, idle_grace_ms=0, policy="spread", secret=SECRET,
                              extra=()):
        """Starts flyt-cluster-manager (the first time on a free port, later on the same
        one) and waits until flytctl gets answers from it."""
        if self.cm_port is None:
            self.cm_port = free_tcp_port()
        self.cm_args = [
            binary("flyt-cluster-manager"),
            "--listen", "127.0.0.1:%d" % self.cm_port,
            "--database", self.db_url,
            "--secret", secret,
            "--heartbeat-ms", str(HEARTBEAT_MS),
            "--node-dead-after-heartbeats", str(DEAD_AFTER_HEARTBEATS),
            "--idle-grace-ms", str(idle_grace_ms),
            "--placement-policy", policy,
            "--oversubscribe-sm", "false",
            "--oversubscribe-memory", "false",
            "--metrics-listen", "127.0.0.1:0",  # parallel tests: never the default port
        ] + list(extra)
        if self.cm is None:
            self.cm = Daemon(self.tmp, "cluster-manager", self.cm_args, self.daemon_env())
            self.daemons.append(self.cm)
        self.cm.cmd = self.cm_args
        self.cm.start()
        deadline = time.monotonic() + START_S
        while True:
            if not self.cm.alive():
                # A port still held after a kill -9 restart: try again on the same port.
                if time.monotonic() < deadline and "in use" in self.cm.output().lower():
                    time.sleep(0.5)
                    self.cm.start()
                    continue
                self.fail_with("flyt-cluster-manager exited during start-up")
            if tcp_open(self.cm_port):
                res = self.ctl("list-vms", check=False)
                if res.rc == 0:
                    return self.cm
            if time.monotonic() >= deadline:
                self.fail_with("flyt-cluster-manager did not answer within %ds" % START_S)
            time.sleep(0.2)

    def metrics_url(self):
        """The /metrics address the running cluster manager printed at its last start."""
        found = re.findall(r"metrics on (http://[0-9.]+:\d+/metrics)", self.cm.output())
        if not found:
            self.fail_with("the cluster manager printed no metrics address")
        return found[-1]

    def scrape(self):
        with urllib.request.urlopen(self.metrics_url(), timeout=10) as r:
            self.assertIn("text/plain", r.headers.get("Content-Type", ""))
            return r.read().decode()

    def start_node(self, node_id, host_ip, inventory="sim:2", secret=SECRET, wait=True,
                   movable=False, extra=()):
        """Starts flyt-node-manager `node_id` and (wait=True) waits until list-nodes shows
        it up with its GPUs."""
        run_dir = os.path.join(self.tmp, node_id)
        os.makedirs(run_dir, exist_ok=True)

        def command(port):
            return [
                binary("flyt-node-manager"),
                "--listen", "127.0.0.1:%d" % port,
                "--advertise-host", "127.0.0.1",
                "--host-ip", host_ip,
                "--node-id", node_id,
                "--cluster-manager", "127.0.0.1:%d" % self.cm_port,
                "--secret", secret,
                "--heartbeat-ms", str(HEARTBEAT_MS),
                "--inventory", inventory,
                "--server-backend", "sim",
                "--server-binary", binary("flyt-server"),
                "--run-dir", run_dir,
            ] + (["--server-movable-memory", "true"] if movable else []) + list(extra)
        d = Daemon(self.tmp, "node-" + node_id, command(free_tcp_port()), self.daemon_env())
        d.run_dir = run_dir
        d.node_id = node_id
        d.host_ip = host_ip
        self.daemons.append(d)
        self.nodes[node_id] = d
        d.start()
        if not wait:
            return d
        retries = 3
        deadline = time.monotonic() + START_S
        while True:
            if not d.alive():
                # A port taken between the probe and the bind (tests side by side): retry.
                if retries > 0 and "in use" in d.output().lower():
                    retries -= 1
                    d.cmd = command(free_tcp_port())
                    d.start()
                    continue
                self.fail_with("flyt-node-manager %s exited during start-up" % node_id)
            n = self.node_list().get(node_id)
            if n and n.get("state") in NODE_UP:
                return d
            if time.monotonic() >= deadline:
                self.fail_with("node %s did not come up within %ds; last seen: %s"
                               % (node_id, START_S, json.dumps(n)))
            time.sleep(0.1)

    def start_client_manager(self, vm_ip, secret=SECRET, cm_port=None):
        sock = os.path.join(self.tmp, "cm-%s.sock" % vm_ip)
        cmd = [
            binary("flyt-client-manager"),
            "--socket", sock,
            "--cluster-manager", "127.0.0.1:%d" % (cm_port or self.cm_port),
            "--secret", secret,
            "--vm-ip", vm_ip,
        ]
        d = Daemon(self.tmp, "client-manager-" + vm_ip, cmd, self.daemon_env())
        d.socket = sock
        d.vm_ip = vm_ip
        self.daemons.append(d)
        d.start()
        deadline = time.monotonic() + START_S
        while not (os.path.exists(sock) and unix_open(sock)):
            if not d.alive():
                self.fail_with("flyt-client-manager exited during start-up")
            if time.monotonic() >= deadline:
                self.fail_with("flyt-client-manager's socket %s did not open within %ds"
                               % (sock, START_S))
            time.sleep(0.1)
        return d

    def server_pids(self, node_id=None):
        """flyt-server processes started by one node manager (or by any of this test's)."""
        frag = self.nodes[node_id].run_dir if node_id else self.tmp
        return pids_with_arg(frag, "flyt-server")

    # -- flytctl

    def ctl(self, *args, check=True, json_out=True, secret=SECRET, address=None,
            env_extra=None):
        cmd = [binary("flytctl")]
        if address is not False:
            cmd += ["--cluster-manager", address or "127.0.0.1:%d" % self.cm_port]
        if secret is not None:
            cmd += ["--secret", secret]
        if json_out:
            cmd.append("--json")
        cmd += [str(a) for a in args]
        res = run(cmd, self.daemon_env(env_extra), CTL_TIMEOUT_S)
        if check:
            if res.rc != 0:
                self.fail_with("flytctl %s failed" % " ".join(map(str, args)), res)
            if json_out and not isinstance(res.json, dict):
                self.fail_with("flytctl --json %s printed no JSON object" % " ".join(
                    map(str, args)), res)
        return res

    def ctl_json(self, *args):
        return self.ctl(*args).json

    def ctl_fails(self, *args, **kw):
        """Runs flytctl expecting exit 1 with a message on stderr; returns the Result."""
        res = self.ctl(*args, check=False, **kw)
        if res.rc != 1:
            self.fail_with("flytctl %s: expected exit 1, got %s" % (
                " ".join(map(str, args)), describe_rc(res.rc)), res)
        if not res.stderr.strip():
            self.fail_with("flytctl %s failed without a message on stderr" % " ".join(
                map(str, args)), res)
        return res

    def vms(self):
        return {v["vm_ip"]: v for v in self.ctl_json("list-vms").get("vms", [])}

    def node_list(self):
        return {n["node_id"]: n for n in self.ctl_json("list-nodes").get("nodes", [])}

    def servers(self):
        return self.ctl_json("list-servers").get("servers", [])

    def server_of(self, vm_ip):
        found = [s for s in self.servers() if s.get("vm_ip") == vm_ip]
        return found[0] if found else None

    def events(self, limit=500):
        return self.ctl_json("list-events", "--limit", limit).get("events", [])

    def last_event_id(self):
        ids = [e.get("id", 0) for e in self.events()]
        return max(ids) if ids else 0

    def events_after(self, event_id):
        return [e for e in self.events() if e.get("id", 0) > event_id]

    def wait_event(self, what, after_id, *needles, timeout=STATE_S):
        """Waits for an event newer than after_id that mentions one of `needles`."""
        return self.wait_for(
            "an event about %s (mentioning %s)" % (what, " or ".join(needles)),
            lambda: [e for e in self.events_after(after_id) if mentions(e, *needles)],
            timeout=timeout)

    def add_vm(self, vm_ip, host_ip, sm, memory_gb):
        self.ctl("vm", "add", "--vm", vm_ip, "--host", host_ip, "--sm", sm, "--memory",
                 memory_gb)

    def wait_node_state(self, node_id, states, timeout=STATE_S):
        def probe():
            n = self.node_list().get(node_id)
            return n if n and n.get("state") in states else None
        return self.wait_for("node %s in state %s" % (node_id, "/".join(states)), probe,
                             timeout=timeout)

    def wait_server_running(self, vm_ip, timeout=STATE_S, **expect):
        def probe():
            s = self.server_of(vm_ip)
            if not s or s.get("state") not in SERVER_RUNNING:
                return None
            for k, v in expect.items():
                if s.get(k) != v:
                    return None
            return s
        return self.wait_for("a running server for VM %s%s" % (
            vm_ip, (" with %s" % expect) if expect else ""), probe, timeout=timeout)

    def gpu_capacity(self, node_id):
        """(sm_count, memory_bytes) of the node's first GPU."""
        gpus = self.node_list()[node_id].get("gpus", [])
        self.assertTrue(gpus, "node %s lists no GPUs\n%s" % (node_id, self.logs()))
        return gpus[0]["sm_count"], gpus[0]["memory_bytes"]

    # -- clients

    def run_client(self, client_manager, program, args=(), timeout=RUN_TIMEOUT_S,
                   client_timeout_ms=CLIENT_TIMEOUT_MS):
        """Runs `flyt run -- program args` asking `client_manager` (no FLYT_SERVER)."""
        log_path = os.path.join(self.tmp, "client-%d.log" % next_id())
        env = clean_env({
            "FLYT_CLIENT_MANAGER": client_manager.socket,
            "FLYT_LOG": "info",
            "FLYT_LOG_FILE": log_path,
            "FLYT_TIMEOUT_MS": client_timeout_ms,
            "E2E_WATCHDOG_S": max(10, timeout - 20),
            **getattr(self, "client_env", {}),  # e.g. FLYT_TLS_CA for tls:// servers
        })
        cmd = [binary("flyt"), "run", "--", program] + [str(a) for a in args]
        return run(cmd, env, timeout, log_path)

    def start_client(self, client_manager, program, args=(), timeout=RUN_TIMEOUT_S):
        """Starts `flyt run -- program args` in the background; returns a handle whose
        finish() waits (bounded) and returns the Result."""
        n = next_id()
        log_path = os.path.join(self.tmp, "client-%d.log" % n)
        out_path = os.path.join(self.tmp, "client-%d.stdout" % n)
        err_path = os.path.join(self.tmp, "client-%d.stderr" % n)
        env = clean_env({
            "FLYT_CLIENT_MANAGER": client_manager.socket,
            "FLYT_LOG": "info",
            "FLYT_LOG_FILE": log_path,
            "FLYT_TIMEOUT_MS": CLIENT_TIMEOUT_MS,
            "E2E_WATCHDOG_S": max(10, timeout - 20),
            **getattr(self, "client_env", {}),
        })
        cmd = [binary("flyt"), "run", "--", program] + [str(a) for a in args]
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)
        test = self

        class Handle:
            def finish(self):
                try:
                    proc.wait(timeout=max(1, timeout - (time.monotonic() - start)))
                    rc = proc.returncode
                except subprocess.TimeoutExpired:
                    rc = None
                finally:
                    kill_group(proc)
                return Result(cmd, rc, read_text(out_path), read_text(err_path), log_path,
                              time.monotonic() - start)

            def kill(self):
                kill_group(proc)

            def alive(self):
                return proc.poll() is None

            def stdout(self):
                return read_text(out_path)

            def wait_line(self, pattern, timeout=RUN_TIMEOUT_S):
                """Waits until a line of its stdout matches `pattern` (a regex); fails the
                test with its output when it does not within timeout or the program ends."""
                rx = re.compile(pattern, re.M)
                deadline = time.monotonic() + timeout
                while True:
                    if rx.search(read_text(out_path)):
                        return
                    if proc.poll() is not None or time.monotonic() >= deadline:
                        if rx.search(read_text(out_path)):
                            return
                        test.fail_with("the program never printed a line matching %r"
                                       % pattern, self.finish())
                    time.sleep(0.05)

        handle = Handle()
        test.addCleanup(handle.kill)
        return handle

    def run_ok(self, client_manager, program, args=()):
        res = self.run_client(client_manager, program, args)
        name = os.path.basename(program)
        if res.rc is None:
            self.fail_with("%s hung (killed after %ds)" % (name, RUN_TIMEOUT_S), res)
        lines = res.stdout.splitlines()
        if res.rc != 0 or not lines or lines[-1] != "%s: PASS" % name:
            self.fail_with("%s failed through the client manager" % name, res)
        return res

    def memory_roundtrip(self):
        return os.path.join(CFG.e2e_programs_dir, "memory_roundtrip")

    def quota_probe(self):
        return os.path.join(CFG.programs_dir, "quota_probe")

    @staticmethod
    def ask_client_manager(client_manager, timeout=60):
        """The client library's request, made by hand: ALLOCATE -> 'OK endpoint token'."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(client_manager.socket)
            s.sendall(b"ALLOCATE\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            return data.decode("utf-8", "replace").strip()
        finally:
            s.close()

    # -- a small standard cluster

    def basic_cluster(self, vm_ip="10.1.0.5", host_ip="10.0.0.1", sm=16, memory_gb=2,
                      **cm_kw):
        self.start_cluster_manager(**cm_kw)
        self.start_node("n1", "10.0.0.1")
        self.add_vm(vm_ip, host_ip, sm, memory_gb)
        return self.start_client_manager(vm_ip)

    # =====================================================================================
    # Allocation through the client manager.

    def test_allocation_via_client_manager(self):
        cmgr = self.basic_cluster(sm=16, memory_gb=2)
        self.assertIsNone(self.server_of("10.1.0.5"), "a server before any client asked")
        before = self.last_event_id()
        res = self.run_ok(cmgr, self.memory_roundtrip())

        srv = self.wait_server_running("10.1.0.5")
        self.assertEqual(srv.get("node_id"), "n1", json.dumps(srv))
        self.assertEqual(srv.get("sm"), 16, json.dumps(srv))
        self.assertEqual(srv.get("memory_bytes"), 2 * GiB, json.dumps(srv))
        self.assertTrue(str(srv.get("endpoint", "")).startswith("tcp://127.0.0.1:"),
                        json.dumps(srv))
        self.assertGreater(srv.get("calls", 0), 0,
                           "the server reports no calls after the program ran: %s\n%s"
                           % (json.dumps(srv), res.describe()))
        self.assertEqual(len(self.server_pids("n1")), 1,
                         "expected one flyt-server process of node n1\n" + self.logs())

        # The same allocation everywhere: list-vms, show, the table, the events.
        vm = self.vms()["10.1.0.5"]
        self.assertEqual((vm.get("allocation") or {}).get("alloc_id"), srv["alloc_id"],
                         json.dumps(vm))
        shown = self.ctl_json("show", "10.1.0.5")
        self.assertTrue(mentions(shown, srv["alloc_id"]), json.dumps(shown))
        shown = self.ctl_json("show", srv["alloc_id"])
        self.assertTrue(mentions(shown, "10.1.0.5"), json.dumps(shown))
        table = self.ctl("list-servers", json_out=False)
        self.assertIn("VM IP", table.stdout, table.describe())
        self.assertIn("10.1.0.5", table.stdout, table.describe())
        self.assertIn(srv["alloc_id"], table.stdout, table.describe())
        self.wait_event("the allocation", before, srv["alloc_id"], "10.1.0.5")

        # A second run reuses the server.
        self.run_ok(cmgr, self.quota_probe(), ["alloc:16", "info"])
        again = self.wait_server_running("10.1.0.5")
        self.assertEqual(again["alloc_id"], srv["alloc_id"])
        self.assertEqual(len(self.server_pids("n1")), 1, self.logs())

    def test_credentials_are_per_tenant(self):
        """Each allocation has its own token: a tenant's token opens its own server
        and no other tenant's."""
        cm_a = self.basic_cluster(vm_ip="10.1.0.5", sm=16, memory_gb=2)
        self.add_vm("10.1.0.6", "10.0.0.1", 16, 2)
        cm_b = self.start_client_manager("10.1.0.6")
        answer_a = self.ask_client_manager(cm_a).split()
        answer_b = self.ask_client_manager(cm_b).split()
        self.assertEqual(answer_a[0], "OK", answer_a)
        self.assertEqual(answer_b[0], "OK", answer_b)
        (endpoint_a, token_a), (endpoint_b, token_b) = answer_a[1:3], answer_b[1:3]
        self.assertNotEqual(endpoint_a, endpoint_b)
        self.assertNotEqual(token_a, token_b)

        def direct(endpoint, token):
            env = clean_env({"FLYT_SERVER": endpoint, "FLYT_TOKEN": token, "FLYT_LOG": "warn",
                             "FLYT_TIMEOUT_MS": CLIENT_TIMEOUT_MS,
                             "E2E_WATCHDOG_S": max(10, RUN_TIMEOUT_S - 20)})
            return run([binary("flyt"), "run", "--", self.memory_roundtrip()], env,
                       RUN_TIMEOUT_S)

        own = direct(endpoint_a, token_a)
        self.assertEqual(own.rc, 0, own.describe())
        other = direct(endpoint_b, token_a)
        self.assertNotEqual(other.rc, 0, "tenant a's token opened tenant b's server\n" +
                            other.describe())
        self.assertIn("refused", other.stderr, other.describe())

    def test_flytctl_tables_and_aliases(self):
        self.basic_cluster()
        self.ctl("allocate", "--vm", "10.1.0.5")
        self.wait_server_running("10.1.0.5")
        for verb, header in (("list-vms", "VM IP"), ("list-nodes", "NODE"),
                             ("list-servers", "ALLOCATION"), ("list-events", "KIND")):
            res = self.ctl(verb, json_out=False)
            first = res.stdout.splitlines()[0] if res.stdout else ""
            self.assertIn(header, first, res.describe())
        nodes = self.ctl("list-nodes", json_out=False).stdout
        self.assertIn("n1", nodes)
        gpu_gib = str(self.node_list()["n1"]["gpus"][0]["memory_bytes"] // GiB)
        self.assertIn("/" + gpu_gib, nodes, "GPU memory is shown in GiB:\n" + nodes)
        events = self.events()
        limited = self.ctl_json("list-events", "--limit", 2)["events"]
        self.assertEqual([e["id"] for e in limited], [e["id"] for e in events[-2:]],
                         "--limit N gives the newest N events")
        # Flyt's original verb names.
        self.assertEqual([n["node_id"] for n in self.ctl_json("list-servernodes")["nodes"]],
                         [n["node_id"] for n in self.ctl_json("list-nodes")["nodes"]])
        a = self.ctl_json("list-virt-servers")["servers"]
        self.assertEqual([s["alloc_id"] for s in a], [s["alloc_id"] for s in self.servers()])
        # Help and usage errors.
        res = self.ctl("--help", json_out=False, check=False)
        self.assertEqual(res.rc, 0, res.describe())
        self.assertIn("list-vms", res.stdout)
        res = self.ctl("change-config", "--help", json_out=False, check=False)
        self.assertEqual(res.rc, 0, res.describe())
        self.assertIn("--memory", res.stdout)
        res = self.ctl("no-such-verb", json_out=False, check=False)
        self.assertEqual(res.rc, 2, res.describe())
        self.assertIn("unknown verb", res.stderr)

    def test_vm_commands(self):
        self.start_cluster_manager()
        self.add_vm("10.1.0.7", "10.0.0.3", 24, 3)
        vm = self.vms().get("10.1.0.7")
        self.assertIsNotNone(vm, "vm add did not show in list-vms")
        self.assertEqual((vm["host_ip"], vm["compute_units"], vm["memory_gb"]),
                         ("10.0.0.3", 24, 3), json.dumps(vm))
        self.assertTrue(mentions(self.ctl_json("show", "10.1.0.7"), "10.0.0.3"))
        self.ctl("vm", "remove", "10.1.0.7")
        self.assertNotIn("10.1.0.7", self.vms())
        res = self.ctl_fails("vm", "remove", "10.1.0.7", json_out=False)
        self.assertIn("10.1.0.7", res.stderr, res.describe())
        res = self.ctl_fails("show", "10.1.0.99", json_out=False)
        self.assertIn("10.1.0.99", res.stderr, res.describe())
        res = self.ctl_fails("allocate", "--vm", "10.1.0.99", json_out=False)
        self.assertIn("10.1.0.99", res.stderr, res.describe())

    def test_deallocate(self):
        self.basic_cluster()
        self.ctl("allocate", "--vm", "10.1.0.5")
        srv = self.wait_server_running("10.1.0.5")
        pids = self.server_pids("n1")
        self.assertEqual(len(pids), 1, self.logs())
        before = self.last_event_id()
        self.ctl("deallocate", "--vm", "10.1.0.5")
        self.wait_for("no server for 10.1.0.5 in list-servers",
                      lambda: self.server_of("10.1.0.5") is None)
        self.wait_for("flyt-server pid %d to exit" % pids[0], lambda: not pid_alive(pids[0]))
        self.assertIsNone(self.vms()["10.1.0.5"].get("allocation"))
        self.wait_event("the deallocation", before, srv["alloc_id"], "10.1.0.5")
        # Removing a VM stops its server.
        self.ctl("allocate", "--vm", "10.1.0.5")
        self.wait_server_running("10.1.0.5")
        pids = self.server_pids("n1")
        self.assertEqual(len(pids), 1, self.logs())
        self.ctl("vm", "remove", "10.1.0.5")
        self.assertIsNone(self.server_of("10.1.0.5"))
        self.wait_for("flyt-server pid %d to exit" % pids[0], lambda: not pid_alive(pids[0]))
        self.ctl_fails("deallocate", "--vm", "10.1.0.5", json_out=False)

    # =====================================================================================
    # Metrics.

    SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$')

    def metric(self, text, name, **labels):
        """Values of the samples of `name` whose labels include `labels`."""
        out = []
        for line in text.splitlines():
            m = self.SAMPLE_RE.match(line)
            if not m or m.group(1) != name:
                continue
            have = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                out.append(float(m.group(3)))
        return out

    def test_metrics_prometheus(self):
        cmgr = self.basic_cluster(sm=16, memory_gb=2)
        self.add_vm("10.1.0.6", "10.0.0.1", 8, 1)
        self.ctl("allocate", "--vm", "10.1.0.5")
        self.wait_server_running("10.1.0.5")
        # A real program's calls and bytes reach the tenant's counters (server report,
        # node manager heartbeat, cluster manager).
        self.run_ok(cmgr, self.memory_roundtrip())
        moved = self.wait_for(
            "the tenant's bytes in /metrics",
            lambda: (lambda t: t if self.metric(t, "flyt_tenant_received_bytes_total",
                                                vm="10.1.0.5") not in ([], [0.0]) else None)(
                self.scrape()))
        for name, least in (("flyt_tenant_received_bytes_total", 1 << 20),
                            ("flyt_tenant_sent_bytes_total", 1 << 20),
                            ("flyt_tenant_calls_total", 10)):
            value = self.metric(moved, name, vm="10.1.0.5")
            self.assertTrue(value and value[0] >= least, "%s: %s\n%s" % (name, value, moved))
        self.ctl_fails("allocate", "--vm", "10.9.9.9", json_out=False)  # unknown VM: an error
        text = self.scrape()
        for line in text.splitlines():  # every line is a comment or a well-formed sample
            self.assertTrue(line.startswith("# HELP ") or line.startswith("# TYPE ") or
                            self.SAMPLE_RE.match(line), "bad exposition line: %r" % line)
        self.assertEqual(self.metric(text, "flyt_node_up", node="n1"), [1.0], text)
        self.assertEqual(sorted(self.metric(text, "flyt_gpu_sms_promised", node="n1")), [0.0, 16.0],
                         text)
        self.assertEqual(self.metric(text, "flyt_tenant_memory_limit_bytes", vm="10.1.0.5"),
                         [2.0 * 2**30], text)
        self.assertEqual(self.metric(text, "flyt_tenant_sms", vm="10.1.0.5"), [16.0], text)
        self.assertEqual(self.metric(text, "flyt_tenant_sms", vm="10.1.0.6"), [], text)
        self.assertEqual(self.metric(text, "flyt_vms"), [2.0], text)
        self.assertEqual(self.metric(text, "flyt_events_total", kind="allocate"), [1.0], text)
        self.assertEqual(self.metric(text, "flyt_requests_total", verb="allocate",
                                     outcome="ok"), [1.0], text)
        self.assertEqual(len(self.metric(text, "flyt_requests_total", verb="allocate")), 2, text)
        # Two operator allocations (one refused) and the client manager's request.
        self.assertEqual(self.metric(text, "flyt_requests_total", verb="request-allocation",
                                     outcome="ok"), [1.0], text)
        self.assertEqual(self.metric(text, "flyt_allocation_request_seconds_count"), [3.0], text)
        self.assertEqual(self.metric(text, "flyt_allocation_request_seconds_bucket", le="+Inf"),
                         [3.0], text)

        # A real Prometheus scrapes it, and PromQL finds the tenant's memory.
        prometheus = shutil.which("prometheus")
        self.assertIsNotNone(prometheus, "Debian's prometheus package is not installed "
                             "(scripts/install-deps.sh installs it)")
        target = self.metrics_url()[len("http://"):-len("/metrics")]
        config = os.path.join(self.tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: flyt\n    static_configs:\n"
                    "      - targets: ['%s']\n" % target)
        port = free_tcp_port()
        prom = Daemon(self.tmp, "prometheus",
                      [prometheus, "--config.file=" + config,
                       "--storage.tsdb.path=" + os.path.join(self.tmp, "tsdb"),
                       "--web.listen-address=127.0.0.1:%d" % port], self.daemon_env())
        self.daemons.append(prom)
        prom.start()

        def query(q):
            url = "http://127.0.0.1:%d/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": q}))
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    doc = json.loads(r.read().decode())
            except OSError:
                return None
            return doc["data"]["result"] if doc.get("status") == "success" else None

        result = self.wait_for("Prometheus to scrape the cluster manager",
                               lambda: query('flyt_tenant_memory_limit_bytes{vm="10.1.0.5"}'),
                               timeout=60)
        self.assertEqual(float(result[0]["value"][1]), 2.0 * 2**30, result)
        self.assertEqual(result[0]["metric"].get("node"), "n1", result)
        up = self.wait_for("up{job=flyt} == 1", lambda: query('up{job="flyt"} == 1'), timeout=30)
        self.assertEqual(up[0]["value"][1], "1", up)

    def test_dashboard_chromium(self):
        """The dashboard (GET /) renders the cluster in headless Chromium: a few sim nodes,
        VMs and tenants; its JSON (/api/cluster) carries them; a screenshot is taken
        (kept in FLYT_SCREENSHOT_DIR when set)."""
        self.start_cluster_manager()
        self.start_node("n1", "10.0.0.1")
        self.start_node("n2", "10.0.0.2")
        self.add_vm("10.1.0.5", "10.0.0.1", 16, 2)
        self.add_vm("10.1.0.6", "10.0.0.2", 40, 8)
        self.add_vm("10.1.0.7", "10.0.0.1", 8, 1)
        for vm in ("10.1.0.5", "10.1.0.6"):
            self.ctl("allocate", "--vm", vm)
            self.wait_server_running(vm)
        base = self.metrics_url()[:-len("metrics")]
        with urllib.request.urlopen(base + "api/cluster", timeout=10) as r:
            doc = json.loads(r.read().decode())
        self.assertEqual(sorted(n["node_id"] for n in doc["nodes"]), ["n1", "n2"], doc)
        self.assertEqual(sorted(s["vm_ip"] for s in doc["servers"]), ["10.1.0.5", "10.1.0.6"], doc)
        self.assertEqual(len(doc["vms"]), 3, doc)
        self.assertTrue(any(e["kind"] == "allocate" for e in doc["events"]), doc)
        with urllib.request.urlopen(base, timeout=10) as r:
            self.assertIn("text/html", r.headers.get("Content-Type", ""))
            self.assertIn("<title>Flyt cluster</title>", r.read().decode())

        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        self.assertIsNotNone(chromium, "Debian's chromium package is not installed "
                             "(scripts/install-deps.sh installs it)")
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--user-data-dir=" + os.path.join(self.tmp, "chromium-profile"),
                 "--virtual-time-budget=8000", "--window-size=1280,1100"]
        res = subprocess.run([chromium] + flags + ["--dump-dom", base], capture_output=True,
                             text=True, timeout=120)
        dom = res.stdout
        self.assertIn('data-rendered="1"', dom, "the page's script did not render\n" + res.stderr[-3000:])
        for vm in ("10.1.0.5", "10.1.0.6"):
            self.assertIn('data-vm="%s"' % vm, dom)
        for node in ("n1", "n2"):
            self.assertIn('data-node="%s"' % node, dom)
        self.assertEqual(dom.count('data-gpu="GPU-'), 4, "one panel per GPU (two sim nodes of two)")
        self.assertIn("16 / 132 promised", dom)  # the tenant's SMs on its sim H200
        self.assertIn('<span id="error"></span>', dom, "the page reported an error")
        shot = os.path.join(os.environ.get("FLYT_SCREENSHOT_DIR") or self.tmp, "dashboard.png")
        res = subprocess.run([chromium] + flags + ["--screenshot=" + shot, base],
                             capture_output=True, text=True, timeout=120)
        self.assertTrue(os.path.exists(shot) and os.path.getsize(shot) > 20000,
                        "no screenshot\n" + res.stderr[-3000:])
        with open(shot, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def make_certificates(self):
        """A test CA with certificates for each daemon and flytctl, and a rogue CA's."""
        d = os.path.join(self.tmp, "tls")
        os.makedirs(d)

        def openssl(*args):
            res = subprocess.run(["openssl"] + list(args), cwd=d, capture_output=True, text=True)
            self.assertEqual(res.returncode, 0, res.stderr)

        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        for ca in ("ca", "rogue-ca"):
            openssl("req", "-x509", *ec, "-keyout", ca + ".key", "-out", ca + ".pem", "-days", "2",
                    "-subj", "/CN=flyt test " + ca)
        for name, ca in (("cm", "ca"), ("node", "ca"), ("ctl", "ca"), ("clm", "ca"),
                         ("rogue", "rogue-ca")):
            openssl("req", *ec, "-keyout", name + ".key", "-out", name + ".csr", "-subj",
                    "/CN=" + name)
            openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
                    "-CAcreateserial", "-out", name + ".pem", "-days", "2")
        return d

    def test_mutual_tls(self):
        """Every manager connection over mutual TLS (tls_ca, tls_cert, tls_key): node
        manager and cluster manager both ways, flytctl and the client manager; a flytctl
        with a certificate of another CA, or with no TLS, is refused with a clear message,
        and so is a node manager without TLS; the cluster manager names the refused peer."""
        d = self.make_certificates()
        env = {}
        for prefix, name in (("CM", "cm"), ("NM", "node"), ("CTL", "ctl"), ("CLM", "clm")):
            env["FLYT_%s_TLS_CA" % prefix] = os.path.join(d, "ca.pem")
            env["FLYT_%s_TLS_CERT" % prefix] = os.path.join(d, name + ".pem")
            env["FLYT_%s_TLS_KEY" % prefix] = os.path.join(d, name + ".key")
        self.env_for_all = env
        cmgr = self.basic_cluster(sm=16, memory_gb=2)  # node registration over TLS
        self.ctl("allocate", "--vm", "10.1.0.5")  # the cluster manager dials the node
        self.wait_server_running("10.1.0.5")
        res = self.run_ok(cmgr, self.memory_roundtrip())  # through the client manager
        self.assertIn("PASS", res.stdout, res.describe())

        rogue = {"FLYT_CTL_TLS_CERT": os.path.join(d, "rogue.pem"),
                 "FLYT_CTL_TLS_KEY": os.path.join(d, "rogue.key")}
        res = self.ctl_fails("list-nodes", json_out=False, env_extra=rogue)
        self.assertIn("TLS", res.stderr, res.describe())
        self.wait_for("the cluster manager to log the refused certificate",
                      lambda: re.search(r"refused .*TLS handshake.*certificate",
                                        self.cm.output()))
        plain = {"FLYT_CTL_TLS_CA": "", "FLYT_CTL_TLS_CERT": "", "FLYT_CTL_TLS_KEY": ""}
        res = self.ctl_fails("list-nodes", json_out=False, env_extra=plain)
        self.assertIn("set tls_ca, tls_cert and tls_key here too", res.stderr, res.describe())
        half = {"FLYT_CTL_TLS_CA": ""}
        res = self.ctl_fails("list-nodes", json_out=False, env_extra=half)
        self.assertIn("tls_cert/tls_key are set but tls_ca is not", res.stderr, res.describe())
        wrong_key = {"FLYT_CTL_TLS_KEY": os.path.join(d, "node.key")}
        res = self.ctl_fails("list-nodes", json_out=False, env_extra=wrong_key)
        self.assertIn("is not the key of tls_cert", res.stderr, res.describe())
        # A node manager without TLS does not get in.
        self.env_for_all = {k: v for k, v in env.items() if not k.startswith("FLYT_NM_")}
        self.start_node("n2", "10.0.0.2", wait=False)
        self.wait_for("the cluster manager to refuse the plain node manager",
                      lambda: self.cm.output().count("refused") >= 2)
        self.env_for_all = env
        nodes = {n["node_id"] for n in self.ctl_json("list-nodes")["nodes"]}
        self.assertEqual(nodes, {"n1"})

    # =====================================================================================
    # Placement.

    def test_placement_host_preference(self):
        # pack would put every tenant on one GPU; the host rule comes first.
        self.start_cluster_manager(policy="pack")
        self.start_node("n1", "10.0.0.1")
        self.start_node("n2", "10.0.0.2")
        self.add_vm("10.1.0.11", "10.0.0.2", 8, 1)
        self.add_vm("10.1.0.12", "10.0.0.1", 8, 1)
        self.add_vm("10.1.0.13", "10.0.0.2", 8, 1)
        for vm in ("10.1.0.11", "10.1.0.12", "10.1.0.13"):
            self.ctl("allocate", "--vm", vm)
        where = {vm: self.wait_server_running(vm)["node_id"]
                 for vm in ("10.1.0.11", "10.1.0.12", "10.1.0.13")}
        self.assertEqual(where, {"10.1.0.11": "n2", "10.1.0.12": "n1", "10.1.0.13": "n2"},
                         "a VM goes to the node on its own host\n" + json.dumps(self.servers()))
        self.assertEqual(len(self.server_pids("n2")), 2, self.logs())
        self.assertEqual(len(self.server_pids("n1")), 1, self.logs())

    def _place_two(self, policy):
        self.start_cluster_manager(policy=policy)
        self.start_node("n1", "10.0.0.1")  # two simulated GPUs
        # Hosts with no node: only the policy decides.
        self.add_vm("10.1.0.21", "10.0.9.9", 16, 2)
        self.add_vm("10.1.0.22", "10.0.9.9", 16, 2)
        self.ctl("allocate", "--vm", "10.1.0.21")
        a = self.wait_server_running("10.1.0.21")
        self.ctl("allocate", "--vm", "10.1.0.22")
        b = self.wait_server_running("10.1.0.22")
        gpus = {g["uuid"]: g for g in self.node_list()["n1"]["gpus"]}
        self.assertEqual(len(gpus), 2, "sim:2 gives two GPUs: %s" % json.dumps(gpus))
        return a, b, gpus

    def test_placement_spread(self):
        a, b, gpus = self._place_two("spread")
        self.assertNotEqual(a["gpu_uuid"], b["gpu_uuid"],
                            "spread puts the second tenant on the emptier GPU\n%s"
                            % json.dumps(self.servers()))
        self.wait_for("sm_used 16 on both GPUs",
                      lambda: sorted(g.get("sm_used") for g in
                                     self.node_list()["n1"]["gpus"]) == [16, 16])

    def test_placement_pack(self):
        a, b, gpus = self._place_two("pack")
        self.assertEqual(a["gpu_uuid"], b["gpu_uuid"],
                         "pack puts the second tenant on the fuller GPU\n%s"
                         % json.dumps(self.servers()))
        self.wait_for("sm_used 32 and 0 on the GPUs",
                      lambda: sorted(g.get("sm_used") for g in
                                     self.node_list()["n1"]["gpus"]) == [0, 32])

    def test_drain_node(self):
        self.start_cluster_manager(policy="spread")
        self.start_node("n1", "10.0.0.1")
        self.start_node("n2", "10.0.0.2")
        before = self.last_event_id()
        self.ctl("drain-node", "n1")
        self.wait_node_state("n1", NODE_DRAINING)
        self.wait_event("the drain", before, "n1")
        # Host preference says n1, but n1 takes nothing new.
        self.add_vm("10.1.0.31", "10.0.0.1", 8, 1)
        self.ctl("allocate", "--vm", "10.1.0.31")
        self.assertEqual(self.wait_server_running("10.1.0.31")["node_id"], "n2")
        self.ctl_fails("drain-node", "no-such-node", json_out=False)

    # =====================================================================================
    # VMs with several GPUs (issue 19): one flyt-server per GPU, placed together.

    def add_vm_gpus(self, vm_ip, host_ip, sm, memory_gb, gpus):
        self.ctl("vm", "add", "--vm", vm_ip, "--host", host_ip, "--sm", sm, "--memory",
                 memory_gb, "--gpus", gpus)

    def servers_of(self, vm_ip):
        """The VM's servers in ordinal order."""
        return sorted((s for s in self.servers() if s.get("vm_ip") == vm_ip),
                      key=lambda s: s.get("ordinal", 0))

    def run_direct(self, endpoint, token):
        """memory_roundtrip against one server, as a standalone client with the VM's token."""
        env = clean_env({"FLYT_SERVER": endpoint, "FLYT_TOKEN": token, "FLYT_LOG": "warn",
                         "FLYT_TIMEOUT_MS": CLIENT_TIMEOUT_MS,
                         "E2E_WATCHDOG_S": max(10, RUN_TIMEOUT_S - 20)})
        return run([binary("flyt"), "run", "--", self.memory_roundtrip()], env, RUN_TIMEOUT_S)

    def check_gpu_group(self, vm_ip, gpus, sm, memory_gb, expect_nodes):
        """Asks the VM's client manager like the client library does, then checks that the
        answer lists the VM's `gpus` servers in ordinal order, that each is a running
        flyt-server on the expected node (expect_nodes[i] for GPU i, None = any), on distinct
        GPUs, with the per-GPU share, reachable with the VM's one token. Returns the servers."""
        cmgr = self.start_client_manager(vm_ip)
        answer = self.ask_client_manager(cmgr).split()
        self.assertEqual(answer[0], "OK", "client manager answered %r\n%s" % (answer, self.logs()))
        endpoint_list, token = answer[1], answer[2]
        endpoints = endpoint_list.split(",")
        self.assertEqual(len(endpoints), gpus, "one address per GPU: %r" % endpoint_list)
        servers = self.servers_of(vm_ip)
        self.assertEqual(len(servers), gpus, json.dumps(servers))
        self.assertEqual([s["endpoint"] for s in servers], endpoints,
                         "the list is the servers' endpoints in ordinal order\n%s"
                         % json.dumps(servers))
        self.assertEqual([s["ordinal"] for s in servers], list(range(gpus)))
        self.assertEqual(len({s["gpu_uuid"] for s in servers}), gpus,
                         "each server has its own GPU\n%s" % json.dumps(servers))
        self.assertEqual(len({s["alloc_id"] for s in servers}), gpus)
        for s, node in zip(servers, expect_nodes):
            self.assertEqual(s["state"], "running", json.dumps(s))
            self.assertEqual(s["sm"], sm, json.dumps(s))
            self.assertEqual(s["memory_bytes"], memory_gb * GiB, json.dumps(s))
            if node is not None:
                self.assertEqual(s["node_id"], node, json.dumps(servers))
        # list-nodes accounts the share on each of those GPUs.
        used = {g["uuid"]: g.get("sm_used") for n in self.node_list().values()
                for g in n.get("gpus", [])}
        for s in servers:
            self.assertGreaterEqual(used.get(s["gpu_uuid"], 0), sm, json.dumps(used))
        # Every address is a live flyt-server that serves the VM's token.
        for endpoint in endpoints:
            self.assertTrue(endpoint.startswith("tcp://127.0.0.1:"), endpoint)
            self.assertTrue(tcp_open(int(endpoint.rsplit(":", 1)[1])), endpoint)
            res = self.run_direct(endpoint, token)
            if res.rc != 0 or "memory_roundtrip: PASS" not in res.stdout:
                self.fail_with("memory_roundtrip failed against %s of VM %s" % (endpoint, vm_ip),
                               res)
        # The VM's view joins the same list; a second ask gets the same servers.
        alloc = self.vms()[vm_ip].get("allocation") or {}
        self.assertEqual(alloc.get("endpoint"), endpoint_list, json.dumps(alloc))
        self.assertEqual(alloc.get("gpus"), gpus, json.dumps(alloc))
        again = self.ask_client_manager(cmgr).split()
        self.assertEqual(again[1:3], [endpoint_list, token])
        return servers

    def test_multi_gpu_one_node(self):
        self.start_cluster_manager(policy="spread")
        self.start_node("n1", "10.0.0.1")  # two GPUs
        self.start_node("n2", "10.0.0.2")  # two GPUs, not the VM's host
        self.add_vm_gpus("10.1.0.61", "10.0.0.1", 16, 2, 2)
        vm = self.vms()["10.1.0.61"]
        self.assertEqual(vm.get("gpus"), 2, json.dumps(vm))
        before = self.last_event_id()
        servers = self.check_gpu_group("10.1.0.61", 2, 16, 2, ["n1", "n1"])
        self.assertEqual(len(self.server_pids("n1")), 2, self.logs())
        self.assertEqual(len(self.server_pids("n2")), 0, self.logs())
        self.wait_event("the placement on one node", before, "2 GPUs on node n1")
        # The table shows the GPU count; flytctl allocate prints each GPU's server.
        table = self.ctl("list-vms", json_out=False).stdout
        self.assertIn("GPUS", table.splitlines()[0], table)
        res = self.ctl("allocate", "--vm", "10.1.0.61", json_out=False)
        for s in servers:
            self.assertIn(s["endpoint"], res.stdout, res.describe())
        # A resize applies to each GPU.
        self.ctl("change-config", "--vm", "10.1.0.61", "--sm", 32)
        self.wait_for("32 SMs on both servers",
                      lambda: [s["sm"] for s in self.servers_of("10.1.0.61")] == [32, 32])
        # Deallocating stops both servers.
        before = self.last_event_id()
        self.ctl("deallocate", "--vm", "10.1.0.61")
        self.wait_for("both flyt-servers gone", lambda: not self.server_pids())
        self.assertEqual(self.servers_of("10.1.0.61"), [])
        for s in servers:
            self.assertFalse(tcp_open(int(s["endpoint"].rsplit(":", 1)[1])), s["endpoint"])
        done = [e for e in self.events_after(before) if e.get("kind") == "deallocate"]
        self.assertEqual(sorted(e["subject"] for e in done), sorted(s["alloc_id"] for s in servers),
                         json.dumps(done))

    def test_multi_gpu_across_nodes(self):
        self.start_cluster_manager(policy="spread")
        self.start_node("n1", "10.0.0.1")
        self.start_node("n2", "10.0.0.2")
        sm_count, _ = self.gpu_capacity("n1")
        # One GPU of each node is taken whole: each node has one free GPU left.
        self.add_vm("10.1.0.71", "10.0.0.1", sm_count, 1)
        self.add_vm("10.1.0.72", "10.0.0.2", sm_count, 1)
        self.ctl("allocate", "--vm", "10.1.0.71")
        self.ctl("allocate", "--vm", "10.1.0.72")
        self.assertEqual(self.wait_server_running("10.1.0.71")["node_id"], "n1")
        self.assertEqual(self.wait_server_running("10.1.0.72")["node_id"], "n2")
        self.add_vm_gpus("10.1.0.73", "10.0.0.1", 16, 2, 2)
        before = self.last_event_id()
        servers = self.check_gpu_group("10.1.0.73", 2, 16, 2, [None, None])
        self.assertEqual(sorted(s["node_id"] for s in servers), ["n1", "n2"],
                         json.dumps(servers))
        # The VM's host first: GPU 0 is on n1.
        self.assertEqual(servers[0]["node_id"], "n1", json.dumps(servers))
        self.wait_event("the placement across nodes", before, "2 GPUs across nodes n1, n2")
        self.assertEqual(len(self.server_pids("n1")), 2, self.logs())
        self.assertEqual(len(self.server_pids("n2")), 2, self.logs())
        # Releasing the VM releases both nodes' servers, and only those.
        self.ctl("deallocate", "--vm", "10.1.0.73")
        self.wait_for("one flyt-server left per node",
                      lambda: len(self.server_pids("n1")) == 1 and
                      len(self.server_pids("n2")) == 1)
        self.assertEqual(self.servers_of("10.1.0.73"), [])
        for s in servers:
            self.assertFalse(tcp_open(int(s["endpoint"].rsplit(":", 1)[1])), s["endpoint"])

    # =====================================================================================
    # Moving a running VM (issue 16): flytctl migrate, drain-node, checkpoint, restore.

    MIGRATE_STEPS = 400
    MIGRATE_PAUSE_MS = 60

    def migrate_loop(self):
        return os.path.join(CFG.e2e_programs_dir, "migrate_loop")

    def undisturbed_steps(self, cmgr, steps=None):
        """migrate_loop's step lines from a run nobody touched (its checksums)."""
        steps = steps or self.MIGRATE_STEPS
        res = self.run_ok(cmgr, self.migrate_loop(), [steps, 0])
        lines = [l for l in res.stdout.splitlines() if l.startswith("step ")]
        self.assertEqual(len(lines), steps, res.describe())
        return lines

    def start_moving_loop(self, vm, steps=None):
        """VM `vm` on 10.0.0.1 with a client manager, the step lines of an undisturbed
        migrate_loop run, then the loop started on the VM's server and at step 5. Returns
        (client manager, expected lines, the VM's first server, the last event id before
        the loop, the running program)."""
        steps = steps or self.MIGRATE_STEPS
        self.add_vm(vm, "10.0.0.1", 8, 1)
        cmgr = self.start_client_manager(vm)
        expected = self.undisturbed_steps(cmgr, steps)
        first = self.wait_server_running(vm)
        before = self.last_event_id()
        prog = self.start_client(cmgr, self.migrate_loop(), [steps, self.MIGRATE_PAUSE_MS])
        prog.wait_line(r"^step 5 ")
        return cmgr, expected, first, before, prog

    def finish_and_compare(self, prog, expected, moves):
        """The moved program passes, prints what the undisturbed run printed, and its client
        log says its GPU state moved `moves` times."""
        res = prog.finish()
        lines = res.stdout.splitlines()
        if res.rc != 0 or not lines or lines[-1] != "migrate_loop: PASS":
            self.fail_with("migrate_loop failed while its VM moved", res)
        self.assertEqual([l for l in lines if l.startswith("step ")], expected, res.describe())
        self.assertEqual(res.log.count("now lives at flyt-server"), moves, tail(res.log))
        return res

    def test_migrate_running_vm(self):
        """A running program's VM moves n1 -> n2 with flytctl migrate, a migration to a node
        that died fails and leaves it where it is, drain-node moves it back to n1; the
        program never notices (same output as an undisturbed run), new processes are told
        the new server, old servers are gone, every decision is an event."""
        self.start_cluster_manager(policy="spread")
        # Servers with movable memory (server_movable_memory), as GPU nodes need for moves.
        self.start_node("n1", "10.0.0.1", movable=True)
        self.start_node("n2", "10.0.0.2", movable=True)
        self.start_node("n3", "10.0.0.3", movable=True)
        vm = "10.1.0.90"
        cmgr, expected, first, before, prog = self.start_moving_loop(vm)
        self.assertEqual(first["node_id"], "n1")
        # 1. flytctl migrate: the VM and its running process go to n2.
        res = self.ctl("migrate", "--vm", vm, "--to", "n2")
        self.assertEqual(res.json.get("sessions"), 1, res.describe())
        moved = self.wait_server_running(vm)
        self.assertEqual(moved["node_id"], "n2", json.dumps(moved))
        self.assertNotEqual(moved["alloc_id"], first["alloc_id"])
        self.assertEqual(moved["sm"], 8)
        self.assertEqual(moved["memory_bytes"], 1 * GiB)
        self.assertEqual(self.server_pids("n1"), [], "the old server is stopped\n" + self.logs())
        answer = self.ask_client_manager(cmgr).split()
        self.assertEqual(answer[:2], ["OK", moved["endpoint"]], answer)
        self.assertTrue(prog.alive(), prog.stdout())
        self.wait_event("the migration", before, "migrate-done")
        # n1's share is free again, n2's taken.
        used = {n: sum(g.get("sm_used", 0) for g in v["gpus"]) for n, v in
                self.node_list().items()}
        self.assertEqual((used["n1"], used["n2"]), (0, 8), used)
        # 2. A target that died: the move fails with the reason and the VM stays on n2.
        self.nodes["n3"].kill9()
        bad = self.ctl_fails("migrate", "--vm", vm, "--to", "n3", json_out=False)
        self.assertRegex(bad.stderr, r"n3", bad.describe())
        self.assertEqual(self.server_of(vm)["alloc_id"], moved["alloc_id"])
        self.wait_event("the failed migration", before, "migrate-failed", "is down")
        prog.wait_line(r"^step %d " % 60)
        # 3. drain-node n2 moves it away (to n1, the only node up that takes tenants).
        res = self.ctl("drain-node", "n2")
        self.assertEqual([m["vm_ip"] for m in res.json.get("moved", [])], [vm], res.describe())
        self.assertEqual(res.json.get("failed"), [], res.describe())
        drained = self.wait_server_running(vm)
        self.assertEqual(drained["node_id"], "n1", json.dumps(drained))
        self.assertEqual(self.server_pids("n2"), [], self.logs())
        self.wait_event("the drain", before, "drain-node-done")
        self.finish_and_compare(prog, expected, 2)
        kinds = [e["kind"] for e in self.events_after(before)]
        for k in ("migrate-asked", "migrate-done", "migrate-failed", "drain-node",
                  "drain-node-done"):
            self.assertIn(k, kinds, kinds)
        # A drain that keeps its tenants: nothing moves.
        res = self.ctl("drain-node", "n1", "--no-migrate")
        self.assertEqual(self.server_of(vm)["node_id"], "n1")
        table = self.ctl("list-events", json_out=False).stdout
        self.assertIn("migrate-done", table)

    def test_checkpoint_restore_vm(self):
        """flytctl checkpoint parks and writes the VM's running process (it waits), restore
        brings it back at the same server; a folder other than the recorded checkpoint is
        not restored on another node; --leave-running writes it while it runs; after a checkpoint, a deallocate (the
        server gone) and a kill -9 and restart of the cluster manager, restore starts a server
        at the same address and the process goes on there. Its output equals an undisturbed
        run's."""
        self.start_cluster_manager(policy="spread")
        self.start_node("n1", "10.0.0.1")
        self.start_node("n2", "10.0.0.2")
        vm = "10.1.0.91"
        cmgr, expected, server, before, prog = self.start_moving_loop(vm)
        ckpt = os.path.join(self.tmp, "ckpt-vm")
        res = self.ctl("checkpoint", "--vm", vm, "--to", ckpt)
        self.assertEqual(res.json.get("sessions"), 1, res.describe())
        files = os.listdir(os.path.join(ckpt, "gpu0"))
        self.assertEqual(len(files), 1, files)
        self.assertTrue(files[0].endswith(".flyt"), files)
        # Parked: no step is printed while it waits.
        steps_then = prog.stdout().count("\nstep ")
        time.sleep(1.0)
        self.assertEqual(prog.stdout().count("\nstep "), steps_then, prog.stdout()[-500:])
        self.assertTrue(prog.alive())
        self.wait_event("the checkpoint", before, "checkpoint")
        # A folder that is not the recorded checkpoint cannot go to another node.
        other = self.ctl_fails("restore", "--vm", vm, "--from", ckpt + "-other", "--node", "n2",
                               json_out=False)
        self.assertIn("not the one recorded", other.stderr, other.describe())
        res = self.ctl("restore", "--vm", vm)
        self.assertEqual(res.json.get("restored"), 1, res.describe())
        self.assertEqual(self.server_of(vm)["alloc_id"], server["alloc_id"])
        self.wait_event("the restore", before, "restore")
        # The spent file is set aside; the folder takes no second checkpoint.
        self.assertEqual(sorted(os.listdir(os.path.join(ckpt, "gpu0"))), [files[0] + ".restored"])
        prog.wait_line(r"^step %d " % 40)
        # With --leave-running the process goes on while it is written.
        ckpt2 = os.path.join(self.tmp, "ckpt-running")
        res = self.ctl("checkpoint", "--vm", vm, "--to", ckpt2, "--leave-running")
        self.assertEqual(res.json.get("sessions"), 1, res.describe())
        prog.wait_line(r"^step %d " % 60)
        # Checkpoint, then the server goes away (its GPU freed); restore starts a server
        # again at the same address with the VM's token, and the process goes on there.
        ckpt3 = os.path.join(self.tmp, "ckpt-gone")
        res = self.ctl("checkpoint", "--vm", vm, "--to", ckpt3)
        self.assertEqual(res.json.get("sessions"), 1, res.describe())
        self.ctl("deallocate", "--vm", vm)
        self.wait_for("the VM's server gone", lambda: not self.server_pids())
        self.assertIsNone(self.server_of(vm))
        # The cluster manager restarts meanwhile: the checkpoint's record is in the store.
        self.cm.kill9()
        self.start_cluster_manager()
        self.wait_node_state("n1", NODE_UP)
        res = self.ctl("restore", "--vm", vm)
        self.assertEqual(res.json.get("restored"), 1, res.describe())
        again = self.wait_server_running(vm)
        self.assertEqual(again["endpoint"], server["endpoint"], json.dumps(again))
        # The same allocation id: a client on the node's host waits at its shm:// address.
        self.assertEqual(again["alloc_id"], server["alloc_id"])
        self.wait_event("the servers started again", before, "restore-servers")
        self.finish_and_compare(prog, expected, 2)

    def test_restore_fixed_server_elsewhere(self):
        """A process given its server with FLYT_SERVER (and the VM's token), not through the
        client manager, is checkpointed with its VM and restored on another node: while it
        waits it asks the VM's client manager by that address, goes on at the new server,
        and prints what an undisturbed run printed."""
        self.start_cluster_manager(policy="spread")
        self.start_node("n1", "10.0.0.1")
        self.start_node("n2", "10.0.0.2")
        vm = "10.1.0.96"
        steps = 200
        self.add_vm(vm, "10.0.0.1", 8, 1)
        cmgr = self.start_client_manager(vm)
        expected = self.undisturbed_steps(cmgr, steps)
        first = self.wait_server_running(vm)
        answer = self.ask_client_manager(cmgr).split()
        self.assertEqual(answer[:2], ["OK", first["endpoint"]], answer)
        self.client_env = {"FLYT_SERVER": first["endpoint"], "FLYT_TOKEN": answer[2]}
        try:
            prog = self.start_client(cmgr, self.migrate_loop(), [steps, self.MIGRATE_PAUSE_MS])
        finally:
            del self.client_env
        prog.wait_line(r"^step 5 ")
        ckpt = os.path.join(self.tmp, "ckpt-fixed")
        res = self.ctl("checkpoint", "--vm", vm, "--to", ckpt)
        self.assertEqual(res.json.get("sessions"), 1, res.describe())
        res = self.ctl("restore", "--vm", vm, "--node", "n2")
        self.assertEqual(res.json.get("restored"), 1, res.describe())
        moved = self.wait_server_running(vm)
        self.assertEqual(moved["node_id"], "n2", json.dumps(moved))
        res = self.finish_and_compare(prog, expected, 1)
        self.assertIn("was restored at flyt-server %s" % moved["endpoint"], res.log, tail(res.log))

    def test_restore_on_another_node(self):
        """flytctl restore --vm IP --node NODE[/GPU] on another node than the checkpoint's:
        the files are shipped there through the node managers (a checkpoint larger than
        checkpoint_ship_max_bytes is refused, nothing changes and the process still waits),
        a new server restores them, the waiting process learns the new address from its
        client manager and goes on there; the old server is stopped, the source files are
        spent, the client manager answers the new endpoint, and the events say so. Its
        output equals an undisturbed run's."""
        self.start_cluster_manager(policy="spread")
        self.start_node("n1", "10.0.0.1")
        self.start_node("n2", "10.0.0.2")
        vm = "10.1.0.94"
        cmgr, expected, first, before, prog = self.start_moving_loop(vm)
        self.assertEqual(first["node_id"], "n1")
        ckpt = os.path.join(self.tmp, "ckpt-elsewhere")
        res = self.ctl("checkpoint", "--vm", vm, "--to", ckpt)
        self.assertEqual(res.json.get("sessions"), 1, res.describe())
        files = os.listdir(os.path.join(ckpt, "gpu0"))
        self.assertEqual(len(files), 1, files)
        # Unknown node, unknown GPU: refused with the reason, nothing changes.
        bad = self.ctl_fails("restore", "--vm", vm, "--node", "n9", json_out=False)
        self.assertIn("unknown node n9", bad.stderr, bad.describe())
        bad = self.ctl_fails("restore", "--vm", vm, "--node", "n2/7", json_out=False)
        self.assertIn("has no GPU '7'", bad.stderr, bad.describe())
        # Over the shipping limit (the cluster manager restarted with a tiny one): refused,
        # the VM's server stays on n1, the process still waits.
        self.cm.kill9()
        self.start_cluster_manager(extra=["--checkpoint-ship-max-bytes", "10"])
        self.wait_node_state("n1", NODE_UP)
        self.wait_node_state("n2", NODE_UP)
        big = self.ctl_fails("restore", "--vm", vm, "--node", "n2", json_out=False)
        self.assertIn("checkpoint_ship_max_bytes", big.stderr, big.describe())
        self.assertEqual(self.server_of(vm)["alloc_id"], first["alloc_id"])
        self.assertEqual(self.server_pids("n2"), [], self.logs())
        self.assertEqual(len(os.listdir(os.path.join(ckpt, "gpu0"))), 1)
        self.assertTrue(prog.alive(), prog.stdout()[-500:])
        self.wait_event("the refused restore", before, "checkpoint_ship_max_bytes")
        # With the usual limit it goes to n2's GPU 1.
        self.cm.kill9()
        self.start_cluster_manager()
        self.wait_node_state("n1", NODE_UP)
        self.wait_node_state("n2", NODE_UP)
        res = self.ctl("restore", "--vm", vm, "--node", "n2/1")
        self.assertEqual(res.json.get("restored"), 1, res.describe())
        self.assertEqual(res.json.get("node_id"), "n2", res.describe())
        self.assertGreater(res.json.get("shipped_bytes", 0), 0, res.describe())
        moved = self.wait_server_running(vm)
        self.assertEqual(moved["node_id"], "n2", json.dumps(moved))
        self.assertNotEqual(moved["endpoint"], first["endpoint"])
        gpu1 = [g["uuid"] for g in self.node_list()["n2"]["gpus"] if g.get("index") == 1]
        self.assertEqual([moved["gpu_uuid"]], gpu1, json.dumps(moved))
        self.wait_for("the old server on n1 stopped", lambda: self.server_pids("n1") == [])
        self.assertEqual(len(self.server_pids("n2")), 1, self.logs())
        answer = self.ask_client_manager(cmgr).split()
        self.assertEqual(answer[:2], ["OK", moved["endpoint"]], answer)
        # The source's file is spent; the copy on n2 is gone.
        self.assertEqual(sorted(os.listdir(os.path.join(ckpt, "gpu0"))),
                         [files[0] + ".restored"])
        self.assertEqual(os.listdir(os.path.join(self.nodes["n2"].run_dir, "incoming")), [])
        used = {n: sum(g.get("sm_used", 0) for g in v["gpus"]) for n, v in
                self.node_list().items()}
        self.assertEqual((used["n1"], used["n2"]), (0, 8), used)
        self.wait_event("the restore on n2", before, "restored on node n2")
        kinds = [e["kind"] for e in self.events_after(before)]
        for k in ("checkpoint", "restore-ship", "restore-failed", "restore"):
            self.assertIn(k, kinds, kinds)
        res = self.finish_and_compare(prog, expected, 1)
        self.assertIn("was restored at flyt-server " + moved["endpoint"], res.log, tail(res.log))

    def test_migrate_cluster_manager_crash(self):
        """The cluster manager dies (FLYT_TEST_CRASH_AT, as kill -9) in the middle of a move
        and is started again: a move whose session had arrived at the target is finished
        (the VM on the target, the old server stopped), one whose target had no session yet
        is rolled back (the target stopped, the VM where it was), and one that had switched
        but not stopped the old server stops it when its node reports; either way the
        process runs on exactly one server, no server is left over, shares add up, and the
        events (migrate-recovered, replaced-server-stopped) say what was decided. The program's output equals an undisturbed
        run's."""
        self.start_cluster_manager(policy="spread")
        self.start_node("n1", "10.0.0.1", movable=True)
        self.start_node("n2", "10.0.0.2", movable=True)
        vm = "10.1.0.95"
        steps = 2 * self.MIGRATE_STEPS  # long enough for three restarts of the manager
        cmgr, expected, first, before, prog = self.start_moving_loop(vm, steps)
        self.assertEqual(first["node_id"], "n1")

        def crash_during(point, to):
            self.cm.env = dict(self.cm.env, FLYT_TEST_CRASH_AT=point)
            self.cm.kill9()
            self.start_cluster_manager()
            self.ctl("migrate", "--vm", vm, "--to", to, check=False)
            self.wait_for("the cluster manager to die at " + point, lambda: not self.cm.alive())
            self.assertIn("FLYT_TEST_CRASH_AT=" + point, self.cm.output())
            self.cm.env = {k: v for k, v in self.cm.env.items() if k != "FLYT_TEST_CRASH_AT"}
            self.start_cluster_manager()

        def shares():
            return {n: sum(g.get("sm_used", 0) for g in v["gpus"]) for n, v in
                    self.node_list().items()}

        # 1. Dies after the session arrived on n2: the move is finished.
        crash_during("migrate-moved", "n2")
        self.wait_event("the finished move", before, "finished the move")
        moved = self.wait_server_running(vm, node_id="n2")
        self.assertNotEqual(moved["alloc_id"], first["alloc_id"])
        self.wait_for("the old server on n1 stopped", lambda: self.server_pids("n1") == [])
        self.assertEqual(len(self.server_pids("n2")), 1, self.logs())
        self.assertEqual(len(self.servers_of(vm)), 1, json.dumps(self.servers()))
        self.assertEqual(shares(), {"n1": 0, "n2": 8})
        answer = self.ask_client_manager(cmgr).split()
        self.assertEqual(answer[:2], ["OK", moved["endpoint"]], answer)
        prog.wait_line(r"^step %d " % 40)
        self.assertTrue(prog.alive(), prog.stdout()[-500:])
        # 2. Dies after the target started, before any session was asked to move: rolled
        # back, the target on n1 stopped.
        mark = self.last_event_id()
        crash_during("migrate-started", "n1")
        self.wait_event("the rolled-back move", mark, "rolled back")
        self.wait_for("the target on n1 stopped", lambda: self.server_pids("n1") == [])
        self.assertEqual(self.server_of(vm)["alloc_id"], moved["alloc_id"])
        self.assertEqual(len(self.servers_of(vm)), 1, json.dumps(self.servers()))
        self.assertEqual(len(self.server_pids("n2")), 1, self.logs())
        self.assertEqual(shares(), {"n1": 0, "n2": 8})
        # 3. Dies after the VM switched to n1, before the old server on n2 stopped: the VM
        # stays on n1 and the server on n2 is stopped when n2 reports it.
        mark = self.last_event_id()
        crash_during("migrate-switched", "n1")
        self.wait_event("the replaced server stopped", mark, "was to stop")
        back = self.wait_server_running(vm, node_id="n1")
        self.wait_for("the old server on n2 stopped", lambda: self.server_pids("n2") == [])
        self.assertEqual(len(self.server_pids("n1")), 1, self.logs())
        self.assertEqual(len(self.servers_of(vm)), 1, json.dumps(self.servers()))
        self.assertEqual(shares(), {"n1": 8, "n2": 0})
        answer = self.ask_client_manager(cmgr).split()
        self.assertEqual(answer[:2], ["OK", back["endpoint"]], answer)
        # The VM still moves normally afterwards.
        res = self.ctl("migrate", "--vm", vm, "--to", "n2")
        self.assertEqual(res.json.get("sessions"), 1, res.describe())
        kinds = [e["kind"] for e in self.events_after(before)]
        self.assertEqual(kinds.count("migrate-recovered"), 2, kinds)
        self.assertEqual(kinds.count("replaced-server-stopped"), 1, kinds)
        self.finish_and_compare(prog, expected, 3)

    def test_restore_cluster_manager_crash(self):
        """The cluster manager dies (FLYT_TEST_CRASH_AT, as kill -9) at each step of a
        restore on another node (flytctl restore --vm IP --node NODE) and is started again:
        before the waiting process may have been told the new address (restore-chosen,
        restore-started, restore-shipped) the restore is rolled back (the target server
        stopped, its share freed, the shipped copy dropped, the checkpoint's files intact,
        the VM's server where it was, the process still waiting); from then on
        (restore-told, restore-restored) it is finished (the files restored on the target if
        they were not, the VM on the target, the old server stopped, the source files spent,
        the copy dropped, the process resumed there through its client manager's LOCATE).
        Each decision is a restore-recovered event, no flyt-server is left over, shares add
        up, and the program's output equals an undisturbed run's."""
        self.start_cluster_manager(policy="spread")
        self.start_node("n1", "10.0.0.1")
        self.start_node("n2", "10.0.0.2")
        vm = "10.1.0.96"
        cmgr, expected, first, before, prog = self.start_moving_loop(vm)
        self.assertEqual(first["node_id"], "n1")
        ckpt = os.path.join(self.tmp, "ckpt-crash")
        res = self.ctl("checkpoint", "--vm", vm, "--to", ckpt)
        self.assertEqual(res.json.get("sessions"), 1, res.describe())
        files = os.listdir(os.path.join(ckpt, "gpu0"))
        self.assertEqual(len(files), 1, files)

        def crash_during(point, node):
            self.cm.env = dict(self.cm.env, FLYT_TEST_CRASH_AT=point)
            self.cm.kill9()
            self.start_cluster_manager()
            self.wait_node_state("n1", NODE_UP)
            self.wait_node_state("n2", NODE_UP)
            self.ctl("restore", "--vm", vm, "--node", node, check=False)
            self.wait_for("the cluster manager to die at " + point, lambda: not self.cm.alive())
            self.assertIn("FLYT_TEST_CRASH_AT=" + point, self.cm.output())
            self.cm.env = {k: v for k, v in self.cm.env.items() if k != "FLYT_TEST_CRASH_AT"}
            self.start_cluster_manager()

        def shares():
            return {n: sum(g.get("sm_used", 0) for g in v["gpus"]) for n, v in
                    self.node_list().items()}

        def incoming(node):
            path = os.path.join(self.nodes[node].run_dir, "incoming")
            return os.listdir(path) if os.path.isdir(path) else []

        # 1-3. Dies before the process may have heard of the target: rolled back.
        for point in ("restore-chosen", "restore-started", "restore-shipped"):
            mark = self.last_event_id()
            crash_during(point, "n2")
            self.wait_event("the rolled-back restore at " + point, mark, "restore-recovered",
                            "rolled back")
            self.wait_for("no server left on n2 after " + point,
                          lambda: self.server_pids("n2") == [])
            self.assertEqual(self.server_of(vm)["alloc_id"], first["alloc_id"], point)
            self.assertEqual(len(self.servers_of(vm)), 1, json.dumps(self.servers()))
            self.assertEqual(len(self.servers()), 1, json.dumps(self.servers()))
            self.assertEqual(len(self.server_pids("n1")), 1, self.logs())
            self.assertEqual(shares(), {"n1": 8, "n2": 0}, point)
            self.assertEqual(incoming("n2"), [], point)
            self.assertEqual(os.listdir(os.path.join(ckpt, "gpu0")), files, point)
            self.assertIn("checkpoint", self.vms()[vm], json.dumps(self.vms()[vm]))
            self.assertTrue(prog.alive(), prog.stdout()[-500:])
        # 4. Dies once the process may be told, before the target restored: finished (the
        # restarted manager has the target restore the shipped copy).
        mark = self.last_event_id()
        crash_during("restore-told", "n2")
        self.wait_event("the finished restore", mark, "restore-recovered", "finished the restore")
        moved = self.wait_server_running(vm, node_id="n2")
        self.assertNotEqual(moved["endpoint"], first["endpoint"])
        self.wait_for("the old server on n1 stopped", lambda: self.server_pids("n1") == [])
        self.assertEqual(len(self.server_pids("n2")), 1, self.logs())
        self.assertEqual(len(self.servers()), 1, json.dumps(self.servers()))
        self.assertEqual(shares(), {"n1": 0, "n2": 8})
        self.assertEqual(sorted(os.listdir(os.path.join(ckpt, "gpu0"))),
                         [files[0] + ".restored"])
        self.assertEqual(incoming("n2"), [])
        self.assertNotIn("checkpoint", self.vms()[vm], json.dumps(self.vms()[vm]))
        answer = self.ask_client_manager(cmgr).split()
        self.assertEqual(answer[:2], ["OK", moved["endpoint"]], answer)
        prog.wait_line(r"^step %d " % 40)
        # 5. A second checkpoint (on n2) restored on n1; dies after the target restored,
        # before the VM switched: finished.
        ckpt2 = os.path.join(self.tmp, "ckpt-crash-2")
        res = self.ctl("checkpoint", "--vm", vm, "--to", ckpt2)
        self.assertEqual(res.json.get("sessions"), 1, res.describe())
        files2 = os.listdir(os.path.join(ckpt2, "gpu0"))
        mark = self.last_event_id()
        crash_during("restore-restored", "n1")
        self.wait_event("the finished restore", mark, "restore-recovered", "finished the restore")
        back = self.wait_server_running(vm, node_id="n1")
        self.wait_for("the old server on n2 stopped", lambda: self.server_pids("n2") == [])
        self.assertEqual(len(self.server_pids("n1")), 1, self.logs())
        self.assertEqual(len(self.servers()), 1, json.dumps(self.servers()))
        self.assertEqual(shares(), {"n1": 8, "n2": 0})
        self.assertEqual(sorted(os.listdir(os.path.join(ckpt2, "gpu0"))),
                         [files2[0] + ".restored"])
        self.assertEqual(incoming("n1"), [])
        answer = self.ask_client_manager(cmgr).split()
        self.assertEqual(answer[:2], ["OK", back["endpoint"]], answer)
        kinds = [e["kind"] for e in self.events_after(before)]
        self.assertEqual(kinds.count("restore-recovered"), 5, kinds)
        res = self.finish_and_compare(prog, expected, 2)
        self.assertIn("was restored at flyt-server " + back["endpoint"], res.log, tail(res.log))

    def make_server_certificates(self):
        """A test CA with certificates for each daemon and flytctl; the nodes' names
        127.0.0.1 (their advertise_host), so that it serves as the servers' certificate."""
        d = os.path.join(self.tmp, "tls")
        os.makedirs(d)

        def openssl(*args):
            res = subprocess.run(["openssl"] + list(args), cwd=d, capture_output=True, text=True)
            self.assertEqual(res.returncode, 0, res.stderr)

        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
                "-subj", "/CN=flyt test ca")
        with open(os.path.join(d, "san.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for name in ("cm", "node", "ctl", "clm"):
            openssl("req", *ec, "-keyout", name + ".key", "-out", name + ".csr", "-subj",
                    "/CN=" + name)
            openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                    "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-extfile", "san.ext")
        return d

    def test_migrate_tls_servers(self):
        """Nodes with server_tls: a running VM's process moves n1 -> n2 between tls://
        servers (the worker dials the target over TLS, checked against the cluster's CA; the
        process resumes over TLS with its own FLYT_TLS_CA) and goes on with an undisturbed
        run's output; a target node without server_tls is refused with the reason and the VM
        stays where it is."""
        d = self.make_server_certificates()
        env = {}
        for prefix, name in (("CM", "cm"), ("NM", "node"), ("CTL", "ctl"), ("CLM", "clm")):
            env["FLYT_%s_TLS_CA" % prefix] = os.path.join(d, "ca.pem")
            env["FLYT_%s_TLS_CERT" % prefix] = os.path.join(d, name + ".pem")
            env["FLYT_%s_TLS_KEY" % prefix] = os.path.join(d, name + ".key")
        self.env_for_all = env
        # The process trusts the CA; FLYT_SHM=off keeps it on TLS (not shared memory).
        self.client_env = {"FLYT_TLS_CA": os.path.join(d, "ca.pem"), "FLYT_SHM": "off"}
        self.start_cluster_manager(policy="spread")
        tls = ["--server-tls", "true"]
        self.start_node("n1", "10.0.0.1", movable=True, extra=tls)
        self.start_node("n2", "10.0.0.2", movable=True, extra=tls)
        self.start_node("n3", "10.0.0.3", movable=True)
        vm = "10.1.0.96"
        cmgr, expected, first, before, prog = self.start_moving_loop(vm)
        self.assertEqual(first["node_id"], "n1")
        self.assertTrue(first["endpoint"].startswith("tls://"), json.dumps(first))
        res = self.ctl("migrate", "--vm", vm, "--to", "n2")
        self.assertEqual(res.json.get("sessions"), 1, res.describe())
        moved = self.wait_server_running(vm)
        self.assertEqual(moved["node_id"], "n2", json.dumps(moved))
        self.assertTrue(moved["endpoint"].startswith("tls://"), json.dumps(moved))
        self.assertEqual(self.server_pids("n1"), [], self.logs())
        self.wait_event("the migration", before, "migrate-done")
        prog.wait_line(r"^step %d " % 40)
        # n3 serves tcp://: a process that talks TLS does not move there.
        bad = self.ctl_fails("migrate", "--vm", vm, "--to", "n3", json_out=False)
        self.assertIn("same kind", bad.stderr, bad.describe())
        self.assertEqual(self.server_of(vm)["alloc_id"], moved["alloc_id"])
        self.assertEqual(self.server_pids("n3"), [], self.logs())
        res = self.finish_and_compare(prog, expected, 1)
        self.assertIn("now lives at flyt-server " + moved["endpoint"], res.log, tail(res.log))

    def test_migrate_multi_gpu_vm_running(self):
        """A process of a VM with two GPUs that uses both (migrate_loop two-servers through
        the client manager's list: its loop on GPU 1, a mirror on GPU 0 copied server to
        server every step) keeps running while flytctl migrate moves the VM n1 -> n2: each
        server's part moves with its server, and the output equals an undisturbed run's."""
        self.start_cluster_manager(policy="spread")
        self.start_node("n1", "10.0.0.1")
        self.start_node("n2", "10.0.0.2")
        vm = "10.1.0.97"
        self.add_vm_gpus(vm, "10.0.0.1", 16, 2, 2)
        cmgr = self.start_client_manager(vm)
        steps = 120
        args = [steps, 0, 0, "two-servers"]
        base = self.run_ok(cmgr, self.migrate_loop(), args)
        expected = [l for l in base.stdout.splitlines() if l.startswith("step ")]
        self.assertEqual(len(expected), steps, base.describe())
        args[1] = self.MIGRATE_PAUSE_MS
        prog = self.start_client(cmgr, self.migrate_loop(), args)
        prog.wait_line(r"^step 5 ")
        res = self.ctl("migrate", "--vm", vm, "--to", "n2")
        self.assertEqual(len(res.json.get("moved", [])), 2, res.describe())
        after = self.servers_of(vm)
        self.assertEqual([s["node_id"] for s in after], ["n2", "n2"], json.dumps(after))
        self.assertEqual(self.server_pids("n1"), [], self.logs())
        self.finish_and_compare(prog, expected, 2)

    def test_migrate_multi_gpu_vm(self):
        """A VM with two GPUs on n1 moves to n2 with one flytctl migrate: both servers, in
        their ordinals, with the VM's share and token; the client manager answers the new
        list; the old servers are gone; migrate-auto then has nothing better to do."""
        self.start_cluster_manager(policy="spread")
        self.start_node("n1", "10.0.0.1")
        self.start_node("n2", "10.0.0.2")
        vm = "10.1.0.92"
        self.add_vm_gpus(vm, "10.0.0.1", 16, 2, 2)
        cmgr = self.start_client_manager(vm)
        answer = self.ask_client_manager(cmgr).split()
        self.assertEqual(answer[0], "OK", answer)
        token = answer[2]
        before = self.servers_of(vm)
        self.assertEqual([s["node_id"] for s in before], ["n1", "n1"], json.dumps(before))
        # One GPU of a VM with two: refused with the reason, nothing moves.
        bad = self.ctl_fails("migrate", "--vm", vm, "--to", "n2/0", json_out=False)
        self.assertIn("give a node, not one GPU", bad.stderr, bad.describe())
        res = self.ctl("migrate", "--vm", vm, "--to", "n2")
        self.assertEqual(len(res.json.get("moved", [])), 2, res.describe())
        after = self.servers_of(vm)
        self.assertEqual([s["node_id"] for s in after], ["n2", "n2"], json.dumps(after))
        self.assertEqual([s["ordinal"] for s in after], [0, 1])
        self.assertEqual([s["sm"] for s in after], [16, 16])
        self.assertEqual(len({s["gpu_uuid"] for s in after}), 2)
        self.assertEqual(self.server_pids("n1"), [], self.logs())
        self.assertEqual(len(self.server_pids("n2")), 2, self.logs())
        again = self.ask_client_manager(cmgr).split()
        self.assertEqual(again, ["OK", ",".join(s["endpoint"] for s in after), token])
        for s in after:
            r = self.run_direct(s["endpoint"], token)
            if r.rc != 0 or "memory_roundtrip: PASS" not in r.stdout:
                self.fail_with("memory_roundtrip failed against the moved server", r)
        done = [e for e in self.events() if e["kind"] == "migrate-done"]
        self.assertEqual(len(done), 1, json.dumps(done))
        self.assertIn("2 GPUs on node n2", done[0]["detail"])
        res = self.ctl("migrate-auto", "--dry-run")
        self.assertIn("moved", res.json, res.describe())
        # The text form: where each GPU went and what new processes are told.
        res = self.ctl("migrate", "--vm", vm, "--to", "n1", json_out=False)
        self.assertIn("VM %s moved" % vm, res.stdout, res.describe())
        back = self.servers_of(vm)
        self.assertEqual([s["node_id"] for s in back], ["n1", "n1"], json.dumps(back))
        for s in back:
            self.assertIn("-> node n1, GPU %s at %s" % (s["gpu_uuid"], s["endpoint"]), res.stdout)
        self.assertIn(",".join(s["endpoint"] for s in back), res.stdout)
        res = self.ctl("migrate", "--help", json_out=False)
        self.assertIn("--to NODE[/GPU]", res.stdout)
        self.assertEqual(self.ctl("migrate", "--vm", vm, check=False).rc, 2, "no --to: usage")

    def test_migrate_auto_rebalance(self):
        """With rebalance_interval_ms the cluster manager moves a VM off the most loaded node
        by itself when that lowers the peak, and records the decision; flytctl migrate-auto
        then finds nothing better and says why."""
        self.start_cluster_manager(policy="spread", extra=["--rebalance-interval-ms", "300"])
        self.start_node("n1", "10.0.0.1")
        self.start_node("n2", "10.0.0.2")
        before = self.last_event_id()
        self.add_vm("10.1.0.93", "10.0.0.1", 64, 1)
        self.add_vm("10.1.0.94", "10.0.0.1", 32, 1)
        self.ctl("allocate", "--vm", "10.1.0.93")
        self.ctl("allocate", "--vm", "10.1.0.94")
        # Both went to their host n1 (96 of its 264 SMs); moving the 64-SM VM leaves a
        # peak of 64, moving the other one 64 too but on n1: the first found is taken.
        self.wait_event("the automatic move", before, "[rebalance]")
        moved = self.wait_server_running("10.1.0.93", node_id="n2")
        self.assertEqual(self.server_of("10.1.0.94")["node_id"], "n1")
        decisions = [e for e in self.events_after(before) if e["kind"] == "rebalance"]
        self.assertTrue(decisions, json.dumps(self.events_after(before)))
        self.assertIn("from node n1", decisions[0]["detail"], json.dumps(decisions))
        self.assertEqual(len(self.server_pids("n2")), 1, self.logs())
        res = self.ctl("migrate-auto", json_out=False)
        self.assertIn("nothing to move", res.stdout, res.describe())
        self.assertEqual(self.server_of("10.1.0.93")["alloc_id"], moved["alloc_id"])

    def test_multi_gpu_refused(self):
        self.start_cluster_manager(policy="spread")
        self.start_node("n1", "10.0.0.1")  # two GPUs
        sm_count, _ = self.gpu_capacity("n1")
        self.add_vm("10.1.0.81", "10.0.0.1", sm_count // 2 + 1, 1)
        self.ctl("allocate", "--vm", "10.1.0.81")
        self.wait_server_running("10.1.0.81")
        # Two GPUs with more than half of each: only one GPU can take that.
        self.add_vm_gpus("10.1.0.82", "10.0.0.1", sm_count // 2 + 1, 1, 2)
        before = self.last_event_id()
        res = self.ctl_fails("allocate", "--vm", "10.1.0.82", json_out=False)
        self.assertIn("only 1 of the 2 GPUs", res.stderr, res.describe())
        self.assertIn("all its GPUs or none", res.stderr, res.describe())
        self.assertIn("--gpus", res.stderr, "the message says what to do\n" + res.describe())
        res = self.ctl("allocate", "--vm", "10.1.0.82", check=False)
        self.assertEqual((res.json or {}).get("code"), "no_capacity", res.describe())
        # The client library's path gets the reason too, and nothing was started.
        cmgr = self.start_client_manager("10.1.0.82")
        answer = self.ask_client_manager(cmgr)
        self.assertTrue(answer.startswith("ERR "), answer)
        self.assertIn("2 GPUs", answer)
        self.assertEqual(self.servers_of("10.1.0.82"), [])
        self.assertEqual(len(self.server_pids()), 1, self.logs())
        refused = [e for e in self.events_after(before) if e.get("kind") == "allocation-refused"]
        self.assertTrue(refused, json.dumps(self.events_after(before)))
        self.assertEqual(refused[0]["subject"], "10.1.0.82")
        self.assertIn("all its GPUs or none", refused[0]["detail"])
        used = sorted(g.get("sm_used") for g in self.node_list()["n1"]["gpus"])
        self.assertEqual(used, [0, sm_count // 2 + 1], "no share was reserved for the refused VM")
        # A bad count is refused by flytctl itself.
        res = self.ctl("vm", "add", "--vm", "10.1.0.83", "--host", "10.0.0.1", "--sm", 8,
                       "--memory", 1, "--gpus", 0, json_out=False, check=False)
        self.assertEqual(res.rc, 2, res.describe())
        self.assertIn("--gpus", res.stderr, res.describe())

    # =====================================================================================
    # Refusals.

    def test_refusal_no_capacity_flytctl(self):
        self.start_cluster_manager()
        self.start_node("n1", "10.0.0.1")  # two GPUs
        sm_count, memory = self.gpu_capacity("n1")
        big = sm_count // 2 + 1  # two of these never share a GPU
        for i, vm in enumerate(("10.1.0.41", "10.1.0.42", "10.1.0.43")):
            self.add_vm(vm, "10.0.0.1", big, 1)
        self.ctl("allocate", "--vm", "10.1.0.41")
        self.ctl("allocate", "--vm", "10.1.0.42")
        res = self.ctl_fails("allocate", "--vm", "10.1.0.43", json_out=False)
        self.assertNotIn(UNREACHABLE_TEXT, res.stderr, res.describe())
        self.assertIn(str(big), res.stderr,
                      "the refusal says what was asked (%d SMs)\n%s" % (big, res.describe()))
        self.assertIn("SM", res.stderr, res.describe())
        self.assertIsNone(self.server_of("10.1.0.43"))
        self.assertEqual(len(self.server_pids()), 2, self.logs())
        # --json: the manager's answer with its code.
        res = self.ctl("allocate", "--vm", "10.1.0.43", check=False)
        self.assertEqual(res.rc, 1, res.describe())
        self.assertIsNotNone(res.json, "--json prints the failed answer too\n" + res.describe())
        self.assertEqual(res.json.get("code"), "no_capacity", res.describe())
        # More memory than any GPU has.
        self.add_vm("10.1.0.44", "10.0.0.1", 1, memory // GiB + 1)
        res = self.ctl_fails("allocate", "--vm", "10.1.0.44", json_out=False)
        self.assertIn("GiB", res.stderr, res.describe())

    def test_refusal_client_library(self):
        self.start_cluster_manager()
        self.start_node("n1", "10.0.0.1")
        sm_count, _ = self.gpu_capacity("n1")
        self.add_vm("10.1.0.51", "10.0.0.1", sm_count + 1, 1)  # fits no GPU
        refusal = self.ctl_fails("allocate", "--vm", "10.1.0.51", json_out=False)
        manager_message = refusal.stderr.strip().splitlines()[0]
        if manager_message.startswith("flytctl: "):
            manager_message = manager_message[len("flytctl: "):]
        cmgr = self.start_client_manager("10.1.0.51")
        res = self.run_client(cmgr, self.quota_probe(), ["info"])
        if res.rc is None:
            self.fail_with("the program hung instead of failing", res)
        if res.rc == 0:
            self.fail_with("the program ran although its VM cannot be placed", res)
        said = res.stderr + res.stdout + res.log
        self.assertIn(manager_message, said,
                      "the client tells the manager's reason\n" + res.describe())
        # A VM the manager does not know.
        other = self.start_client_manager("10.1.0.52")
        res = self.run_client(other, self.quota_probe(), ["info"])
        if res.rc is None or res.rc == 0:
            self.fail_with("a client of an unknown VM must fail, not %s" % describe_rc(res.rc),
                           res)
        self.assertIn("10.1.0.52", res.stderr + res.stdout + res.log, res.describe())
        self.assertEqual(self.server_pids(), [], self.logs())

    # =====================================================================================
    # Quota and live changes.

    def test_memory_quota(self):
        cmgr = self.basic_cluster(sm=8, memory_gb=1)
        res = self.run_ok(cmgr, self.quota_probe(),
                          ["alloc:600", "alloc:600", "free", "alloc:900", "alloc:200", "free",
                           "alloc:1100"])
        lines = [l for l in res.stdout.splitlines() if l.startswith("alloc ")]
        self.assertEqual(lines, ["alloc 600 ok", "alloc 600 oom", "alloc 900 ok",
                                 "alloc 200 oom", "alloc 1100 oom"],
                         "a 1 GiB share: allocations beyond it get out-of-memory\n"
                         + res.describe())
        srv = self.wait_server_running("10.1.0.5")
        self.assertEqual(srv.get("memory_bytes"), GiB, json.dumps(srv))

    def test_change_config_live(self):
        cmgr = self.basic_cluster(sm=16, memory_gb=1)
        self.ctl("allocate", "--vm", "10.1.0.5")
        srv = self.wait_server_running("10.1.0.5", sm=16, memory_bytes=GiB)
        pids = self.server_pids("n1")
        before = self.last_event_id()

        ans = self.ctl_json("change-config", "--vm", "10.1.0.5", "--sm", 32, "--memory", 2)
        self.assertEqual(ans.get("applied"), "live", json.dumps(ans))
        self.assertEqual((ans.get("sm"), ans.get("memory_bytes")), (32, 2 * GiB),
                         json.dumps(ans))
        self.wait_server_running("10.1.0.5", sm=32, memory_bytes=2 * GiB)
        self.wait_event("the change of config", before, "10.1.0.5", srv["alloc_id"])
        self.assertEqual(self.server_pids("n1"), pids, "applied live: the same process")
        # The application sees the new quota: 1.5 GiB fits now.
        res = self.run_ok(cmgr, self.quota_probe(), ["alloc:1536", "alloc:1024"])
        self.assertIn("alloc 1536 ok", res.stdout, res.describe())
        self.assertIn("alloc 1024 oom", res.stdout, res.describe())

        # Live while an application runs: it holds 768 MiB of a 2 GiB share; the share drops
        # to 1 GiB, so its next 768 MiB is refused; back to 2 GiB and it fits.
        ready = os.path.join(self.tmp, "ready")
        go1 = os.path.join(self.tmp, "go1")
        go2 = os.path.join(self.tmp, "go2")
        done1 = os.path.join(self.tmp, "done1")
        app = self.start_client(cmgr, self.quota_probe(),
                                ["alloc:768", "touch:" + ready, "wait:" + go1, "alloc:768",
                                 "touch:" + done1, "wait:" + go2, "alloc:768"])
        self.wait_for("the application to hold 768 MiB", lambda: os.path.exists(ready),
                      timeout=RUN_TIMEOUT_S)
        busy = self.wait_for("list-servers to show the application's session",
                             lambda: (lambda s: s if s and s.get("sessions", 0) >= 1 else None)(
                                 self.server_of("10.1.0.5")))
        self.assertGreaterEqual(busy.get("memory_used", 0), 768 * MiB, json.dumps(busy))
        ans = self.ctl_json("change-config", "--vm", "10.1.0.5", "--memory", 1)
        self.assertEqual(ans.get("applied"), "live", json.dumps(ans))
        open(go1, "w").close()
        self.wait_for("the application's second allocation", lambda: os.path.exists(done1),
                      timeout=RUN_TIMEOUT_S)
        self.ctl("change-config", "--vm", "10.1.0.5", "--memory", 2)
        open(go2, "w").close()
        res = app.finish()
        allocs = [l for l in res.stdout.splitlines() if l.startswith("alloc ")]
        if res.rc != 0 or allocs != ["alloc 768 ok", "alloc 768 oom", "alloc 768 ok"]:
            self.fail_with("a running application sees its share change live: expected "
                           "ok/oom/ok", res)

        ans = self.ctl_json("inc-resources", "--vm", "10.1.0.5", "--sm", 8)
        self.assertEqual(ans.get("sm"), 40, json.dumps(ans))
        self.wait_server_running("10.1.0.5", sm=40, memory_bytes=2 * GiB)
        ans = self.ctl_json("dec-resources", "--vm", "10.1.0.5", "--memory", 1)
        self.assertEqual(ans.get("memory_bytes"), GiB, json.dumps(ans))
        self.wait_server_running("10.1.0.5", sm=40, memory_bytes=GiB)
        self.assertEqual(self.vms()["10.1.0.5"]["compute_units"], 40)
        table = self.ctl("change-config", "--vm", "10.1.0.5", "--sm", 24, json_out=False)
        self.assertIn("live", table.stdout, table.describe())

        # Growth beyond the GPU is refused and changes nothing.
        sm_count, _ = self.gpu_capacity("n1")
        res = self.ctl_fails("inc-resources", "--vm", "10.1.0.5", "--sm", sm_count,
                             json_out=False)
        self.assertNotIn(UNREACHABLE_TEXT, res.stderr)
        self.assertEqual(self.server_of("10.1.0.5").get("sm"), 24)
        # Unknown VM.
        res = self.ctl_fails("change-config", "--vm", "10.1.0.99", "--sm", 8, json_out=False)
        self.assertIn("10.1.0.99", res.stderr, res.describe())
        # A VM without a server: stored for its next allocation.
        self.add_vm("10.1.0.6", "10.0.0.1", 8, 1)
        ans = self.ctl_json("change-config", "--vm", "10.1.0.6", "--memory", 3)
        self.assertEqual(ans.get("applied"), "stored", json.dumps(ans))
        self.assertEqual(self.vms()["10.1.0.6"]["memory_gb"], 3)

    # =====================================================================================
    # Idle servers.

    def test_auto_deallocation(self):
        cmgr = self.basic_cluster(idle_grace_ms=1500)
        # A session open for longer than the grace period keeps its server.
        self.run_ok(cmgr, self.quota_probe(), ["alloc:1", "sleep:4000", "alloc:1"])
        srv = self.wait_server_running("10.1.0.5")
        pids = self.server_pids("n1")
        self.assertEqual(len(pids), 1, self.logs())
        self.wait_for("the idle server of 10.1.0.5 to be freed",
                      lambda: self.server_of("10.1.0.5") is None, timeout=DEALLOC_S)
        self.wait_for("its flyt-server (pid %d) to exit" % pids[0],
                      lambda: not pid_alive(pids[0]))
        self.assertIsNone(self.vms()["10.1.0.5"].get("allocation"))
        self.wait_event("the idle deallocation", 0, srv["alloc_id"])
        # The next client gets a new server.
        self.run_ok(cmgr, self.quota_probe(), ["alloc:1"])
        self.assertNotEqual(self.wait_server_running("10.1.0.5")["alloc_id"], srv["alloc_id"])

    def test_auto_deallocation_off(self):
        cmgr = self.basic_cluster(idle_grace_ms=0)
        self.run_ok(cmgr, self.quota_probe(), ["alloc:1"])
        srv = self.wait_server_running("10.1.0.5")
        pids = self.server_pids("n1")
        # Wait until the server itself reports a long idle time (several heartbeats and far
        # beyond any automatic grace period used here); it must still be allocated.
        self.wait_for("the server to report idle_ms >= 4000",
                      lambda: (self.server_of("10.1.0.5") or {}).get("idle_ms", 0) >= 4000,
                      timeout=DEALLOC_S)
        still = self.server_of("10.1.0.5")
        self.assertIsNotNone(still, "idle-grace-ms 0 switches auto-deallocation off\n"
                             + self.logs())
        self.assertEqual(still["alloc_id"], srv["alloc_id"])
        self.assertTrue(all(pid_alive(p) for p in pids), self.logs())

    # =====================================================================================
    # Failures of the daemons.

    def test_cluster_manager_restart(self):
        cmgr = self.basic_cluster()
        self.add_vm("10.1.0.8", "10.0.0.1", 8, 1)
        self.run_ok(cmgr, self.quota_probe(), ["alloc:8"])
        srv = self.wait_server_running("10.1.0.5")
        first = self.ask_client_manager(cmgr)
        self.assertTrue(first.startswith("OK "), "client manager said %r\n%s" % (first,
                                                                                self.logs()))
        vms_before = self.vms()
        pids = self.server_pids("n1")

        self.cm.kill9()
        # While it is down: flytctl says so clearly.
        res = self.ctl_fails("list-vms", json_out=False)
        self.assertIn(UNREACHABLE_TEXT, res.stderr, res.describe())
        self.start_cluster_manager()

        vms_after = self.vms()
        self.assertEqual(sorted(vms_after), sorted(vms_before))
        for ip in vms_before:
            for k in ("host_ip", "compute_units", "memory_gb"):
                self.assertEqual(vms_after[ip].get(k), vms_before[ip].get(k), ip)
        self.wait_node_state("n1", NODE_UP)
        again = self.wait_server_running("10.1.0.5")
        for k in ("alloc_id", "endpoint", "gpu_uuid", "node_id", "sm", "memory_bytes"):
            self.assertEqual(again.get(k), srv.get(k), "%s after the restart\nbefore %s\n"
                             "after %s" % (k, json.dumps(srv), json.dumps(again)))
        self.assertEqual(self.server_pids("n1"), pids, "the same flyt-server processes")
        # A new client reaches the same server, through the same client manager.
        second = self.wait_for("the client manager to answer OK after the restart",
                               lambda: (lambda a: a if a.startswith("OK ") else None)(
                                   self.ask_client_manager(cmgr)))
        self.assertEqual(second.split()[1], first.split()[1], "the same endpoint")
        self.run_ok(cmgr, self.quota_probe(), ["alloc:8"])
        self.assertEqual(self.server_of("10.1.0.5")["alloc_id"], srv["alloc_id"])
        # The restarted manager still places new work.
        self.ctl("allocate", "--vm", "10.1.0.8")
        self.wait_server_running("10.1.0.8")

    def test_node_manager_death(self):
        self.start_cluster_manager()
        self.start_node("n1", "10.0.0.1")
        self.start_node("n2", "10.0.0.2")
        self.add_vm("10.1.0.60", "10.0.0.1", 8, 1)
        cmgr = self.start_client_manager("10.1.0.60")
        self.run_ok(cmgr, self.quota_probe(), ["alloc:8"])
        first = self.wait_server_running("10.1.0.60")
        self.assertEqual(first["node_id"], "n1")
        before = self.last_event_id()
        self.nodes["n1"].kill9()
        down = self.wait_node_state("n1", NODE_DOWN)
        self.assertIn(self.node_list()["n2"]["state"], NODE_UP)
        self.wait_event("node n1 going down", before, "n1")
        table = self.ctl("list-nodes", json_out=False)
        self.assertIn(down["state"], table.stdout, table.describe())
        # New work avoids the dead node, even when the VM's host is n1's.
        self.add_vm("10.1.0.61", "10.0.0.1", 8, 1)
        self.ctl("allocate", "--vm", "10.1.0.61")
        self.assertEqual(self.wait_server_running("10.1.0.61")["node_id"], "n2")
        # The tenant whose node died is placed again when its next client asks.
        self.assertNotEqual((self.server_of("10.1.0.60") or {}).get("state"), "running",
                            json.dumps(self.servers()))
        self.run_ok(cmgr, self.quota_probe(), ["alloc:8"])
        moved = self.wait_server_running("10.1.0.60")
        self.assertEqual(moved["node_id"], "n2", json.dumps(moved))
        self.assertNotEqual(moved["alloc_id"], first["alloc_id"])

    def test_node_manager_restart(self):
        """kill -9 of a node manager that runs a server; once the node is down, the same
        node manager again (same node id and run directory): the node is up again, the VM's
        clients work, and no flyt-server runs that the cluster does not account for."""
        cmgr = self.basic_cluster()
        self.run_ok(cmgr, self.quota_probe(), ["alloc:8"])
        first = self.wait_server_running("10.1.0.5")
        self.assertEqual(len(self.server_pids("n1")), 1, self.logs())
        self.nodes["n1"].kill9()
        self.wait_node_state("n1", NODE_DOWN)
        self.start_node("n1", "10.0.0.1", wait=False)
        self.wait_node_state("n1", NODE_UP, timeout=START_S)
        self.run_ok(cmgr, self.quota_probe(), ["alloc:8"])
        now = self.wait_server_running("10.1.0.5")

        def consistent():
            # Every flyt-server of n1 is one the cluster knows, and vice versa.
            known = [s for s in self.servers() if s.get("node_id") == "n1"]
            pids = self.server_pids("n1")
            if len(known) != len(pids):
                return None
            reported = sorted(s.get("pid") for s in known if "pid" in s)
            return (known, pids) if not reported or reported == pids else None
        known, pids = self.wait_for("the flyt-servers of n1 and list-servers to agree",
                                    consistent)
        self.assertEqual(len(pids), 1, "one server for the one VM: %s\n%s"
                         % (json.dumps(known), self.logs()))
        if now["alloc_id"] == first["alloc_id"]:
            self.assertEqual(now["endpoint"], first["endpoint"])

    def test_node_manager_pause(self):
        """SIGSTOP a node manager until it is declared down, then SIGCONT: it must notice and
        register again by itself, its running server adopted (as after a network cut)."""
        cmgr = self.basic_cluster()
        self.run_ok(cmgr, self.quota_probe(), ["alloc:8"])
        first = self.wait_server_running("10.1.0.5")
        node = self.nodes["n1"]
        os.kill(node.pid, signal.SIGSTOP)
        try:
            self.wait_node_state("n1", NODE_DOWN)
        finally:
            os.kill(node.pid, signal.SIGCONT)
        self.wait_node_state("n1", NODE_UP)
        again = self.wait_server_running("10.1.0.5")
        self.assertEqual(again["alloc_id"], first["alloc_id"], json.dumps(again))
        self.run_ok(cmgr, self.quota_probe(), ["alloc:8"])
        self.assertEqual(len(self.server_pids("n1")), 1, self.logs())

    def test_node_hangs_during_start(self):
        """The node manager stops answering in the middle of a start-server (SIGSTOP): the
        node is declared down while the cluster manager waits on it. The manager must
        survive, answer the operator, and once the node is back (SIGCONT) place again with
        no flyt-server left that the cluster does not account for."""
        self.start_cluster_manager()
        self.start_node("n1", "10.0.0.1")
        self.add_vm("10.1.0.70", "10.0.0.1", 8, 1)
        self.add_vm("10.1.0.71", "10.0.0.1", 8, 1)
        # A first server: the cluster manager's channel to n1 exists before the hang.
        self.ctl("allocate", "--vm", "10.1.0.70")
        self.wait_server_running("10.1.0.70")
        node = self.nodes["n1"]
        os.kill(node.pid, signal.SIGSTOP)
        try:
            res = {}
            t = threading.Thread(target=lambda: res.update(
                r=self.ctl("allocate", "--vm", "10.1.0.71", check=False)))
            t.start()
            self.wait_node_state("n1", NODE_DOWN)
            # The manager still answers while its start-server call hangs.
            self.ctl("list-servers")
        finally:
            os.kill(node.pid, signal.SIGCONT)
        t.join(CTL_TIMEOUT_S + 10)
        self.assertFalse(t.is_alive(), "flytctl allocate never returned\n" + self.logs())
        if not self.cm.alive():
            self.fail_with("flyt-cluster-manager died while a node hung during start-server",
                           res["r"])
        self.wait_node_state("n1", NODE_UP)
        # Whatever the first answer was, the VM can be served now; the flyt-servers running
        # on n1 are exactly those list-servers shows.
        self.ctl("allocate", "--vm", "10.1.0.71")
        self.wait_server_running("10.1.0.71")
        self.wait_server_running("10.1.0.70")
        self.wait_for("the flyt-servers on n1 to be the two list-servers shows",
                      lambda: len(self.server_pids("n1")) == 2 and len(self.servers()) == 2,
                      timeout=STATE_S)
        self.assertTrue(self.cm.alive(), self.logs())

    # =====================================================================================
    # vm import.

    def _check_imported(self, expected):
        vms = self.vms()
        for ip, (host, sm, mem) in expected.items():
            self.assertIn(ip, vms, "imported VM %s missing: %s" % (ip, json.dumps(vms)))
            got = vms[ip]
            self.assertEqual((got.get("host_ip"), got.get("compute_units"), got.get("memory_gb")),
                             (host, sm, mem), json.dumps(got))

    def test_vm_import_mongodb_json(self):
        self.start_cluster_manager()
        # mongoexport's default: one relaxed Extended JSON document per line.
        lines_path = os.path.join(self.tmp, "vms.json")
        with open(lines_path, "w") as f:
            f.write('{"_id":{"$oid":"65f0c0ffee0000000000a001"},"vm_ip":"10.2.0.1",'
                    '"host_ip":"10.0.0.1","compute_units":16,"memory":4}\n'
                    '{"_id":{"$oid":"65f0c0ffee0000000000a002"},"vm_ip":"10.2.0.2",'
                    '"host_ip":"10.0.0.2","compute_units":8,"memory":2}\n'
                    '{"_id":{"$oid":"65f0c0ffee0000000000a003"},"vm_ip":"10.2.0.3",'
                    '"host_ip":"10.0.0.1","compute_units":32,"memory":{"$numberLong":"8"}}\n')
        res = self.ctl("vm", "import", lines_path, json_out=False)
        self.assertIn("3", res.stdout, res.describe())
        self._check_imported({"10.2.0.1": ("10.0.0.1", 16, 4), "10.2.0.2": ("10.0.0.2", 8, 2),
                              "10.2.0.3": ("10.0.0.1", 32, 8)})
        # mongoexport --jsonArray, with an update of 10.2.0.1.
        array_path = os.path.join(self.tmp, "vms-array.json")
        with open(array_path, "w") as f:
            json.dump([
                {"_id": {"$oid": "65f0c0ffee0000000000b001"}, "vm_ip": "10.2.0.4",
                 "host_ip": "10.0.0.3", "compute_units": 4, "memory": 1},
                {"_id": {"$oid": "65f0c0ffee0000000000a001"}, "vm_ip": "10.2.0.1",
                 "host_ip": "10.0.0.1", "compute_units": 20, "memory": 6},
            ], f, indent=1)
        self.ctl("vm", "import", array_path)
        self._check_imported({"10.2.0.4": ("10.0.0.3", 4, 1), "10.2.0.1": ("10.0.0.1", 20, 6)})
        self.assertEqual(len(self.vms()), 4)
        # A broken file fails locally, naming the file.
        bad = os.path.join(self.tmp, "bad.json")
        with open(bad, "w") as f:
            f.write('{"vm_ip": "10.2.0.9", "host_ip": \n')
        res = self.ctl_fails("vm", "import", bad, json_out=False)
        self.assertIn("bad.json", res.stderr, res.describe())
        self.assertNotIn("10.2.0.9", self.vms())

    def test_vm_import_csv(self):
        self.start_cluster_manager()
        path = os.path.join(self.tmp, "vms.csv")
        with open(path, "w") as f:
            f.write("vm_ip,host_ip,compute_units,memory\n"
                    "10.3.0.1,10.0.0.1,16,4\n"
                    "10.3.0.2,10.0.0.2,8,2\n"
                    "10.3.0.3,10.0.0.1,66,40\n")
        self.ctl("vm", "import", path)
        self._check_imported({"10.3.0.1": ("10.0.0.1", 16, 4), "10.3.0.2": ("10.0.0.2", 8, 2),
                              "10.3.0.3": ("10.0.0.1", 66, 40)})
        # Imported VMs are placeable at once.
        self.start_node("n1", "10.0.0.1")
        self.ctl("allocate", "--vm", "10.3.0.3")
        srv = self.wait_server_running("10.3.0.3")
        self.assertEqual((srv["sm"], srv["memory_bytes"]), (66, 40 * GiB), json.dumps(srv))

    # =====================================================================================
    # Authentication and reachability.

    def test_wrong_secret(self):
        self.start_cluster_manager()
        self.start_node("n1", "10.0.0.1")
        self.add_vm("10.1.0.5", "10.0.0.1", 8, 1)
        res = self.ctl_fails("list-vms", secret="not-the-secret", json_out=False)
        self.assertNotIn(UNREACHABLE_TEXT, res.stderr, res.describe())
        self.assertIn("refused", res.stderr, res.describe())
        self.assertIn("secret", res.stderr, res.describe())
        # A node manager with the wrong secret never joins.
        self.start_node("intruder", "10.0.0.9", secret="not-the-secret", wait=False)
        # A client manager with the wrong secret gets the client a clear error.
        cmgr = self.start_client_manager("10.1.0.5", secret="not-the-secret")
        res = self.run_client(cmgr, self.quota_probe(), ["info"])
        if res.rc is None or res.rc == 0:
            self.fail_with("a client behind a client manager with the wrong secret must fail, "
                           "not %s" % describe_rc(res.rc), res)
        said = (res.stderr + res.stdout + res.log).lower()
        self.assertTrue("secret" in said or "refused" in said or "authenticat" in said,
                        "the client's error names the cause\n" + res.describe())
        # By now the intruder has tried for many heartbeats.
        self.wait_for("the intruder node manager to log a refusal",
                      lambda: "refused" in self.nodes["intruder"].output().lower() or
                      "secret" in self.nodes["intruder"].output().lower())
        self.assertNotIn("intruder", self.node_list())
        self.assertIsNone(self.server_of("10.1.0.5"))

    def test_unreachable_manager(self):
        port = free_tcp_port()  # nothing listens there
        addr = "127.0.0.1:%d" % port
        res = self.ctl_fails("list-vms", address=addr, json_out=False)
        self.assertIn("%s %s" % (UNREACHABLE_TEXT, addr), res.stderr, res.describe())
        self.assertIn("is flyt-cluster-manager running?", res.stderr, res.describe())
        self.assertIn("FLYT_CLUSTER_MANAGER", res.stderr, res.describe())
        # The address from the environment.
        res = self.ctl_fails("list-nodes", address=False, json_out=False,
                             env_extra={"FLYT_CLUSTER_MANAGER": addr})
        self.assertIn("%s %s" % (UNREACHABLE_TEXT, addr), res.stderr, res.describe())
        # The address from the config file's [flytctl] section.
        conf = os.path.join(self.tmp, "flyt.toml")
        with open(conf, "w") as f:
            f.write('[flytctl]\ncluster_manager = "%s"\nsecret = "%s"\n' % (addr, SECRET))
        res = self.ctl_fails("--config", conf, "list-servers", address=False, secret=None,
                             json_out=False)
        self.assertIn("%s %s" % (UNREACHABLE_TEXT, addr), res.stderr, res.describe())
        # A client whose client manager cannot reach the cluster manager fails clearly.
        self.cm_port = port
        cmgr = self.start_client_manager("10.1.0.5")
        res = self.run_client(cmgr, self.quota_probe(), ["info"])
        if res.rc is None or res.rc == 0:
            self.fail_with("a client must fail when the cluster manager is down, not %s"
                           % describe_rc(res.rc), res)
        said = res.stderr + res.stdout + res.log
        self.assertTrue("cluster manager" in said or addr in said,
                        "the client's error names the cluster manager\n" + res.describe())


# ---------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True, help="directory holding the Flyt binaries")
    ap.add_argument("--programs-dir", help="built tests/control programs "
                    "(default: <bin-dir>/../tests/control/programs)")
    ap.add_argument("--e2e-programs-dir", help="built tests/e2e programs "
                    "(default: <bin-dir>/../tests/e2e/programs)")
    ap.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument("--keep", action="store_true", help="keep temporary directories")
    args, rest = ap.parse_known_args()
    CFG.bin_dir = os.path.abspath(args.bin_dir)
    CFG.programs_dir = os.path.abspath(
        args.programs_dir or os.path.join(CFG.bin_dir, os.pardir, "tests", "control",
                                          "programs"))
    CFG.e2e_programs_dir = os.path.abspath(
        args.e2e_programs_dir or os.path.join(CFG.bin_dir, os.pardir, "tests", "e2e",
                                              "programs"))
    CFG.database = args.database
    CFG.keep = args.keep
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
