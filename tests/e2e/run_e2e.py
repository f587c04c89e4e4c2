#!/usr/bin/env python3
"""End-to-end tests: real nvcc-built CUDA programs run through `flyt run` against
`flyt-server --backend sim` (device memory is host memory, launches are recorded, no
kernel runs).

Each test starts its own server(s) on a free TCP port, a Unix socket and a shared-memory
(shm://) socket in a temporary directory, with a token and a launch record file, and kills them in a finally block.
Every subprocess runs under a timeout. Failures show the command, exit status, stdout,
stderr and the client and server logs.

Usage (CMake registers one ctest test per unittest method, see CMakeLists.txt):

  python3 tests/e2e/run_e2e.py --bin-dir build/bin \\
      --programs-dir build/tests/e2e/programs [unittest args, e.g. E2E.test_kernel_args]

  --server-bin / --flyt-bin override the binaries found in --bin-dir;
  --variants static,shared and --transports tcp,unix,shm narrow the matrix (shm: the
  shared-memory transport, shm://<tmp>/<name>.shm.sock); --transports ucx runs over
  ucx://127.0.0.1:<port> (servers then listen there too), with UCX limited to
  --ucx-tls (UCX_TLS for servers and clients, e.g. tcp or sm,self);
  --keep keeps the temporary directories (their paths are printed).

Programs are looked up as <programs-dir>/<name> (static cudart) and
<programs-dir>/<name>_shared (-cudart shared).

Python 3 standard library only.
"""

import argparse
import collections
import concurrent.futures
import difflib
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

# ---------------------------------------------------------------------------------------
# Configuration (filled in by main()).


class Config:
    server_bin = None
    flyt_bin = None
    programs_dir = None
    variants = ("static", "shared")
    transports = ("tcp", "unix", "shm")
    ucx_tls = None  # UCX_TLS for servers and clients when "ucx" is among the transports
    keep = False


CFG = Config()

PROGRAMS = (
    "device_query",
    "memory_roundtrip",
    "stream_event_order",
    "kernel_args",
    "unsupported_api",
    "server_gone",
    "share_quota",
    "pinned_shared",
    "migrate_loop",
)

TOKEN = "e2e-secret-token-7f3a"
RUN_TIMEOUT_S = 150  # one program run
SERVER_START_TIMEOUT_S = 20
# FLYT_TIMEOUT_MS for ordinary runs: long enough for a slow CI machine.
NORMAL_CLIENT_TIMEOUT_MS = 20000
# FLYT_TIMEOUT_MS for the dead-server and wrong-token tests, and the slack allowed on top.
SHORT_CLIENT_TIMEOUT_MS = 3000
DEAD_SERVER_SLACK_S = 10.0
RECORD_WAIT_S = 10.0
SERVER_RSS_LIMIT_KB = 2 * 1024 * 1024  # after the hostile-frame storm

SIM_NAME = "Flyt Simulated GPU"
SIM_UUID = "GPU-f0f1f2f3-f4f5-f6f7-f8f9-fafbfcfdfeff"
SIM_BUS_ID = "00000000:19:00.0"
SIM_TOTAL_MEM = 85899345920
SIM_SMS = 132

RECORD_RE = re.compile(
    r"^launch kernel=\S+ grid=\d+,\d+,\d+ block=\d+,\d+,\d+ shared=\d+ "
    r"params=((?:[0-9a-f]{2})+(?::(?:[0-9a-f]{2})+)*)?$"
)
SANITIZER_RE = re.compile(
    r"ERROR: AddressSanitizer|ERROR: ThreadSanitizer|WARNING: ThreadSanitizer|"
    r"runtime error:|ERROR: UndefinedBehaviorSanitizer"
)

# Guessed layouts of the frame header (docs/architecture.md: a fixed little-endian
# header with op id, call id, flags, payload length). The layout-independent mutations
# of a captured session below do not depend on these; keep them roughly in sync with
# src/protocol.
WIRE_HEADER_GUESSES = (
    # (description, struct format, field order)
    ("u32 op, u32 flags, u64 call, u64 len", "<IIQQ", ("op", "flags", "call", "len")),
    ("u32 op, u32 call, u32 flags, u32 len", "<IIII", ("op", "call", "flags", "len")),
    ("u32 magic, u16 op, u16 flags, u64 call, u64 len", "<4sHHQQ",
     ("magic", "op", "flags", "call", "len")),
    ("u16 op, u16 flags, u32 len, u64 call", "<HHIQ", ("op", "flags", "len", "call")),
    ("u64 len, u32 op, u32 flags, u64 call", "<QIIQ", ("len", "op", "flags", "call")),
)


# ---------------------------------------------------------------------------------------
# Helpers.


def tail(text, limit=6000):
    if text is None:
        return "<none>"
    if len(text) <= limit:
        return text
    return "...[%d bytes cut]...\n%s" % (len(text) - limit, text[-limit:])


def short_lines(text, limit=400):
    """Cuts each line longer than `limit` characters (hex dumps of large parameters)."""
    if text is None:
        return None
    return "\n".join(l if len(l) <= limit else l[:limit] + "...(%d chars)" % len(l)
                     for l in text.split("\n"))


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
    if rc > 128:
        try:
            return "exit %d (128+%s?)" % (rc, signal.Signals(rc - 128).name)
        except ValueError:
            pass
    return "exit %d" % rc


def clean_env(extra=None):
    """The caller's environment without FLYT_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYT_")}
    if extra:
        for k, v in extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = str(v)
    return env


def free_tcp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(proc):
    """SIGKILL a process started with start_new_session=True and its group."""
    if proc.poll() is not None:
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


def program_path(name, variant):
    suffix = "" if variant == "static" else "_shared"
    return os.path.join(CFG.programs_dir, name + suffix)


def server_pids(srv):
    """The server's main process and its worker processes (its children)."""
    pids = [srv.proc.pid]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == srv.proc.pid:
            pids.append(int(entry))
    return pids


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


# ---------------------------------------------------------------------------------------
# The server.


class Server:
    """flyt-server --backend sim on a free TCP port, a Unix socket and a shared-memory
    transport (shm://, its handshake socket) in `tmp`; with
    control=True also a control socket (--control unix://<tmp>/<name>.ctl)."""

    def __init__(self, tmp, name="server", token=TOKEN, log_level="info", extra_args=(),
                 control=False, port=None):
        self.tmp = tmp
        self.fixed_port = port
        self.name = name
        self.token = token
        # Debugging one test: E2E_SERVER_LOG=debug for its servers' logs.
        self.log_level = os.environ.get("E2E_SERVER_LOG", log_level)
        self.extra_args = list(extra_args)
        self.control_path = os.path.join(tmp, name + ".ctl") if control else None
        self.sock_path = os.path.join(tmp, name + ".sock")
        self.shm_path = os.path.join(tmp, name + ".shm.sock")
        self.record_path = os.path.join(tmp, name + ".record")
        self.log_path = os.path.join(tmp, name + ".log")
        self.out_path = os.path.join(tmp, name + ".stdout")
        self.err_path = os.path.join(tmp, name + ".stderr")
        self.port = None
        self.ucx_port = None
        self.proc = None
        self.cmd = None
        self.killed_on_purpose = False

    # -- life cycle

    def start(self):
        last_error = None
        for _ in range(3):  # a port taken between probe and bind: try another
            self.port = self.fixed_port or free_tcp_port()
            for p in (self.sock_path, self.shm_path):
                if os.path.exists(p):
                    os.unlink(p)
            self.cmd = [
                CFG.server_bin,
                "--listen", "tcp://127.0.0.1:%d" % self.port,
                "--listen", "unix://" + self.sock_path,
                "--listen", "shm://" + self.shm_path,
                "--backend", "sim",
                "--sim-record", self.record_path,
            ]
            if "ucx" in CFG.transports:
                self.ucx_port = free_tcp_port()
                self.cmd += ["--listen", "ucx://127.0.0.1:%d" % self.ucx_port]
            if self.token is not None:
                self.cmd += ["--token", self.token]
            if self.control_path:
                self.cmd += ["--control", "unix://" + self.control_path]
            self.cmd += self.extra_args
            env = clean_env({"FLYT_LOG": self.log_level, "FLYT_LOG_FILE": self.log_path,
                             "UCX_TLS": CFG.ucx_tls})
            with open(self.out_path, "ab") as out, open(self.err_path, "ab") as err:
                self.proc = subprocess.Popen(
                    self.cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                    start_new_session=True)
            try:
                self._wait_ready()
                return self
            except RuntimeError as e:
                last_error = e
                kill_group(self.proc)
                if "in use" not in self.logs().lower():
                    break
        raise AssertionError("flyt-server did not start: %s\n%s" % (last_error, self.logs()))

    def _wait_ready(self):
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        tcp_ok = unix_ok = False
        ucx_ok = not self.ucx_port
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited during start-up: %s"
                                   % describe_rc(self.proc.returncode))
            if not tcp_ok:
                tcp_ok = self._probe(socket.AF_INET, ("127.0.0.1", self.port))
            if not unix_ok:
                unix_ok = self._probe(socket.AF_UNIX, self.sock_path)
            # The shm socket is not probed by connecting (that would start a
            # session): it listens once it exists.
            shm_ok = os.path.exists(self.shm_path)
            if self.ucx_port and not ucx_ok:
                ucx_ok = self._probe(socket.AF_INET, ("127.0.0.1", self.ucx_port))
            if tcp_ok and unix_ok and shm_ok and ucx_ok and (not self.control_path
                                                  or os.path.exists(self.control_path)):
                return
            time.sleep(0.05)
        raise RuntimeError("no listener after %ds (tcp %s, unix %s)"
                           % (SERVER_START_TIMEOUT_S, tcp_ok, unix_ok))

    @staticmethod
    def _probe(family, addr):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(1.0)
        try:
            s.connect(addr)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        """SIGKILL, on purpose (the dead-server test)."""
        self.killed_on_purpose = True
        kill_group(self.proc)

    def stop(self):
        """SIGTERM, then SIGKILL after 10 s. Returns a problem description or None."""
        if self.proc is None:
            return None
        problem = None
        if self.proc.poll() is not None:
            if not self.killed_on_purpose:
                problem = "the server had already exited (%s) before the test stopped it" % (
                    describe_rc(self.proc.returncode))
        else:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout=10)
                rc = self.proc.returncode
                if rc not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
                    problem = "the server ended badly on SIGTERM: %s" % describe_rc(rc)
            except subprocess.TimeoutExpired:
                problem = "the server ignored SIGTERM for 10 s"
            finally:
                kill_group(self.proc)
        sanitizer = self.sanitizer_report()
        if sanitizer:
            problem = (problem + "; " if problem else "") + "sanitizer report:\n" + sanitizer
        return problem

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        if self.proc:
            kill_group(self.proc)
        return False

    # -- addresses and outputs

    def url(self, transport):
        if transport == "tcp":
            return "tcp://127.0.0.1:%d" % self.port
        if transport == "unix":
            return "unix://" + self.sock_path
        if transport == "shm":
            return "shm://" + self.shm_path
        if transport == "ucx":
            return "ucx://127.0.0.1:%d" % self.ucx_port
        raise ValueError(transport)

    def listen_urls(self):
        """The addresses the server listens on, in the order it reports them."""
        return [self.url(t) for t in ("tcp", "unix", "shm")] + (
            [self.url("ucx")] if self.ucx_port else [])

    def address(self, transport):
        """Where raw socket bytes go; shm has no byte stream on a socket (its frames
        travel in rings), so raw frames for it go to the Unix socket."""
        if transport == "tcp":
            return socket.AF_INET, ("127.0.0.1", self.port)
        if transport == "ucx":  # its handshake socket: raw bytes meet the preface check
            return socket.AF_INET, ("127.0.0.1", self.ucx_port)
        return socket.AF_UNIX, self.sock_path

    def log_text(self):
        return read_text(self.log_path) if os.path.exists(self.log_path) else ""

    def all_output(self):
        parts = []
        for p in (self.log_path, self.out_path, self.err_path):
            if os.path.exists(p):
                parts.append(read_text(p))
        return "\n".join(parts)

    def output_marks(self):
        """Sizes of the server's log and output files, for output_since()."""
        return {p: (os.path.getsize(p) if os.path.exists(p) else 0)
                for p in (self.log_path, self.out_path, self.err_path)}

    def output_since(self, marks):
        parts = []
        for p, size in marks.items():
            if os.path.exists(p):
                with open(p, "rb") as f:
                    f.seek(size)
                    parts.append(f.read().decode("utf-8", "replace"))
        return "\n".join(parts)

    def sanitizer_report(self):
        text = self.all_output()
        m = SANITIZER_RE.search(text)
        return tail(text[m.start():], 4000) if m else None

    def logs(self):
        state = "running" if self.alive() else (
            describe_rc(self.proc.returncode) if self.proc else "not started")
        return ("--- server %s (%s): %s\n--- server log %s:\n%s\n--- server stderr:\n%s\n"
                "--- server stdout:\n%s" % (
                    self.name, state, " ".join(self.cmd or []), self.log_path,
                    tail(self.log_text() if os.path.exists(self.log_path) else "<none>"),
                    tail(read_text(self.err_path) if os.path.exists(self.err_path) else ""),
                    tail(read_text(self.out_path) if os.path.exists(self.out_path) else "")))

    def control(self, request, timeout=10.0):
        """One request on the control socket; returns the answer (a dict)."""
        return control_call(self.control_path, request, timeout)

    def record_lines(self):
        """The launch records written so far: whole lines only (the server may be in the
        middle of writing a long one, e.g. a kernel with a 4 KiB argument)."""
        if not os.path.exists(self.record_path):
            return []
        text = read_text(self.record_path)
        text = text[:text.rfind("\n") + 1]
        return [l for l in text.splitlines() if l.startswith("launch ")]


def control_call(path, request, timeout=10.0, sock=None):
    """Sends one length-prefixed JSON request (docs/control_plane.md) and returns the answer.
    With `sock`, uses that connected socket and leaves it open."""
    own = sock is None
    if own:
        deadline = time.monotonic() + timeout
        while True:  # the file appears at bind(), a moment before listen()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                sock.connect(path)
                break
            except (ConnectionRefusedError, FileNotFoundError):
                sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    try:
        body = request if isinstance(request, bytes) else json.dumps(request).encode()
        sock.sendall(struct.pack("<I", len(body)) + body)
        head = recv_exact(sock, 4)
        (n,) = struct.unpack("<I", head)
        return json.loads(recv_exact(sock, n).decode())
    finally:
        if own:
            sock.close()


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("the control socket closed after %d of %d bytes" % (len(data), n))
        data += chunk
    return data


# ---------------------------------------------------------------------------------------
# Running programs through `flyt run`.


class Result:
    def __init__(self, cmd, env_note, rc, stdout, stderr, client_log_path, elapsed):
        self.cmd = cmd
        self.env_note = env_note
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.client_log_path = client_log_path
        self.elapsed = elapsed

    @property
    def client_log(self):
        if self.client_log_path and os.path.exists(self.client_log_path):
            return read_text(self.client_log_path)
        return ""

    def lines(self):
        return self.stdout.splitlines()

    def describe(self):
        return ("--- command: %s\n--- env: %s\n--- result: %s after %.1fs\n--- stdout:\n%s\n"
                "--- stderr:\n%s\n--- client log %s:\n%s" % (
                    " ".join(self.cmd), self.env_note, describe_rc(self.rc), self.elapsed,
                    tail(short_lines(self.stdout)), tail(self.stderr), self.client_log_path,
                    tail(self.client_log)))


_counter_lock = threading.Lock()
_counter = [0]


def next_id():
    with _counter_lock:
        _counter[0] += 1
        return _counter[0]


def flyt_command(server, transport, program, args=(), token=TOKEN, use_flags=True):
    cmd = [CFG.flyt_bin, "run"]
    if use_flags:
        cmd += ["--server", server.url(transport)]
        if token is not None:
            cmd += ["--token", token]
    return cmd + ["--", program] + list(args)


def client_env(tmp, server, transport, log_level="info", timeout_ms=NORMAL_CLIENT_TIMEOUT_MS,
               token=TOKEN, use_flags=True, log_to_file=True, watchdog_s=RUN_TIMEOUT_S - 20,
               extra=None):
    log_path = os.path.join(tmp, "client-%d.log" % next_id()) if log_to_file else None
    e = {"FLYT_LOG": log_level, "FLYT_TIMEOUT_MS": timeout_ms, "E2E_WATCHDOG_S": watchdog_s}
    if transport != "shm":
        # The server offers shared memory and runs on this host: without this the
        # client would move to shm:// and tcp/unix would go untested.
        e["FLYT_SHM"] = "off"
    if log_path:
        e["FLYT_LOG_FILE"] = log_path
    if CFG.ucx_tls:
        e["UCX_TLS"] = CFG.ucx_tls
    # Debugging one test: E2E_CLIENT_FLYT_TRACE=1 gives its clients FLYT_TRACE=1, and so on.
    for k, v in os.environ.items():
        if k.startswith("E2E_CLIENT_FLYT_"):
            e[k[len("E2E_CLIENT_"):]] = v
    if not use_flags:
        e["FLYT_SERVER"] = server.url(transport)
        if token is not None:
            e["FLYT_TOKEN"] = token
    if extra:
        e.update(extra)
    note = " ".join("%s=%s" % kv for kv in sorted(e.items()))
    return clean_env(e), note, log_path


def run_program(tmp, server, transport, program, args=(), timeout=RUN_TIMEOUT_S, token=TOKEN,
                use_flags=True, **env_kw):
    cmd = flyt_command(server, transport, program, args, token=token, use_flags=use_flags)
    env, note, log_path = client_env(tmp, server, transport, token=token, use_flags=use_flags,
                                     **env_kw)
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
    return Result(cmd, note, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                  log_path, time.monotonic() - start)


class RunningProgram:
    """A program started through `flyt run` whose stdout lines are read as they come."""

    def __init__(self, tmp, server, transport, program, args=(), **env_kw):
        self.cmd = flyt_command(server, transport, program, args)
        env, self.note, self.log_path = client_env(tmp, server, transport, **env_kw)
        self.start = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.lines = queue.Queue()
        self.out = []
        self.err = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.err_reader = threading.Thread(target=self._read_err, daemon=True)
        self.err_reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.out.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def _read_err(self):
        for raw in self.proc.stderr:
            self.err.append(raw.decode("utf-8", "replace"))

    def wait_line(self, pattern, timeout=30.0):
        """The first line (from now on) matching `pattern`, or None at EOF or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                return None
            if re.search(pattern, line):
                return line

    def finish(self, timeout=RUN_TIMEOUT_S):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        kill_group(self.proc)
        self.reader.join(10)
        self.err_reader.join(10)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return Result(self.cmd, self.note, rc, "\n".join(self.out) + "\n", "".join(self.err),
                      self.log_path, time.monotonic() - self.start)


# ---------------------------------------------------------------------------------------
# A TCP proxy that records what clients send (seed material for the hostile frames).


class CaptureProxy:
    def __init__(self, upstream_port, limit=1 << 16):
        self.upstream_port = upstream_port
        self.limit = limit
        self.streams = []  # client->server bytes, one bytearray per connection
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.sockets = []
        self.thread = threading.Thread(target=self._accept_loop, daemon=True)
        self.thread.start()

    def url(self):
        return "tcp://127.0.0.1:%d" % self.port

    def _accept_loop(self):
        while not self.stopping.is_set():
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), 5)
            except OSError:
                client.close()
                continue
            buf = bytearray()
            with self.lock:
                self.streams.append(buf)
                self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, buf), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, None), daemon=True).start()

    def _pump(self, src, dst, record):
        try:
            src.settimeout(None)
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if record is not None and len(record) < self.limit:
                    with self.lock:
                        record += data[: self.limit - len(record)]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (dst,):
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def stop(self):
        self.stopping.set()
        self.listener.close()
        with self.lock:
            for s in self.sockets:
                try:
                    s.close()
                except OSError:
                    pass

    def seed(self):
        with self.lock:
            streams = [bytes(s) for s in self.streams if s]
        # The session that carried the most traffic is the program's own.
        return max(streams, key=len) if streams else b""


def hostile_payloads(seed, rng):
    """(description, bytes) pairs sent one per connection."""
    out = []
    out.append(("empty connection", b""))
    for n in (1, 7, 64, 4096, 1 << 20):
        out.append(("%d random bytes" % n, bytes(rng.getrandbits(8) for _ in range(min(n, 4096)))
                    * max(1, n // 4096)))
    out.append(("64 bytes of 0xff", b"\xff" * 64))
    out.append(("64 bytes of 0x00", b"\x00" * 64))
    out.append(("HTTP request", b"GET / HTTP/1.1\r\nHost: flyt\r\n\r\n"))
    for desc, fmt, fields in WIRE_HEADER_GUESSES:
        for op in (0, 1, 2, 0xFFFF):
            vals = []
            for name, code in zip(fields, re.findall(r"\d*[A-Za-z]", fmt[1:])):
                if name == "magic":
                    vals.append(b"FLYT")
                elif name == "len":
                    vals.append((1 << (8 * struct.calcsize("<" + code))) - 1)
                elif name == "op":
                    vals.append(op & ((1 << (8 * struct.calcsize("<" + code))) - 1))
                elif name == "call":
                    vals.append(1)
                else:
                    vals.append(0)
            header = struct.pack(fmt, *vals)
            out.append(("guessed header [%s] op=%d, maximal length" % (desc, op),
                        header + bytes(rng.getrandbits(8) for _ in range(256))))
    if seed:
        base = seed[:8192]
        out.append(("captured session replayed", base))
        span = min(len(base), 256)
        for off in range(0, span - 3, 4):
            out.append(("captured session, 0xffffffff at %d" % off,
                        base[:off] + b"\xff\xff\xff\xff" + base[off + 4:]))
            out.append(("captured session, 0x7fffffff at %d" % off,
                        base[:off] + b"\xff\xff\xff\x7f" + base[off + 4:]))
        for off in range(0, span - 7, 8):
            out.append(("captured session, 8 x 0xff at %d" % off,
                        base[:off] + b"\xff" * 8 + base[off + 8:]))
        for cut in sorted(set(rng.randrange(1, len(base)) for _ in range(16))):
            out.append(("captured session cut at %d" % cut, base[:cut]))
        for i in range(24):
            b = bytearray(base[: min(len(base), 2048)])
            for _ in range(rng.randrange(1, 9)):
                b[rng.randrange(0, min(len(b), 256))] = rng.getrandbits(8)
            out.append(("captured session with random byte flips #%d" % i, bytes(b)))
        # A well-formed start followed by garbage (an unknown op after the handshake, if
        # the handshake is shorter than the cut).
        for cut in (16, 24, 32, 48, 64, 96, 128):
            if cut < len(base):
                out.append(("captured session prefix %d + garbage" % cut,
                            base[:cut] + bytes(rng.getrandbits(8) for _ in range(512))))
    return out


def send_hostile(family, addr, payload, linger_s=1.0):
    """Sends `payload` on a fresh connection, half-closes, drains for up to `linger_s`.
    Returns 'closed' when the server closed the connection, else 'open'."""
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5.0)
    try:
        s.connect(addr)
        try:
            if payload:
                s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            return "closed"
        deadline = time.monotonic() + linger_s
        s.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                data = s.recv(65536)
                if not data:
                    return "closed"
            except socket.timeout:
                continue
            except OSError:
                return "closed"
        return "open"
    except OSError as e:
        return "connect failed: %s" % e
    finally:
        s.close()


# ---------------------------------------------------------------------------------------
# The tests.


class E2E(unittest.TestCase):
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        missing = [p for p in (CFG.server_bin, CFG.flyt_bin) if not os.path.isfile(p)]
        for name in PROGRAMS:
            for variant in CFG.variants:
                p = program_path(name, variant)
                if not os.path.isfile(p):
                    missing.append(p)
        if missing:
            raise AssertionError("missing binaries (build first):\n  " + "\n  ".join(missing))

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="flyt-e2e-")
        self.servers = []

    def tearDown(self):
        problems = []
        for srv in self.servers:
            problem = srv.stop()
            if problem:
                problems.append("%s\n%s" % (problem, srv.logs()))
        if CFG.keep:
            sys.stderr.write("\n[e2e] kept %s\n" % self.tmp)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if problems:
            self.fail("server problem(s):\n" + "\n".join(problems))

    # -- helpers

    def start_server(self, **kw):
        kw.setdefault("name", "server%d" % next_id())
        srv = Server(self.tmp, **kw)
        srv.start()  # raises with the server's output when it does not come up
        self.servers.append(srv)
        return srv

    def stop_server(self, srv):
        problem = srv.stop()
        self.servers.remove(srv)
        if problem:
            self.fail("%s\n%s" % (problem, srv.logs()))

    def matrix(self):
        for variant in CFG.variants:
            for transport in CFG.transports:
                yield variant, transport

    def assert_passed(self, res, name, srv):
        where = "%s\n%s" % (res.describe(), srv.logs())
        self.assertIsNotNone(res.rc, "%s hung (killed after %ds)\n%s" % (name, RUN_TIMEOUT_S,
                                                                          where))
        self.assertEqual(res.rc, 0, "%s failed: %s\n%s" % (name, describe_rc(res.rc), where))
        lines = res.lines()
        program = name.split()[0]
        self.assertTrue(lines and lines[-1] == "%s: PASS" % program,
                        "%s did not end with '%s: PASS'\n%s" % (name, program, where))
        m = SANITIZER_RE.search(res.stderr)
        self.assertIsNone(m, "sanitizer report in the client's stderr\n" + where)
        self.assertTrue(srv.alive(), "the server died during %s\n%s" % (name, where))

    def run_ok(self, srv, transport, name, variant, args=(), **kw):
        res = run_program(self.tmp, srv, transport, program_path(name, variant), args, **kw)
        self.assert_passed(res, name, srv)
        return res

    def wait_records(self, srv, count):
        deadline = time.monotonic() + RECORD_WAIT_S
        lines = srv.record_lines()
        while len(lines) < count and time.monotonic() < deadline:
            time.sleep(0.1)
            lines = srv.record_lines()
        return lines

    @staticmethod
    def kv(res):
        out = {}
        for line in res.lines():
            if "=" in line:
                k, v = line.split("=", 1)
                out.setdefault(k, v)
        return out

    # -- the programs, both cudart variants, both transports

    def test_device_query(self):
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "device_query", variant)
                kv = self.kv(res)
                where = res.describe()
                self.assertEqual(kv.get("name"), SIM_NAME, where)
                self.assertEqual(kv.get("compute_capability"), "9.0", where)
                self.assertEqual(kv.get("multiprocessors"), str(SIM_SMS), where)
                self.assertEqual(kv.get("total_global_mem"), str(SIM_TOTAL_MEM), where)
                self.assertEqual(kv.get("mem_total"), str(SIM_TOTAL_MEM), where)
                self.assertEqual(kv.get("warp_size"), "32", where)
                self.assertEqual(kv.get("max_threads_per_block"), "1024", where)
                self.assertEqual(kv.get("device_count"), "1", where)
                self.assertEqual(kv.get("texture1d_linear_max_width_positive"), "1", where)
                self.stop_server(srv)

        # Configuration through FLYT_SERVER / FLYT_TOKEN instead of flags, with the most
        # verbose logging going to stderr: the client library must never write to stdout.
        for transport in CFG.transports:
            with self.subTest(config="env", transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "device_query", CFG.variants[0],
                                  use_flags=False, log_level="trace", log_to_file=False,
                                  extra={"FLYT_TRACE": "1"})
                stray = [l for l in res.lines()
                         if not re.match(r"^[a-z0-9_.]+=", l) and l != "device_query: PASS"]
                self.assertEqual(stray, [], "lines on stdout that the program did not print "
                                 "(the client library must never write to stdout)\n"
                                 + res.describe())
                self.stop_server(srv)

    def test_memory_roundtrip(self):
        """Copies of every kind (the program's own byte-exact checks), and texture and
        surface objects: made through the driver API and cudart, their Get*Desc calls give
        back the descriptors they were made with; a texture made without a resource view
        has none, and a NULL descriptor pointer is refused (CUDA_ERROR_INVALID_VALUE)."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "memory_roundtrip", variant)
                kv = self.kv(res)
                for key in ("tex.array.resource", "tex.array.texture", "tex.array.view",
                            "tex.linear.resource", "surf.resource", "cudart.texture",
                            "cudart.surface"):
                    self.assertEqual(kv.get(key), "same", "%s\n%s" % (key, res.describe()))
                for key in ("tex.linear.view", "tex.null_out"):
                    self.assertEqual(kv.get(key), "CUDA_ERROR_INVALID_VALUE",
                                     "%s\n%s" % (key, res.describe()))
                self.stop_server(srv)

    def test_stream_event_order(self):
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "stream_event_order", variant)
                kv = self.kv(res)
                self.assertEqual(kv.get("callback_order"), "1,2,3,4,5", res.describe())
                self.assertEqual(kv.get("cross_stream_order"), "10,11", res.describe())
                self.stop_server(srv)

    def test_kernel_args(self):
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "kernel_args", variant)
                expected = [l for l in res.lines() if l.startswith("launch ")]
                kv = self.kv(res)
                self.assertEqual(str(len(expected)), kv.get("launches"), res.describe())
                for line in expected:  # the program's own lines must follow the format
                    self.assertRegex(line, RECORD_RE)
                got = self.wait_records(srv, len(expected))
                if len(got) < len(expected):
                    # Give the server a chance to flush the record on shutdown.
                    self.stop_server(srv)
                    got = srv.record_lines()
                self.compare_records(expected, got, res, srv)
                if srv in self.servers:
                    self.stop_server(srv)

    def compare_records(self, expected, got, res, srv):
        if expected == got:
            return

        def short(lines):
            return [l if len(l) <= 400 else l[:400] + "...(%d chars)" % len(l) for l in lines]

        diff = "\n".join(difflib.unified_diff(short(expected), short(got), "program (expected)",
                                              "sim record (got)", lineterm="", n=1))
        detail = ""
        for i, (e, g) in enumerate(zip(expected, got)):
            if e != g:
                at = next(k for k in range(min(len(e), len(g)) + 1)
                          if k == min(len(e), len(g)) or e[k] != g[k])
                detail = ("first difference in launch #%d at character %d:\n  expected ...%s\n"
                          "  got      ...%s" % (i, at, e[max(0, at - 60):at + 60],
                                                g[max(0, at - 60):at + 60]))
                break
        if sorted(expected) == sorted(got):
            detail += "\n(the same lines, in a different order)"
        self.fail("sim record differs from the launches the program made (%d expected, %d "
                  "recorded)\n%s\n%s\n--- record file %s\n%s\n%s" % (
                      len(expected), len(got), detail, diff, srv.record_path,
                      res.describe(), srv.logs()))

    # -- error paths

    def test_unsupported_api(self):
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "unsupported_api", variant, log_level="warn")
                log = res.client_log
                where = res.describe()
                map_lines = [l for l in log.splitlines() if re.search(
                    r"\bcuGraphicsMapResources(_ptsz|_ptds|_v\d+)? is not supported by Flyt yet",
                    l)]
                self.assertEqual(len(map_lines), 1,
                                 "want exactly one 'cuGraphicsMapResources is not supported by "
                                 "Flyt yet' line in the client log (called %s times)\n%s" % (
                                     "3" if "dlsym cuGraphicsMapResources found=1" in res.stdout
                                     else "2", where))
                self.assertRegex(log, r"\bcuGraphicsUnregisterResource\S* is not supported by "
                                 r"Flyt yet", where)
                self.assertEqual(log.count("no table 0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"), 1,
                                 "want one warning for an unknown export table\n" + where)
                self.assertNotIn("da9151d3", log,
                                 "NVRTC's export table is served without a warning\n" + where)
                self.stop_server(srv)

    def test_rma_copies(self):
        """Copies of pinned and registered memory, byte-exact at odd sizes and offsets, in
        stream order with host functions, events and each other; buffers freed while
        registered. Over ucx:// they travel as one-sided reads and writes of the client's
        memory: the server says so, and by which of UCX's transports; the sim backend's
        synchronous copies go straight to device memory. Elsewhere the same checks run
        on the byte path."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "rma_copies", variant)
                log = srv.log_text()
                if transport == "ucx":
                    self.assertRegex(log, r"pinned client memory by UCX [0-9.]+ one-sided reads "
                                     r"and writes over \S+", srv.logs())
                    self.assertIn("synchronous copies go straight to and from device memory",
                                  log, srv.logs())
                    self.assertIn("no CUDA support", log, srv.logs())
                    self.assertNotIn("refused a client key", log, srv.logs())
                else:
                    self.assertNotIn("pinned client memory by", log, srv.logs())
                self.stop_server(srv)
        if "ucx" in CFG.transports:
            # FLYT_RMA=off: the byte path over ucx:// too.
            srv = self.start_server()
            self.run_ok(srv, "ucx", "rma_copies", CFG.variants[0], extra={"FLYT_RMA": "off"})
            self.assertNotIn("pinned client memory by", srv.log_text(), srv.logs())
            self.stop_server(srv)

    def test_rma_client_killed(self):
        """A client killed while its pinned copies are in flight (both directions, sync and
        async): its worker notices, releases everything and exits without a crash; the
        server serves the next client."""
        srv = self.start_server(control=True)
        prog = program_path("rma_copies", CFG.variants[0])
        for transport in CFG.transports:
            crashed = srv.control({"verb": "stats"})["workers_crashed"]
            looping = RunningProgram(self.tmp, srv, transport, prog, ["loop"],
                                     extra={"E2E_WATCHDOG_S": "0"})
            self.assertIsNotNone(looping.wait_line(r"^looping"), srv.logs())
            worker = self.worker_of(srv, self.client_pid(looping))
            time.sleep(0.5)  # copies in flight
            os.killpg(looping.proc.pid, signal.SIGKILL)
            looping.finish(timeout=10)
            stats = self.stats_when(srv, lambda s: s["memory_used"] == 0 and not any(
                w["pid"] == worker for w in s["workers"]), timeout=30)
            self.assertEqual(stats["memory_used"], 0, "%s\n%s" % (stats, srv.logs()))
            self.assertNotIn(worker, [w["pid"] for w in stats["workers"]], srv.logs())
            self.assertEqual(stats["workers_crashed"], crashed, srv.logs())
            self.run_ok(srv, transport, "rma_copies", CFG.variants[-1])
        self.stop_server(srv)

    def test_staged_copies(self):
        """Device-to-host copies into pageable memory (staged_copies' own byte-exact checks:
        odd sizes and offsets around the chunk size, fresh pages, asynchronous copies that
        are synchronous for the host, several threads, errors in a later chunk). Over shm://
        they go through the staging area shared with the server, with the default chunks and
        with small ones (many chunks, more than the slots, three copying threads)."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "staged_copies", variant)
                staged = "staging area of" in res.client_log
                self.assertEqual(staged, transport == "shm", res.describe())
                if transport == "shm":
                    small = {"FLYT_SHM_STAGED_CHUNK_KIB": "64", "FLYT_SHM_STAGED_SLOTS": "3",
                             "FLYT_SHM_COPY_THREADS": "3"}
                    res = self.run_ok(srv, transport, "staged_copies", variant, extra=small)
                    self.assertIn("staging area of 3 x 64 KiB", res.client_log, res.describe())
                self.stop_server(srv)

    def staging_maps(self, srv):
        maps = []
        for pid in server_pids(srv):
            try:
                with open("/proc/%d/maps" % pid) as f:
                    maps += [l for l in f if "flyt-staging" in l]
            except OSError:
                pass  # a worker that just ended
        return maps

    def test_staged_client_killed(self):
        """A client killed in the middle of large device-to-host copies through the staging
        area (shm://): its worker notices, lets the copies in flight land, releases the
        device memory and the staging area, and exits without a crash; the server serves
        the next client."""
        srv = self.start_server(control=True)
        prog = program_path("staged_copies", CFG.variants[0])
        for _ in range(2):
            crashed = srv.control({"verb": "stats"})["workers_crashed"]
            looping = RunningProgram(self.tmp, srv, "shm", prog, ["loop"],
                                     extra={"E2E_WATCHDOG_S": "0",
                                            "FLYT_SHM_STAGED_CHUNK_KIB": "256"})
            self.assertIsNotNone(looping.wait_line(r"^looping"), srv.logs())
            worker = self.worker_of(srv, self.client_pid(looping))
            deadline = time.monotonic() + 10
            while not self.staging_maps(srv) and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertTrue(self.staging_maps(srv), "no staging area mapped\n" + srv.logs())
            time.sleep(0.5)  # copies in flight
            os.killpg(looping.proc.pid, signal.SIGKILL)
            looping.finish(timeout=10)
            stats = self.stats_when(srv, lambda s: s["memory_used"] == 0 and not any(
                w["pid"] == worker for w in s["workers"]), timeout=30)
            self.assertEqual(stats["memory_used"], 0, "%s\n%s" % (stats, srv.logs()))
            self.assertNotIn(worker, [w["pid"] for w in stats["workers"]], srv.logs())
            self.assertEqual(stats["workers_crashed"], crashed, srv.logs())
            deadline = time.monotonic() + 10
            while self.staging_maps(srv) and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertEqual(self.staging_maps(srv), [], srv.logs())
        self.run_ok(srv, "shm", "staged_copies", CFG.variants[-1])
        self.stop_server(srv)

    def test_pinned_shared(self):
        """Pinned memory over shm:// is shared with the server (the GPU reaches the client's
        bytes: mapped pointer); over tcp/unix it stays client memory until the program asks
        for its device pointer, which maps it where it is (the server's pinned memory at the
        same address, kept coherent: mapped=1, same_address=1 everywhere). The server's
        mappings and driver registrations of it go when the client frees it, exits, or is
        killed."""
        pids = []
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                pids.append(srv.proc.pid)
                res = self.run_ok(srv, transport, "pinned_shared", variant)
                kv = self.kv(res)
                self.assertEqual(kv.get("mapped"), "1", res.describe())
                if transport != "shm":
                    self.assertEqual(kv.get("same_address"), "1", res.describe())
                self.assert_no_shared_maps(srv)
                if transport == "shm":
                    self.kill_while_sharing(srv, variant)
                self.stop_server(srv)
        # Automatic selection: a client given the TCP address of a server on this host
        # moves to its shm:// listener by itself (FLYT_SHM unset = auto).
        srv = self.start_server()
        pids.append(srv.proc.pid)
        res = self.run_ok(srv, "tcp", "pinned_shared", CFG.variants[0],
                          extra={"FLYT_SHM": "auto"})
        self.assertEqual(self.kv(res).get("mapped"), "1", res.describe())
        self.assertIn("using shared memory (%s)" % srv.url("shm"), res.client_log, res.describe())
        self.stop_server(srv)
        # Named shared memory of ours would be /dev/shm/flyt-<pid>-...; other tests
        # running at the same time may own other names.
        if os.path.isdir("/dev/shm"):
            leaked = [n for n in os.listdir("/dev/shm")
                      if any(n.startswith("flyt-%d-" % p) for p in pids)]
            self.assertEqual(leaked, [], "files left in /dev/shm")

    def test_vmm(self):
        """Virtual memory management (cuMemAddressReserve/Create/Map/SetAccess/...): vmm's
        own checks over every transport and cudart, the sim's answers (2 MiB granularity,
        properties), misuse refused without harm, the unsupported sharing calls logged
        once; another session's handle and range refused; a killed client's memory
        released."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "vmm", variant, log_level="warn")
                kv = self.kv(res)
                where = res.describe()
                for key, want in (("granularity", "2097152"), ("recommended", "2097152"),
                                  ("access", "readwrite"), ("pointer_type", "2"),
                                  ("prop.type", "1"), ("prop.location", "1/0"),
                                  ("under_flyt", "1"), ("misuse", "ok")):
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
                said = [l for l in res.client_log.splitlines() if re.search(
                    r"\bcuMemExportToShareableHandle is not supported by Flyt yet", l)]
                self.assertEqual(len(said), 1, "want cuMemExportToShareableHandle logged once "
                                 "as unsupported (called twice)\n" + where)
                self.stop_server(srv)

        # Sessions are isolated: one program's handle and range are refused to another;
        # the holder, killed, has its memory released by the server.
        srv = self.start_server(control=True)
        holder = RunningProgram(self.tmp, srv, "tcp", program_path("vmm", CFG.variants[0]),
                                ("hold",))
        try:
            if holder.wait_line(r"^holding$") is None:
                self.fail("vmm hold never got to holding\n" + holder.finish(5).describe())
            held = {}
            for line in holder.out:
                if line.startswith("held."):
                    k, v = line.split("=", 1)
                    held[k] = v
            res = self.run_ok(srv, "unix", "vmm", CFG.variants[0],
                              args=("foreign", held.get("held.handle", "0"),
                                    held.get("held.va", "0")))
            self.assertEqual(self.kv(res).get("foreign"), "ok", res.describe())
        finally:
            kill_group(holder.proc)
            holder.finish(10)
        self.assert_stats(srv, sessions=0, memory_used=0)
        self.assertRegex(srv.log_text(), r"released 2 mappings, 2 allocation handles, "
                         r"1 reservations", "the killed holder's memory was not released\n"
                         + srv.logs())
        self.stop_server(srv)

    def test_vmm_share(self):
        """VMM shareable handles between two client processes of one server: a chunk
        exported as a POSIX file descriptor, passed with SCM_RIGHTS to a child process,
        imported, mapped, read and written there; the parent sees the child's bytes.
        A descriptor that is no shareable handle is refused."""
        srv = self.start_server(control=True, extra_args=["--memory-quota", "64M"])
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                res = self.run_ok(srv, transport, "vmm", variant, args=("share",))
                self.assertIn("import=ok", res.lines(), res.describe())
                self.assertIn("share=ok", res.lines(), res.describe())
        self.assert_stats(srv, sessions=0, memory_used=0)
        self.stop_server(srv)

    def test_contexts(self):
        """Contexts the program creates through the driver API (cuCtxCreate at every ABI,
        push/pop, cuCtxSetCurrent(NULL), another thread, cuCtxDestroy of the current and of
        a non-current one, the errors; cuCtxRecordEvent and cuCtxWaitEvent order the
        context's host functions, refuse another context's event for a record and accept it
        for a wait, and work on the primary context): contexts' own checks over every transport and
        cudart under --memory-quota 64M, where cuMemGetInfo is exact and a destroyed
        context's 4 MiB come back; the context the program leaves is destroyed by the
        server with its memory (log, stats memory_used 0). Once more with
        --sim-green-contexts --sm-count 20: a created context is a green context of the
        tenant's share."""
        quota = 64 << 20
        cases = [(variant, transport, False) for variant, transport in self.matrix()]
        cases.append((CFG.variants[0], CFG.transports[0], True))
        for variant, transport, green in cases:
            with self.subTest(variant=variant, transport=transport, green=green):
                args = ["--memory-quota", "64M"]
                if green:
                    args += ["--sm-count", "20", "--sim-green-contexts"]
                srv = self.start_server(control=True, extra_args=args)
                res = self.run_ok(srv, transport, "contexts", variant, args=(str(quota),))
                kv = self.kv(res)
                where = res.describe()
                for key, want in (("under_flyt", "1"), ("freed_by_destroy", str(4 << 20)),
                                  ("free_after_all", str(quota)), ("destroy_primary", "201"),
                                  ("destroy_null", "1"), ("destroy_destroyed", "201"),
                                  ("stream.queries", "ok"),
                                  ("stream.copied_sync_policy", str(3)),
                                  ("ctx_event.record_after_work", "1"),
                                  ("ctx_event.wait_orders_work", "1"),
                                  ("ctx_event.record_other_context", "CUDA_ERROR_INVALID_HANDLE"),
                                  ("ctx_event.wait_other_context", "CUDA_SUCCESS"),
                                  ("ctx_event.primary", "ok")):
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
                self.assert_stats(srv, sessions=0, memory_used=0, memory_quota=quota)
                self.assertRegex(srv.log_text(), r"destroyed 1 context\(s\) the client left",
                                 "the server did not destroy the context left behind\n" +
                                 srv.logs())
                self.stop_server(srv)

    def test_module_functions(self):
        """cuFFT's private table 6e163fbe (docs/export_tables.md): module_functions asks
        for it like cuFFT does, over every transport and cudart: the size covers slot 7;
        slot 7 hands each function of a loaded module to a callback and returns how many
        (one for a one-function module, the function cuModuleGetFunction finds, which
        launches; both of a two-function module), also with a NULL context; the client
        answers it without a warning."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "module_functions", variant, log_level="warn")
                kv = self.kv(res)
                where = res.describe()
                for key, want in (("under_flyt", "1"), ("table.covers_slot7", "1"),
                                  ("one.result", "1"), ("one.calls", "1"),
                                  ("one.same_as_by_name", "1"), ("one.launched", "1"),
                                  ("null_ctx.result", "1"), ("two.result", "2"),
                                  ("two.same_set", "1")):
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
                self.assertNotIn("export table", res.stderr + res.client_log, where)
                self.stop_server(srv)

    def test_cupti_activity(self):
        """CUPTI's activity API through `flyt run` (Flyt's libcupti.so.13, preloaded; the
        records come from the server's CUPTI, the sim's here): over every transport and
        cudart, cupti_activity's kernel, both copies and the memset are recorded once
        each with their sizes, carry the external ids pushed around them, lie between
        two cuptiGetTimestamp readings on the client (also when the app registers a
        timestamp callback of another rate, as Kineto does), kinds disabled before the
        flush still deliver what they recorded, and a disabled kind records nothing
        more. Overhead records: the kernel's lazy loading at its first launch carries
        the launch's correlation id, and the app's buffer requests are timed. The
        server's records of a profiled client do not outlive it."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "cupti_activity", variant, log_level="warn")
                clock = self.run_ok(srv, transport, "cupti_activity", variant, args=("clock",),
                                    log_level="warn")
                self.assertEqual(self.kv(clock), self.kv(res),
                                 "with the app's own timestamp clock\n" + clock.describe())
                kv = self.kv(res)
                where = res.describe()
                for key, want in (("under_flyt", "1"), ("popped", "4343"),
                                  ("kernel.count", "1"), ("kernel.grid", "3"),
                                  ("kernel.block", "64"), ("kernel.external", "4242"),
                                  ("memcpy.htod", "1"), ("memcpy.dtoh", "1"),
                                  ("memset.count", "1"), ("timestamps.in_window", "1"),
                                  ("disabled.new_kernels", "0"),
                                  ("buffers.held_before_flush", "1"),
                                  ("overhead.lazy_loading_of_kernel", "1"),
                                  ("overhead.buffer_request", "1"),
                                  ("pop_empty", "18")):  # CUPTI_ERROR_QUEUE_EMPTY
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
                self.assertNotIn("profiling:", srv.log_text(), where)
                self.stop_server(srv)

    def test_cupti_callbacks(self):
        """CUPTI's callback API and RUNTIME activity records through `flyt run`: cudart's
        reports of its own calls (libcuda's tools-callback table) reach the subscriber at
        enter and exit of each runtime call, with the call's name, parameters (cudaMemcpy's
        count and kind at enter), return value and pointer (cudaMalloc's at exit), one
        correlation id per call and the correlation data kept from enter to exit; the
        RUNTIME records of cudaLaunchKernel and cudaMemcpy carry the ids of the kernel and
        the copy they issued, over every transport and both cudarts.
        `driver` mode adds the driver API domain (libcuda's wrappers report every driver
        call): the enabled calls only (cuMemcpyHtoD_v2 and cuLaunchKernel made by cudart
        and by the program, cuDeviceGet by the program and from inside a callback; not
        cuCtxSynchronize, enabled and disabled again), in enter/exit pairs with their
        params (ByteCount, gridDimX, ordinal), return values at exit (the bad ordinal's
        error as the caller got it), the current context and its number, the kernel's
        name at launches; cudart's driver calls share the runtime call's correlation id;
        DRIVER records carry the callbacks' ids, which the kernel and copy records share;
        cuptiActivityEnableDriverApi leaves cuCtxSynchronize out; cuptiGetCallbackName.
        `driver_all` mode enables the whole driver domain: enter and exit nest properly, each
        reported call has its DRIVER record, and the program's and cudart's calls of
        cuMemcpyHtoD_v2 and cuLaunchKernel are each reported once (not Flyt's own calls)."""
        driver_expected = [
            ("cuMemcpyHtoD_v2.calls", "2"), ("cuMemcpyHtoD_v2.paired", "1"),
            ("cuLaunchKernel.calls", "2"), ("cuLaunchKernel.paired", "1"),
            ("cuDeviceGet.calls", "2"), ("cuDeviceGet.paired", "1"),
            ("cuCtxSynchronize.calls", "0"), ("cuMemcpyHtoD.params_bytes", "4096"),
            ("cuLaunchKernel.params_grid", "2"), ("cuLaunchKernel.params_f", "1"),
            ("driver.names", "3"), ("driver.exit_results_ok", "1"),
            ("cuDeviceGet.params_ordinal", "9999"),
            ("cuDeviceGet.exit_result", "CUDA_ERROR_INVALID_DEVICE"),
            ("cuDeviceGet.caller_result", "CUDA_ERROR_INVALID_DEVICE"),
            ("driver.nested_callbacks", "2"), ("driver.nested_result", "CUDA_SUCCESS"),
            ("driver.context_ok", "1"), ("cuLaunchKernel.symbol_ok", "1"),
            ("driver.nested_launch_shares_runtime_id", "1"),
            ("driver.nested_memcpy_shares_runtime_id", "1"),
            ("record.kernel_of_driver_launch", "1"), ("record.copy_of_driver_memcpy", "1"),
            ("record.driver_launch", "1"), ("record.driver_memcpy", "1"),
            ("record.driver_launch_of_runtime_launch", "0"),
            ("record.driver_failed_device_get", "1"), ("record.driver_ctx_sync", "0"),
            ("name.driver_launch", "cuLaunchKernel"),
            ("name.runtime_memcpy", "cudaMemcpy_v3020")]
        for variant, transport in self.matrix():
            for mode in ((), ("driver",), ("driver_all",)):
                with self.subTest(variant=variant, transport=transport, mode=mode):
                    srv = self.start_server()
                    res = self.run_ok(srv, transport, "cupti_callbacks", variant, args=mode,
                                      log_level="warn")
                    kv = self.kv(res)
                    where = res.describe()
                    expected = [("under_flyt", "1"), ("cudaMemcpy.params_count", "262144"),
                                ("cudaMemcpy.params_kind", "1"),
                                ("cudaMalloc.exit_result_ok", "1"),
                                ("record.runtime_launch", "1"), ("record.runtime_memcpy", "1"),
                                ("record.kernel_of_runtime_launch", "1"),
                                ("record.copy_of_runtime_memcpy", "1"), ("record.times_ok", "1")]
                    for name in ("cudaMalloc", "cudaMemcpy", "cudaLaunchKernel",
                                 "cudaDeviceSynchronize", "cudaFree"):
                        expected += [(name + ".calls", "1"), (name + ".paired", "1")]
                    if mode == ("driver",):
                        expected += driver_expected
                    if mode == ("driver_all",):
                        expected += [("driver_all.nesting_ok", "1"), ("driver_all.records_ok", "1"),
                                     ("driver_all.calls_in_runtime_calls", "1"),
                                     ("driver_all.cuCtxGetCurrent", "1"),
                                     ("driver_all.cuMemcpyHtoD_v2", "2"),
                                     ("driver_all.cuLaunchKernel", "2"),
                                     ("driver_all.cuDeviceGet", "2"),
                                     ("driver_all.cuMemAlloc_v2", "1"),
                                     ("driver_all.cuMemFree_v2", "1")]
                    for key, want in expected:
                        self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
                    self.stop_server(srv)

    def test_jit_link(self):
        """The JIT linker (cuLinkCreate/AddData/AddFile/Complete/Destroy, also the 5.5
        ABIs): jit_link's own checks over every transport and cudart: a PTX string linked
        with log buffers (the info log comes back, the error log stays empty), the cubin
        loaded and launched and unchanged until cuLinkDestroy; a PTX file through
        cuLinkAddFile; garbage PTX fails at cuLinkAddData with an error log; a destroyed
        state is refused. A state the client leaves is destroyed by the server."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "jit_link", variant, log_level="warn")
                kv = self.kv(res)
                where = res.describe()
                for key, want in (("under_flyt", "1"), ("data.launched", "1"),
                                  ("file.launched", "1"), ("bad.error", "CUDA_ERROR_INVALID_PTX"),
                                  ("missing.error", "CUDA_ERROR_FILE_NOT_FOUND"),
                                  ("misuse", "ok")):
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
                # The sim's fixed log lines came through the server's buffers.
                self.assertEqual(kv.get("data.info_log"), "info    : sim: linked 1 inputs", where)
                self.assertEqual(kv.get("data.cubin_bytes"), kv.get("file.cubin_bytes"), where)
                self.assertIn("is not PTX", kv.get("bad.error_log", ""), where)
                self.stop_server(srv)

        srv = self.start_server(control=True)
        res = self.run_ok(srv, CFG.transports[0], "jit_link", CFG.variants[0], args=("leak",))
        self.assertIn("leaving", res.stdout, res.describe())
        self.assert_stats(srv, sessions=0)
        self.assertRegex(srv.log_text(), r"destroyed 1 JIT link states",
                         "the server did not destroy the link state left behind\n" + srv.logs())
        self.stop_server(srv)

    def test_stream_memops(self):
        """Stream memory operations over every transport and cudart: a 32-bit write on
        one stream releases an EQ wait on another and the work queued after the wait ran;
        GEQ across wrap-around, AND and NOR waits; 64-bit write and GEQ wait; a batch
        (cuStreamBatchMemOp) of writes, a wait and a barrier; a misaligned address,
        unknown flags and an unknown batch operation refused at the call."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "stream_memops", variant, log_level="warn")
                kv = self.kv(res)
                for key, want in (("attr.64_bit_mem_ops", "1"), ("eq.after_wait", "1"),
                                  ("value32", "2"), ("value64", str((1 << 40) + 5)),
                                  ("ge64.after_wait", "2"),
                                  ("batch.value32", "41"), ("batch.value64", str(1 << 33)),
                                  ("batch.unknown_op", "CUDA_ERROR_INVALID_VALUE"),
                                  ("write32_no_barrier", "CUDA_ERROR_INVALID_VALUE"),
                                  ("write64_no_barrier", "CUDA_ERROR_INVALID_VALUE"),
                                  ("misaligned_write", "CUDA_ERROR_INVALID_VALUE"),
                                  ("bad_write_flags", "CUDA_ERROR_INVALID_VALUE"),
                                  ("bad_wait_flags", "CUDA_ERROR_INVALID_VALUE")):
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, res.describe()))
                self.stop_server(srv)

    def test_migrate(self):
        """A program that keeps allocating, copying, launching and freeing is migrated from
        server A to B and back, a migration to a dead target leaves it running on its
        source, it is checkpointed and its server restarted and restored from the file; its
        output equals an undisturbed run's, and every server ends with nothing held."""
        steps, pause = "40", "60"
        for i, variant in enumerate(CFG.variants):
            # Every other variant with movable memory (session_movable.cc): memory the
            # session maps in a reservation of its own, far from the driver's.
            movable = ["--movable-memory"] if i % 2 == 1 else []
            with self.subTest(variant=variant, movable=bool(movable)):
                a = self.start_server(control=True, extra_args=movable)
                b = self.start_server(control=True, extra_args=movable)
                base = self.run_ok(a, "tcp", "migrate_loop", variant, args=(steps, "0"))
                expected = [l for l in base.lines() if l.startswith("step ")]
                self.assertEqual(len(expected), int(steps), base.describe())
                prog = RunningProgram(self.tmp, a, "tcp", program_path("migrate_loop", variant),
                                      (steps, pause))
                ckpt = os.path.join(self.tmp, "ckpt-" + variant)
                os.makedirs(ckpt)
                restarted = None
                try:
                    def reach(pattern):
                        self._reach(prog, "migrate_loop", pattern)

                    def moved(srv, verb, key, **extra):
                        request = {"verb": verb, "wait_ms": 20000}
                        request.update(extra)
                        answer = srv.control(request, timeout=30)
                        self.assertTrue(answer.get("ok"), "%s\n%s" % (answer, srv.logs()))
                        self.assertEqual(answer.get("asked"), 1, "%s\n%s" % (answer, srv.logs()))
                        return answer.get(key), answer
                    reach(r"^step 3 ")
                    n, answer = moved(a, "migrate", "moved", to=b.url("tcp"), token=TOKEN)
                    self.assertEqual(n, 1, "%s\n%s\n%s" % (answer, a.logs(), b.logs()))
                    reach(r"^step 9 ")
                    self.assert_stats(b, sessions=1)
                    n, answer = moved(b, "migrate", "moved", to=a.url("tcp"), token=TOKEN)
                    self.assertEqual(n, 1, "%s\n%s\n%s" % (answer, a.logs(), b.logs()))
                    reach(r"^step 15 ")
                    # A target that is not there: the program stays where it is.
                    dead = "tcp://127.0.0.1:%d" % free_tcp_port()
                    n, answer = moved(a, "migrate", "moved", to=dead, token=TOKEN)
                    self.assertEqual((n, answer.get("stayed")), (0, 1), answer)
                    self.assertIn("failed", answer["sessions"][0]["message"], answer)
                    # A wrong token at the target: refused there, the program stays.
                    n, answer = moved(a, "migrate", "moved", to=b.url("tcp"), token="wrong")
                    self.assertEqual((n, answer.get("stayed")), (0, 1), answer)
                    self.assertIn("token", answer["sessions"][0]["message"], answer)
                    reach(r"^step 21 ")
                    # Checkpoint, then the server goes away; a new one on the same port
                    # restores the file and the program goes on there.
                    n, answer = moved(a, "checkpoint", "checkpointed", dir=ckpt)
                    self.assertEqual(n, 1, "%s\n%s" % (answer, a.logs()))
                    files = os.listdir(ckpt)
                    self.assertEqual(len(files), 1, files)
                    self.assertTrue(files[0].endswith(".flyt"), files)
                    restarted = self._restart_and_restore(a, ckpt, name="restarted-" + variant,
                                                          extra_args=movable)
                finally:
                    res = prog.finish()
                self.assert_passed(res, "migrate_loop", restarted or a)
                got = [l for l in res.lines() if l.startswith("step ")]
                self.assertEqual(got, expected, res.describe())
                keep_at = int(self.kv(res).get("keep_at", "0"), 16)
                if movable:  # in one of the reservation slots (session_movable.cc)
                    self.assertTrue(0x100000000000 <= keep_at < 0x500000000000, hex(keep_at))
                log = res.client_log
                self.assertEqual(log.count("now lives at flyt-server"), 3, log)
                for srv in (b, restarted):
                    self.assert_stats(srv, sessions=0, memory_used=0)
                self.stop_server(b)
                self.stop_server(restarted)
    def test_migrate_idle(self):
        """A process that makes no CUDA call while it is moved (it sleeps between steps) is
        told through its callback channel to park (servers with --movable-memory offer it),
        so the move completes at once rather than at its next call; its output equals an
        undisturbed run's."""
        variant = CFG.variants[0]
        a = self.start_server(control=True, extra_args=["--movable-memory"])
        b = self.start_server(control=True, extra_args=["--movable-memory"])
        steps, pause = "3", "8000"
        base = self.run_ok(a, "tcp", "migrate_loop", variant, args=(steps, "0"))
        expected = [l for l in base.lines() if l.startswith("step ")]
        prog = RunningProgram(self.tmp, a, "tcp", program_path("migrate_loop", variant),
                              (steps, pause))
        try:
            if prog.wait_line(r"^step 1 ") is None:
                self.fail("migrate_loop never printed step 1\n%s" % prog.finish(5).describe())
            t0 = time.monotonic()
            answer = a.control({"verb": "migrate", "to": b.url("tcp"), "token": TOKEN,
                                "wait_ms": 6000}, timeout=30)
            took = time.monotonic() - t0
            self.assertEqual(answer.get("moved"), 1, "%s\n%s\n%s" % (answer, a.logs(), b.logs()))
            # Before the program's next call (it sleeps 8 s after each step; a
            # loaded CI machine gets most of that).
            self.assertLess(took, 7.0, answer)
            self.assert_stats(b, sessions=1)
        finally:
            res = prog.finish()
        self.assert_passed(res, "migrate_loop", b)
        self.assertEqual([l for l in res.lines() if l.startswith("step ")], expected,
                         res.describe())
        self.assert_stats(a, sessions=0, memory_used=0)
        self.stop_server(a)
        self.stop_server(b)

    def test_migrate_shm_pinned(self):
        """migrate_loop over shm:// uploading and reading back through a pinned buffer
        (cudaMallocHost, which the server maps): moved to B's shm:// address and back (the
        buffer shared with each server again), checkpointed and restored by a restarted
        server, then moved to B over tcp:// (the program's own memory there; copies take the
        socket). Before, such a session was refused a move. Then the same program, having
        asked for the buffer's device pointer (a kernel may read it there), is refused a
        move and goes on where it is."""
        res = self._move_there_and_back("shm", CFG.variants[0], ("0", "pinned"), [],
                                        "ckpt-shm-pinned", program="migrate_loop",
                                        then_to="tcp")
        log = res.client_log
        self.assertEqual(log.count("pinned buffers shared with the new server again"), 3, log)
        self.assertEqual(log.count("are this process's own memory after the move"), 1, log)
        a = self.start_server(control=True)
        b = self.start_server(control=True)
        prog = RunningProgram(self.tmp, a, "shm", program_path("migrate_loop", CFG.variants[0]),
                              ("6", "300", "0", "pinned-mapped"))
        try:
            if prog.wait_line(r"^step 1 ") is None:
                self.fail("migrate_loop never printed step 1\n%s" % prog.finish(5).describe())
            n, answer = self._migrate_answer(a, "migrate", "moved", to=b.url("shm"),
                                             token=TOKEN)
            self.assertEqual((n, answer.get("stayed")), (0, 1), answer)
            self.assertIn("pinned host memory mapped for the GPU",
                          answer["sessions"][0]["message"], answer)
        finally:
            res = prog.finish()
        self.assert_passed(res, "migrate_loop", a)
        self.assertIn("pinned device pointer asked", res.stdout, res.describe())
        for srv in (a, b):
            self.assert_stats(srv, sessions=0, memory_used=0)
        self.stop_server(a)
        self.stop_server(b)

    def test_migrate_two_servers(self):
        """A process using the GPUs of two servers (FLYT_SERVER "A,B"; migrate_loop
        two-servers: its loop on B's GPU, a mirror of its kept buffer on A's, copied server
        to server and read back every step) moves one server's part at a time, each at its
        own addresses slot: B's session to C, then A's to D, then C's is checkpointed and
        restored by C restarted at its address. Its output equals an undisturbed run's, the
        client says three times where a part lives now, and every server ends holding
        nothing. Before, such a process was refused a move."""
        variant = CFG.variants[0]
        a, b, c, d = (self.start_server(control=True) for _ in range(4))
        args = ("16", "0", "0", "two-servers")
        base = self.run_ok(self._Servers([a, b]), "tcp", "migrate_loop", variant, args=args)
        expected = [l for l in base.lines() if l.startswith("step ")]
        self.assertEqual(len(expected), 16, base.describe())
        prog = RunningProgram(self.tmp, self._Servers([a, b]), "tcp",
                              program_path("migrate_loop", variant),
                              ("16", "80", "0", "two-servers"))
        ckpt = os.path.join(self.tmp, "ckpt-two-servers")
        os.makedirs(ckpt)
        restarted = None
        try:
            def reach(pattern):
                self._reach(prog, "migrate_loop", pattern)
            reach(r"^step 2 ")
            n, answer = self._migrate_answer(b, "migrate", "moved", to=c.url("tcp"), token=TOKEN)
            self.assertEqual(n, 1, "%s\n%s\n%s" % (answer, b.logs(), c.logs()))
            reach(r"^step 5 ")
            n, answer = self._migrate_answer(a, "migrate", "moved", to=d.url("tcp"), token=TOKEN)
            self.assertEqual(n, 1, "%s\n%s\n%s" % (answer, a.logs(), d.logs()))
            reach(r"^step 8 ")
            n, answer = self._migrate_answer(c, "checkpoint", "checkpointed", dir=ckpt)
            self.assertEqual(n, 1, "%s\n%s" % (answer, c.logs()))
            restarted = self._restart_and_restore(c, ckpt)
        finally:
            res = prog.finish()
        self.assert_passed(res, "migrate_loop", restarted or c)
        self.assertEqual([l for l in res.lines() if l.startswith("step ")], expected,
                         res.describe())
        self.assertEqual(res.client_log.count("now lives at flyt-server"), 3, res.client_log)
        for srv in (a, b, d, restarted):
            self.assert_stats(srv, sessions=0, memory_used=0)
        for srv in (a, b, d, restarted):
            self.stop_server(srv)

    def _migrate_answer(self, srv, verb, key, **extra):
        """Sends a move verb to srv's control socket; (answer[key], answer)."""
        request = {"verb": verb, "wait_ms": 20000}
        request.update(extra)
        answer = srv.control(request, timeout=30)
        self.assertTrue(answer.get("ok"), "%s\n%s" % (answer, srv.logs()))
        self.assertEqual(answer.get("asked"), 1, "%s\n%s" % (answer, srv.logs()))
        return answer.get(key), answer

    def _reach(self, prog, program, pattern):
        """Waits for the running `program`'s line matching `pattern`; fails with its output
        when it ends or times out first."""
        if prog.wait_line(pattern) is None:
            self.fail("%s never printed %s\n%s" % (program, pattern, prog.finish(5).describe()))

    def _restart_and_restore(self, srv, ckpt, name=None, extra_args=()):
        """Stops `srv` and starts a server at its port (named `name`, else srv's: the same
        Unix and shm sockets, where such a client waits) that restores the checkpoint in
        `ckpt`: one session must come back. Returns the new server."""
        port, name = srv.port, name if name is not None else srv.name
        self.stop_server(srv)
        restarted = self.start_server(control=True, port=port, name=name, extra_args=extra_args)
        answer = restarted.control({"verb": "restore", "dir": ckpt, "wait_ms": 20000},
                                   timeout=30)
        self.assertTrue(answer.get("ok"), answer)
        self.assertEqual(answer.get("restored"), 1, "%s\n%s" % (answer, restarted.logs()))
        return restarted

    def _move_there_and_back(self, transport, variant, parts, movable, ckpt_name,
                             restart_name=None, program="migrate_state", then_to=None):
        """`program` (migrate_state or migrate_loop) with `parts` after its steps and pause,
        under way on server A (flyt-server `movable` options), the client on `transport`:
        moved A to B at step 2 and back at step 5, checkpointed at step 8, A stopped and
        restarted at its address (named `restart_name`, else A's name: the same Unix socket,
        where a unix:// client waits) and the checkpoint restored there; with `then_to`,
        moved to B's address of that transport at step 10. Its step lines must equal an
        undisturbed run's, the client must say at each move where it lives now, and every
        server must end holding nothing. Returns the program's result."""
        steps, pause = "12", "50"
        a = self.start_server(control=True, extra_args=movable)
        b = self.start_server(control=True, extra_args=movable)
        base = self.run_ok(a, transport, program, variant, args=(steps, "0") + parts)
        expected = [l for l in base.lines() if l.startswith("step ")]
        self.assertEqual(len(expected), int(steps), base.describe())
        prog = RunningProgram(self.tmp, a, transport, program_path(program, variant),
                              (steps, pause) + parts)
        ckpt = os.path.join(self.tmp, ckpt_name)
        os.makedirs(ckpt)
        restarted = None
        try:
            def reach(pattern):
                self._reach(prog, program, pattern)
            reach(r"^step 2 ")
            n, answer = self._migrate_answer(a, "migrate", "moved", to=b.url(transport),
                                             token=TOKEN)
            self.assertEqual(n, 1, "%s\n%s\n%s" % (answer, a.logs(), b.logs()))
            reach(r"^step 5 ")
            n, answer = self._migrate_answer(b, "migrate", "moved", to=a.url(transport),
                                             token=TOKEN)
            self.assertEqual(n, 1, "%s\n%s\n%s" % (answer, a.logs(), b.logs()))
            reach(r"^step 8 ")
            n, answer = self._migrate_answer(a, "checkpoint", "checkpointed", dir=ckpt)
            self.assertEqual(n, 1, "%s\n%s" % (answer, a.logs()))
            restarted = self._restart_and_restore(a, ckpt, name=restart_name, extra_args=movable)
            if then_to is not None:
                reach(r"^step 10 ")
                n, answer = self._migrate_answer(restarted, "migrate", "moved",
                                                 to=b.url(then_to), token=TOKEN)
                self.assertEqual(n, 1, "%s\n%s\n%s" % (answer, restarted.logs(), b.logs()))
        finally:
            res = prog.finish()
        self.assert_passed(res, program, restarted or a)
        got = [l for l in res.lines() if l.startswith("step ")]
        self.assertEqual(got, expected, res.describe())
        self.assertEqual(res.client_log.count("now lives at flyt-server"),
                         3 if then_to is None else 4, res.client_log)
        for srv in (b, restarted):
            self.assert_stats(srv, sessions=0, memory_used=0)
        self.stop_server(b)
        self.stop_server(restarted)
        return res

    def test_migrate_state(self):
        """migrate_state keeps VMM memory (a growing reservation, a read-only chunk, an
        allocation mapped twice and released while mapped) and CUDA graphs (captured and
        built by hand, executable graphs changed in place: a memset value, a node disabled
        and enabled again, a kernel's arguments, cudaGraphExecUpdate) busy while it is
        migrated A to B and back and checkpointed, its server restarted and restored, while
        it also allocates and frees stream-ordered memory (cudaMallocAsync/cudaFreeAsync) and
        holds texture objects (test_migrate_textures); its step lines equal an undisturbed
        run's (counters a kernel counts down in VMM memory
        and in graphs, host copies and host functions of graphs), the handles it holds
        still answer queries, and every server ends with nothing held. With
        --movable-memory (the app's reservations and stream-ordered allocations move only
        from there), and once more for graphs alone without it."""
        runs = [(variant, ["--movable-memory"], ()) for variant in CFG.variants]
        runs.append((CFG.variants[0], [], ("graphs",)))
        for variant, movable, parts in runs:
            with self.subTest(variant=variant, movable=bool(movable), parts=parts):
                self._move_there_and_back(
                    "tcp", variant, parts, movable,
                    "ckpt-state-%s-%d" % (variant, len(movable)),
                    restart_name="restarted-state-" + variant)

    def test_migrate_pools(self):
        """migrate_state's memory pools (the default pool and one it created, with
        attributes; cudaMallocAsync and cudaMallocFromPoolAsync, frees in stream order, a
        kernel counting down in pool memory, a trim, the device's current pool changed and
        changed back, a pool destroyed while memory of it lives) with its plain
        stream-ordered allocations, on servers with --movable-memory, the client on tcp://
        and on unix://: migrated A to B and back over that transport, then checkpointed,
        its server restarted at the same address (and name: the same Unix socket, where the
        client waits) and restored; its step lines equal an undisturbed run's (the program
        itself checks the pool handles, attributes, the pool of a pointer and the
        used/reserved figures after each move), and every server ends with nothing held."""
        for transport in ("tcp", "unix"):
            with self.subTest(transport=transport):
                self._move_there_and_back(transport, CFG.variants[0], ("pools", "async"),
                                          ["--movable-memory"], "ckpt-pools-" + transport)

    def test_migrate_textures(self):
        """migrate_state's texture objects (over linear and pitch-2D memory, the second of
        four destroyed so that the values have a hole) moved A to B and back and
        checkpointed, its server restarted and restored: the program checks after every
        step that each value it holds still reads back its descriptors (device pointer,
        size, pitch, address mode) and that the memory under them moved; its step lines
        equal an undisturbed run's. Without --movable-memory (cuMemAlloc memory at its
        addresses) and with it."""
        for variant, movable in ((CFG.variants[0], []), (CFG.variants[-1], ["--movable-memory"])):
            with self.subTest(variant=variant, movable=bool(movable)):
                self._move_there_and_back("tcp", variant, ("textures",), movable,
                                          "ckpt-tex-%s-%d" % (variant, len(movable)),
                                          restart_name="restarted-tex-" + variant)

    def test_migrate_textures_target_differs(self):
        """A target whose driver hands out texture object values otherwise (the sim with
        --sim-texture-base 100) refuses the restore, saying which value came out as what;
        the program goes on on its source and ends well, its step lines equal to an
        undisturbed run's, and the target holds nothing."""
        variant = CFG.variants[0]
        a = self.start_server(control=True)
        b = self.start_server(control=True, extra_args=["--sim-texture-base", "100"])
        args = ("6", "50", "textures")
        base = self.run_ok(a, "tcp", "migrate_state", variant, args=("6", "0", "textures"))
        expected = [l for l in base.lines() if l.startswith("step ")]
        prog = RunningProgram(self.tmp, a, "tcp", program_path("migrate_state", variant), args)
        try:
            if prog.wait_line(r"^step 1 ") is None:
                self.fail("migrate_state never printed step 1\n%s" % prog.finish(5).describe())
            n, answer = self._migrate_answer(a, "migrate", "moved", to=b.url("tcp"), token=TOKEN)
            self.assertEqual((n, answer.get("stayed")), (0, 1), answer)
            message = answer["sessions"][0]["message"]
            self.assertIn("the target refused it", message, answer)
            self.assertIn("texture object 1 came out as 100", message, answer)
        finally:
            res = prog.finish()
        self.assert_passed(res, "migrate_state", a)
        self.assertEqual([l for l in res.lines() if l.startswith("step ")], expected,
                         res.describe())
        self.assert_stats(b, sessions=0, memory_used=0)
        self.assert_stats(a, sessions=0, memory_used=0)
        self.stop_server(a)
        self.stop_server(b)

    def test_restore_old_format(self):
        """A checkpoint written in another snapshot format (format 1, before graphs and VMM
        moved) is refused at restore with a message that names both formats; the server
        goes on and holds nothing of it."""
        srv = self.start_server(control=True)
        ckpt = tempfile.mkdtemp(dir=self.tmp)
        with open(os.path.join(ckpt, "session-7.flyt"), "wb") as f:
            # magic "FLYTSNAP", format 1, then what a format 1 header held
            f.write(struct.pack("<QI", 0x50414e5354594c46, 1) + bytes(64))
        answer = srv.control({"verb": "restore", "dir": ckpt, "wait_ms": 20000}, timeout=30)
        self.assertTrue(answer.get("ok"), answer)
        self.assertEqual(answer.get("restored"), 0, answer)
        messages = json.dumps(answer) + srv.log_text()
        self.assertIn("format 1", messages, answer)
        self.assertIn("reads only format 6", messages, answer)
        self.assert_stats(srv, sessions=0, memory_used=0)
        self.stop_server(srv)

    def test_migrate_refusals(self):
        """What cannot move is refused at the park, saying why, and the program goes on
        where it is: a graph with a memory allocation node, a graph with a conditional
        node, a VMM reservation at a fixed address outside the session's movable range, an
        allocation from a memory pool made for export, a surface object, a texture object
        over a CUDA array (--movable-memory; textures over linear memory move:
        test_migrate_textures); any VMM reservation and a cudaMallocAsync allocation on a
        server without --movable-memory. Once that state is gone the same program moves,
        and ends well on the target."""
        variant = CFG.variants[0]
        cases = (
            (["--movable-memory"], (("graph-alloc", "memory allocation or free node"),
                                    ("graph-cond", "conditional node"),
                                    ("pool-ipc", "made for export to other processes"),
                                    ("vmm-fixed", "outside its movable range"),
                                    ("surface", "surface objects"),
                                    ("texture-array", "texture objects over CUDA arrays"))),
            ([], (("vmm", "--movable-memory"), ("async", "--movable-memory"))),
        )
        for movable, phases in cases:
            with self.subTest(movable=bool(movable)):
                a = self.start_server(control=True, extra_args=movable)
                b = self.start_server(control=True, extra_args=movable)
                gate = tempfile.mkdtemp(dir=self.tmp)
                prog = RunningProgram(self.tmp, a, "tcp", program_path("migrate_state", variant),
                                      ("refuse", gate) + tuple(p for p, _ in phases))
                try:
                    for phase, why in phases:
                        if prog.wait_line(r"^phase %s ready" % phase) is None:
                            self.fail("no phase %s\n%s" % (phase, prog.finish(5).describe()))
                        n, answer = self._migrate_answer(a, "migrate", "moved",
                                                         to=b.url("tcp"), token=TOKEN)
                        self.assertEqual((n, answer.get("stayed")), (0, 1), answer)
                        message = answer["sessions"][0]["message"]
                        self.assertIn("cannot move", message, answer)
                        self.assertIn(why, message, answer)
                        open(os.path.join(gate, phase), "w").close()
                    if prog.wait_line(r"^phase end ready") is None:
                        self.fail("no end phase\n%s" % prog.finish(5).describe())
                    n, answer = self._migrate_answer(a, "migrate", "moved", to=b.url("tcp"),
                                                     token=TOKEN)
                    self.assertEqual(n, 1, "%s\n%s\n%s" % (answer, a.logs(), b.logs()))
                    # The idle program is nudged over to b; it must be there before it may
                    # end (a process that exits first leaves b a restored session that
                    # waits for it until the restore times out).
                    deadline = time.monotonic() + 20
                    while "resumed from" not in b.log_text() and time.monotonic() < deadline:
                        time.sleep(0.05)
                    self.assertIn("resumed from", b.log_text(), b.logs())
                    open(os.path.join(gate, "end"), "w").close()
                finally:
                    res = prog.finish()
                self.assert_passed(res, "migrate_state", b)
                for srv in (a, b):
                    self.assert_stats(srv, sessions=0, memory_used=0)
                self.stop_server(a)
                self.stop_server(b)

    DRIVER_QUERIES_EXPECTED = (
        ("under_flyt", "1"), ("kernel.library_same", "1"),
        ("kernel.library_null_out", "CUDA_ERROR_INVALID_VALUE"),
        ("library_module.found", "1"), ("library_module.stable", "1"),
        ("library_module.null_out", "CUDA_ERROR_INVALID_VALUE"),
        ("library_module.get_function", "CUDA_SUCCESS"),
        ("library_module.function_is_kernel_function", "1"),
        ("kernel_function.module_is_library_module", "1"),
        ("library_module.unload", "CUDA_ERROR_NOT_PERMITTED"),
        ("library_module.after_refused_unload", "CUDA_SUCCESS"),
        ("module_function.module_same", "1"),
        ("func_module.null_out", "CUDA_ERROR_INVALID_VALUE"),
        ("get_params.func_same", "1"), ("get_params.grid", "4,1,1"),
        ("get_params.block", "256,1,1"), ("get_params.shared", "0"),
        ("get_params.form", "kernelParams"), ("get_params.arg0_same", "1"),
        ("get_params.arg1", "1000"), ("get_params_v1.func_same", "1"),
        ("get_params_v1.arg1", "7"), ("get_params.null_out", "CUDA_ERROR_INVALID_VALUE"),
        ("extra.form", "extra"), ("extra.keys", "2,1,0"), ("extra.arg1", "33"),
        ("attr.cooperative", "1"), ("attr.before_copy", "0"),
        # As the H200 answered natively: not into a node whose arguments came by `extra`.
        ("attr.copy", "CUDA_ERROR_INVALID_VALUE"), ("attr.copied", "0"),
        ("attr.copy_other_graph", "CUDA_SUCCESS"), ("attr.copy_same_graph", "CUDA_SUCCESS"),
        ("attr.of_memset_node", "CUDA_ERROR_INVALID_VALUE"),
        ("instantiate.result", "0"), ("instantiate.err_node_null", "1"),
        ("instantiate.upload_flags", "0"), ("instantiate.auto_free_flags", "1"),
        ("instantiate.null_params", "CUDA_ERROR_INVALID_VALUE"),
        ("instantiate_v11.flags", "0"), ("instantiate_v11.err_node_null", "1"),
        ("event.record_set", "1"), ("event.wait_set", "1"),
        ("event.set_on_host_node", "CUDA_ERROR_INVALID_VALUE"),
        ("exec_host.new_ran", "1"), ("exec_host.old_ran", "0"),
        ("exec_host.graph_node_unchanged", "1"), ("exec_event.recorded", "cudaSuccess"),
        ("ctx_flags.sched_after_set", "4"), ("ctx_flags.bogus", "CUDA_ERROR_INVALID_VALUE"),
        ("ctx_flags.restored", "1"), ("exec_affinity.type", "0"),
        ("exec_affinity.is_device_sms", "1"), ("exec_affinity.null", "CUDA_ERROR_INVALID_VALUE"),
        # The sim's link: integer operations signed and unsigned, 32 and 64 bits (27);
        # float operations 32 and 64 bits (24).
        ("host_atomics.result", "CUDA_SUCCESS"), ("host_atomics.caps", "27,27,24"),
        ("host_atomics.count0", "CUDA_ERROR_INVALID_VALUE"),
        ("host_atomics.bad_device", "CUDA_ERROR_INVALID_DEVICE"),
        ("host_atomics.bad_op", "CUDA_ERROR_INVALID_VALUE"),
        ("pointer.sync_before", "0"), ("pointer.sync_after", "1"),
        ("pointer.malloc", "ipc1,rdma_as_device1,access3,pool0"),
        ("pointer.malloc_async", "ipc0,rdma0,access3,default_pool1"),
        ("batch.ok", "1"), ("batch.legacy_stream", "1"), ("batch.first_index_not_0", "1"),
        ("batch.bad_order", "1"),
        ("pointer.set_host_stack", "CUDA_ERROR_INVALID_VALUE"),
        ("cluster_size.result", "CUDA_SUCCESS"), ("cluster_size", "8"),
        ("cluster_size.null_config", "CUDA_ERROR_INVALID_VALUE"),
        ("v1.enabled", "1"), ("v1.write32", "CUDA_SUCCESS"), ("v1.value32", "5"),
        ("v1.value64", str((1 << 36) + 3)), ("v1.batch_value", "21"),
        ("v1.misaligned", "CUDA_ERROR_INVALID_VALUE"))

    def test_driver_queries(self):
        """Driver calls about handles, graph kernel nodes, contexts and older ABIs
        (driver_queries.cu) over every transport and cudart: a kernel's library, a
        library's module (its function is the kernel's function, unloading it alone is
        CUDA_ERROR_NOT_PERMITTED and leaves it working), a module function's module;
        kernel node parameters (CUDA 12 and 11 ABIs) with the argument values the node
        holds, in the form last set (kernelParams or an extra buffer); kernel node
        attributes set, read, copied, refused on a memset node;
        cuGraphInstantiateWithParams (result, flags without UPLOAD), the CUDA 11
        cuGraphInstantiate; an executable graph's host node and event changed (the new
        callback runs, the old does not, the graph's node keeps its own); event nodes'
        events changed; cuCtxSetFlags read back by cuCtxGetFlags; cuCtxGetExecAffinity;
        host atomic capabilities and their errors; SYNC_MEMOPS set on device memory and
        read back, refused on a host address; cuOccupancyMaxPotentialClusterSize; the
        pre-11.7 stream memory operations (single and batched). The server holds
        nothing of the client afterwards."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server(control=True)
                res = self.run_ok(srv, transport, "driver_queries", variant, log_level="warn")
                kv = self.kv(res)
                where = res.describe()
                for key, want in self.DRIVER_QUERIES_EXPECTED:
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
                self.assertNotIn("not supported", res.stderr + res.client_log, where)
                self.assert_stats(srv, sessions=0, memory_used=0)
                self.stop_server(srv)

    P2P_EXPECTED = (
        ("device_count", "2"), ("device0.unified_addressing", "1"), ("distinct_uuid", "1"),
        ("distinct_pci", "1"), ("by_pci_bus_id", "1"), ("can_access.0_1", "1"),
        ("can_access.1_0", "1"), ("can_access.self", "0"), ("p2p_attr.access_supported", "1"),
        ("p2p_attr.performance_rank", "0"), ("p2p_atomic_caps.int_add", "0"),
        ("p2p_atomic_caps.float_add", "0"), ("pointer_device.0", "0"),
        ("pointer_device.1", "1"), ("current_after_switch", "1"), ("enable.both_ways", "1"),
        ("enable.self", "refused"), ("peer_copies", "20"), ("memcpy_default", "ok"),
        ("stream1_device", "1"), ("streams_events", "ok"), ("disable.not_enabled", "refused"))

    def test_p2p_devices(self):
        """Two GPUs of one server in one process (p2p_devices.cu, as NVIDIA's simpleP2P and
        p2pBandwidthLatencyTest use them) against `--sim-devices 2` over every transport and
        cudart: distinct UUIDs and PCI bus ids, peer capability and P2P attributes from the
        server, peer access enabled both ways, cudaMemcpyPeer[Async] both directions at odd
        sizes, cudaMemcpyDefault between the devices, per-device streams and events with a
        cross-device wait, pointer attributes naming each allocation's device, the driver's
        errors (enabled twice, disabled when not enabled, the device itself, a bad ordinal).
        The server holds nothing of the client afterwards."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server(control=True, extra_args=["--sim-devices", "2"])
                res = self.run_ok(srv, transport, "p2p_devices", variant, log_level="warn")
                kv = self.kv(res)
                where = res.describe()
                for key, want in self.P2P_EXPECTED:
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
                self.assertNotIn("not supported", res.stderr + res.client_log, where)
                self.assert_stats(srv, sessions=0, memory_used=0)
                self.stop_server(srv)

    class _Servers:
        """Several servers reached as one comma-separated list (FLYT_SERVER "A,B")."""

        def __init__(self, servers):
            self.servers = servers

        def url(self, transport):
            return ",".join(s.url(transport) for s in self.servers)

        def __getattr__(self, name):
            return getattr(self.servers[0], name)

    MULTI_EXPECTED = (("device_count", "2"), ("bus_ids_distinct", "1"), ("uuids_distinct", "1"),
                      ("can_access.0_1", "0"), ("can_access.1_0", "0"),
                      ("p2p_attr.access", "0"), ("enable_peer", "refused"),
                      ("addresses_distinct", "1"), ("pointer_devices", "ok"),
                      ("host_copies", "ok"), ("kernels", "ok"), ("per_device_extras", "ok"),
                      ("other_device_handles", "ok"), ("copies_across", "ok"),
                      ("copies_two_threads", "ok"),
                      ("memory_back", "ok"))

    def test_multi_server(self):
        """The GPUs of two sim servers as one ordinal list (FLYT_SERVER "A,B", issue 19):
        multi_server.cu over every transport and cudart sees 2 devices with distinct PCI bus
        ids, peer capability 0 and peer access refused between them (as between GPUs without
        P2P), memory on each at distinct addresses, host copies and a kernel on each, the
        other device's streams, events and memory used while this one is current, and
        copies between the servers both ways (cudaMemcpyPeer[Async], cudaMemcpy[Async] with
        cudaMemcpyDefault) checked byte for byte. No call was refused, and neither server
        holds anything of the client afterwards."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                a = self.start_server(control=True)
                b = self.start_server(control=True)
                both = self._Servers([a, b])
                if transport == CFG.transports[0]:  # "A, B" is taken as "A,B"
                    both.url = lambda t, a=a, b=b: "%s, %s" % (a.url(t), b.url(t))
                res = self.run_ok(both, transport, "multi_server", variant, log_level="info")
                kv = self.kv(res)
                where = res.describe() + "\n" + b.logs()
                for key, want in self.MULTI_EXPECTED:
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
                self.assertNotIn("not supported", res.stderr + res.client_log, where)
                self.assertIn("2 servers, 2 GPU(s) in all", res.client_log, where)
                for srv in (a, b):
                    self.assert_stats(srv, sessions=0, memory_used=0)
                    self.stop_server(srv)

    def test_multi_server_three_gpus(self):
        """A two-GPU sim server and a one-GPU one as one list: ordinals 0 and 1 are the
        first server's and peers of each other (peer access enabled, a peer copy through the
        server's driver), 2 is the second's and no peer of either; copies between the servers
        both ways with each device current."""
        a = self.start_server(extra_args=["--sim-devices", "2"])
        b = self.start_server()
        both = self._Servers([a, b])
        res = self.run_ok(both, CFG.transports[0], "multi_server", CFG.variants[0], ["three"],
                          log_level="warn")
        kv = self.kv(res)
        where = res.describe()
        for key, want in (("device_count", "3"), ("can_access.0_1", "1"),
                          ("can_access.1_0", "1"), ("can_access.0_2", "0"),
                          ("can_access.2_1", "0"), ("copies", "ok")):
            self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
        self.assertNotIn("not supported", res.stderr + res.client_log, where)

    def test_multi_server_managed(self):
        """Managed memory on each server's GPU (multi_server.cu `managed`): distinct
        addresses, host writes read by the second server's kernel and its results read by
        the host, a device write beside a host write on one page, copies between the two
        servers' managed memory both ways, advice, prefetches, range attributes in the
        process's ordinals and stream attachment on the second server, each byte checked;
        a location on the other server's GPU refused each time and logged once, and the
        process goes on with that GPU. Over every transport (the paging channel is each
        server's own)."""
        a = self.start_server()
        b = self.start_server()
        both = self._Servers([a, b])
        for transport in CFG.transports:
            res = self.run_ok(both, transport, "multi_server", CFG.variants[0], ["managed"],
                              log_level="warn")
            kv = self.kv(res)
            where = res.describe()
            for key, want in (("managed0.fresh_first_not", "-1"),
                              ("managed1.fresh_first_not", "-1"), ("managed.distinct", "1"),
                              ("managed0.pointer", "managed/0"), ("managed1.pointer", "managed/1"),
                              ("managed1.kernel_first_bad", "-1"),
                              ("managed1.after_memset_diff", "-1"), ("managed0.diff", "-1"),
                              ("managed.copy_1_to_0_diff", "-1"),
                              ("managed.copy_0_to_1_diff", "-1"),
                              ("managed1.prefetch_diff", "-1"), ("managed1.range.preferred", "1"),
                              ("managed1.range.preferred_loc", "1/1"),
                              ("managed0.range.preferred", "0"), ("managed1.attach", "ok"),
                              ("managed1.other_gpu", "refused"), ("goes_on", "ok")):
                self.assertEqual(kv.get(key), want, "%s (%s)\n%s" % (key, transport, where))
            log = res.stderr + res.client_log
            self.assertEqual(log.count("cuMemAdvise_v2: its arguments belong to GPUs of two "
                                       "servers"), 1, where)
            self.assertNotIn("not served yet", log, where)

    def test_multi_server_later_gpu(self):
        """Calls once refused for a GPU of the second server, served there (multi_server.cu
        `later`): the JIT linker (a state stays on its server whichever device is current,
        its cubin loaded there), graphs built by hand on device 1 (memset, memcpy, kernel,
        host and empty nodes; list, types, dependencies, roots, kernel parameters; a child
        graph, event nodes, edges added and removed, a clone, nodes destroyed; launched, the
        copies and memset checked byte for byte, the host node ran once), TMA descriptors
        of device 1's memory, stream capture on device 1 (status, id, dependencies asked
        while it runs, a node added by hand made the next dependency, capture into a given
        graph; ended, launched, checked), virtual memory on device 1 (granularity, reserve, create, map, access,
        copies, a memset and a kernel through it, its handle retained, exported and
        imported again, properties naming device 1), stream memory operations on a stream
        of device 1 (single and batched), an IPC event of device 1 opened and recorded by a
        child process (memory handles refused on either device alike: placed memory), and
        2D/3D copies between the two servers' memory
        both ways (pitched, odd sizes, offsets, packed rows, a 3D box), byte for byte. Only
        calls mixing the two servers are refused (a graph, a capture's dependency, a
        mapping, access, a batch), each once in the log."""
        a = self.start_server(control=True)
        b = self.start_server(control=True)
        both = self._Servers([a, b])
        res = self.run_ok(both, CFG.transports[0], "multi_server", CFG.variants[0], ["later"],
                          log_level="warn")
        kv = self.kv(res)
        where = res.describe() + "\n" + b.logs()
        for key, want in (("link_on_second", "ok"), ("graph_nodes_on_second", "ok"),
                          ("graph_launch_on_second", "ok"), ("graph_two_servers", "refused"),
                          ("tensor_map_on_second", "ok"), ("copies_2d_across", "ok"),
                          ("occupancy_other_stream", "ok"), ("shared_opt_in_other_copy", "ok"),
                          ("capture_info_on_second", "ok"), ("capture_launch_on_second", "ok"),
                          ("vmm_map_on_second", "ok"), ("vmm_data_on_second", "ok"),
                          ("vmm_handles_on_second", "ok"), ("stream_memops_on_second", "ok"),
                          ("ipc_event_on_second", "ok"), ("ipc_child", "ok"),
                          ("capture_to_graph_on_second", "ok")):
            self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
        log = res.stderr + res.client_log
        self.assertNotIn("not served yet", log, where)
        for name in ("cuGraphAddEmptyNode", "cuStreamUpdateCaptureDependencies", "cuMemMap",
                     "cuMemSetAccess", "cuStreamBatchMemOp", "cuStreamBeginCaptureToGraph",
                     "cuStreamWriteValue32"):
            self.assertEqual(len(re.findall(r"%s\w*: its arguments belong to GPUs of two" % name,
                                            log)), 1, "%s\n%s" % (name, where))
        for srv in (a, b):
            self.assert_stats(srv, sessions=0, memory_used=0)
            self.stop_server(srv)

    def test_multi_server_tls(self):
        """Two servers reached over tls://: the client's links are encrypted, the servers'
        connection to each other would not be, so copies between them are refused
        (cudaErrorNotSupported, said once in the log) and each GPU goes on working."""
        f = self.make_tls_files()
        servers = []
        for _ in range(2):
            port = free_tcp_port()
            url = "tls://127.0.0.1:%d" % port
            srv = self.start_server(extra_args=["--listen", url, "--tls-cert", f("server.pem"),
                                                "--tls-key", f("server.key")])
            servers.append((srv, url))

        class Over:
            def url(self, transport):
                return ",".join(u for _, u in servers)

            def __getattr__(self, name):
                return getattr(servers[0][0], name)

        res = self.run_ok(Over(), "tls", "multi_server", CFG.variants[0], ["tls"],
                          extra={"FLYT_TLS_CA": f("ca.pem")}, log_level="warn")
        kv = self.kv(res)
        where = res.describe()
        for key, want in (("device_count", "2"), ("copies_across", "refused"),
                          ("own_devices", "ok")):
            self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
        self.assertEqual(res.client_log.count("copies between servers reached over tls://"), 1,
                         where)

    def _nccl_run(self, servers, transport, variant, args):
        """nccl_ranks through `flyt run` (Flyt's libnccl.so.2 preloaded); the run passed, said
        NCCL's version as the servers' NCCL gives it, refused nothing, and no server holds
        anything of the client afterwards."""
        res = self.run_ok(servers, transport, "nccl_ranks", variant, args, log_level="warn")
        where = res.describe()
        self.assertEqual(self.kv(res).get("version"), "22809", where)  # the sim's NCCL 2.28.9
        self.assertNotIn("not served", res.stderr + res.client_log, where)
        self.assertNotIn("ncclInvalidUsage", res.stderr + res.client_log, where)
        for srv in getattr(servers, "servers", [servers]):
            self.assert_stats(srv, sessions=0, memory_used=0)
        return res

    def test_nccl_ranks(self):
        """NCCL across the GPUs of two servers (issue 19): two rank processes, one per server,
        run every collective (all-reduce of each op and several types at odd sizes, broadcast,
        reduce, all-gather, reduce-scatter), a send/recv ring in a group, a PreMulSum op, a
        split and argument errors through Flyt's libnccl.so.2; the servers' NCCL (the sim's,
        whose ranks meet over TCP) computes them, and each rank checks every result. Over
        every transport and cudart."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                a = self.start_server(control=True)
                b = self.start_server(control=True)
                res = self._nccl_run(self._Servers([a, b]), transport, variant, ["ranks", "2"])
                kv = self.kv(res)
                self.assertEqual(kv.get("rank0.count"), "2", res.describe())
                self.assertEqual(kv.get("rank1.count"), "2", res.describe())
                for srv in (a, b):
                    self.stop_server(srv)

    def test_nccl_ranks_one_server(self):
        """Three rank processes on one two-GPU server (ranks 0 and 2 share a GPU), and one
        process driving both GPUs with ncclCommInitAll and one group."""
        srv = self.start_server(control=True, extra_args=["--sim-devices", "2"])
        transport, variant = CFG.transports[0], CFG.variants[0]
        self._nccl_run(srv, transport, variant, ["ranks", "3"])
        self._nccl_run(srv, transport, variant, ["single", "2"])

    def test_nccl_single_across_servers(self):
        """One process driving the GPUs of two servers: ncclCommInitAll makes one rank on
        each (an id, then a rank per device in one group, as NCCL does), and one group
        all-reduces on both."""
        a = self.start_server(control=True)
        b = self.start_server(control=True)
        self._nccl_run(self._Servers([a, b]), CFG.transports[0], CFG.variants[0],
                       ["single", "2"])

    def test_multi_server_nvml(self):
        """Flyt's NVML with two servers as one list (nvml_query peers 2): both servers' GPUs
        in CUDA's order with CUDA's PCI bus ids and distinct UUIDs (two sims, like two
        servers on one GPU, report the same one), P2P not supported and common ancestor
        "system" between them, as NVML says of GPUs of two machines."""
        prog = os.path.join(CFG.programs_dir, "nvml_query")
        a = self.start_server()
        b = self.start_server()
        res = run_program(self.tmp, self._Servers([a, b]), CFG.transports[0], prog,
                          ("peers", "2"), log_level="warn")
        self.assert_passed(res, "nvml_query", a)
        kv = self.kv(res)
        where = res.describe()
        for key, want in (("device_count", "2"), ("p2p_read_0_1", "5"),
                          ("p2p_write_1_0", "5"), ("p2p_nvlink_0_1", "5"),
                          ("topology_0_1", "50")):
            self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
        self.assertNotEqual(kv.get("bus_id.0"), kv.get("bus_id.1"), where)

    def test_p2p_devices_no_peer(self):
        """Two sim GPUs without P2P (`--sim-no-peer`, as GPUs of a board without it):
        cudaDeviceCanAccessPeer says 0, enabling answers cudaErrorPeerAccessUnsupported,
        disabling cudaErrorPeerAccessNotEnabled, and peer copies still work."""
        srv = self.start_server(extra_args=["--sim-devices", "2", "--sim-no-peer"])
        res = self.run_ok(srv, CFG.transports[0], "p2p_devices", CFG.variants[0],
                          log_level="warn")
        kv = self.kv(res)
        where = res.describe()
        for key, want in (("can_access.0_1", "0"), ("can_access.1_0", "0"),
                          ("p2p_attr.access_supported", "0"), ("enable.both_ways", "0"),
                          ("peer_copies", "20"), ("pointer_device.1", "1")):
            self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
        self.stop_server(srv)

    def test_p2p_devices_quota(self):
        """The memory quota holds per GPU (`--memory-quota 64M --sim-devices 2`): 48 MiB on
        each device both succeed, 32 MiB more on device 0 is cudaErrorMemoryAllocation, and
        cudaMemGetInfo shows each device's own use against the quota."""
        quota = 64 << 20
        srv = self.start_server(control=True,
                                extra_args=["--sim-devices", "2", "--memory-quota", "64M"])
        res = self.run_ok(srv, CFG.transports[0], "p2p_devices", CFG.variants[0],
                          args=("quota", str(quota)), log_level="warn")
        kv = self.kv(res)
        where = res.describe()
        for key, want in (("quota.both_devices", "ok"), ("quota.total_equal", "1"),
                          ("quota.free_each", "1"), ("quota.over_on_device0", "refused")):
            self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
        self.assert_stats(srv, sessions=0, memory_used=0)
        self.stop_server(srv)

    def test_p2p_devices_green_share(self):
        """Under an SM share made of green contexts (`--sim-green-contexts --sm-count 16`)
        each GPU of the session gets a green context of the share: p2p_devices passes, and
        the server logs a green context for each of the two devices."""
        srv = self.start_server(extra_args=["--sim-devices", "2", "--sim-green-contexts",
                                            "--sm-count", "16"])
        res = self.run_ok(srv, CFG.transports[0], "p2p_devices", CFG.variants[0],
                          log_level="warn")
        kv = self.kv(res)
        for key, want in self.P2P_EXPECTED:
            self.assertEqual(kv.get(key), want, "%s\n%s" % (key, res.describe()))
        res = self.run_ok(srv, CFG.transports[0], "p2p_devices", CFG.variants[0],
                          args=("second",), log_level="warn")
        self.assertEqual(self.kv(res).get("second_device"), "cudaSuccess", res.describe())
        self.assertIn("green context of 16 SMs on device 1", srv.logs())
        self.stop_server(srv)

    def test_p2p_devices_migrate_refused(self):
        """A session that uses two GPUs of its server is not movable yet: a migrate is
        refused at the park, saying so, and the program goes on where it is and passes."""
        a = self.start_server(control=True, extra_args=["--sim-devices", "2"])
        b = self.start_server(control=True, extra_args=["--sim-devices", "2"])
        gate = os.path.join(tempfile.mkdtemp(dir=self.tmp), "release")
        prog = RunningProgram(self.tmp, a, "tcp", program_path("p2p_devices", CFG.variants[0]),
                              ("hold", gate))
        try:
            if prog.wait_line(r"^holding$") is None:
                self.fail("p2p_devices never held\n" + prog.finish(5).describe())
            n, answer = self._migrate_answer(a, "migrate", "moved", to=b.url("tcp"), token=TOKEN)
            self.assertEqual((n, answer.get("stayed")), (0, 1), answer)
            message = answer["sessions"][0]["message"]
            self.assertIn("several GPUs", message, answer)
        finally:
            open(gate, "w").close()
        res = prog.finish(60)
        self.assert_passed(res, "p2p_devices", a)
        self.stop_server(a)
        self.stop_server(b)

    def test_p2p_devices_one_gpu(self):
        """p2p_devices against a one-GPU server (the default): it says it needs two GPUs
        ("skip=...") and passes, as it does natively on a one-GPU machine."""
        srv = self.start_server()
        for variant in CFG.variants:
            with self.subTest(variant=variant):
                res = self.run_ok(srv, CFG.transports[0], "p2p_devices", variant,
                                  log_level="warn")
                self.assertEqual(self.kv(res).get("skip"), "needs 2 GPUs, found 1",
                                 res.describe())
        self.stop_server(srv)

    def test_nvml_two_devices(self):
        """Flyt's NVML with a two-GPU server (nvml_query peers 2, a plain C program): two
        handles with their own index, UUID and PCI bus id (equal to CUDA's), P2P read and
        write OK between them and NVLink not supported (the sim is a PCIe board), common
        ancestor a host bridge; a GPU is not its own peer."""
        prog = os.path.join(CFG.programs_dir, "nvml_query")
        for transport in CFG.transports[:2]:
            with self.subTest(transport=transport):
                srv = self.start_server(extra_args=["--sim-devices", "2"])
                res = run_program(self.tmp, srv, transport, prog, ("peers", "2"),
                                  log_level="warn")
                self.assert_passed(res, "nvml_query", srv)
                kv = self.kv(res)
                where = res.describe()
                for key, want in (("device_count", "2"), ("p2p_read_0_1", "0"),
                                  ("p2p_write_1_0", "0"), ("p2p_nvlink_0_1", "5"),
                                  ("p2p_read_self", "5"), ("topology_0_1", "30")):
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
                self.assertNotEqual(kv.get("bus_id.0"), kv.get("bus_id.1"), where)
                self.stop_server(srv)

    def test_managed_memory(self):
        """Managed memory over every transport and cudart, against the sim (memsets and
        copies stand in for kernels): fresh memory reads zero, host writes reach the
        device before the next device work, device writes are seen after the
        synchronisation and do not lose the host's writes to other bytes of the same page,
        synchronous copies with managed memory on either side, prefetch both ways, advice,
        range and pointer attributes, stream attachment, refusals of device memory, 64 MiB
        touched sequentially, threads writing shared pages while another synchronises, an
        app's own SIGSEGV handler installed before and after, fork. A paging channel with
        a wrong secret is refused and the server lives on. Under --memory-quota, managed
        memory is charged in full at allocation and refunded by its free."""
        expected = (("attr.managed", "1"), ("app_handler.before", "1"),
                    ("fresh.first_nonzero", "-1"), ("host_to_device.diff", "-1"),
                    ("device_write.diff", "-1"), ("device_side.diff", "-1"),
                    ("copy_h2d.host_sees", "55"), ("copy_default.out", "55"),
                    ("copy_d2h_into_managed.first_not", "-1"),
                    ("copy_h2d_from_managed.first_not", "-1"),
                    ("copy_managed_to_managed.diff", "-1"),
                    ("copy_async_into_managed.first_not", "-1"), ("prefetch.diff", "-1"),
                    ("range.read_mostly", "1"), ("range.preferred", "0"),
                    ("range.last_prefetch", "-1"), ("attach.interior", "cudaErrorInvalidValue"),
                    ("pointer.type_managed", "1"), ("pointer.host_is_device", "1"),
                    ("refuse.prefetch_device_memory", "cudaErrorInvalidValue"),
                    ("refuse.advise_device_memory", "cudaErrorInvalidValue"),
                    ("refuse.alloc_flags0", "cudaErrorInvalidValue"), ("big.mismatches", "0"),
                    ("threads.bad_slices", "0"), ("app_handler.after", "1"),
                    ("after_app_handler.first_not", "-1"), ("app_handler.chained", "1"),
                    ("fork.child_status", "0"), ("fork.parent_sees", "3132"))
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "managed_memory", variant, log_level="warn")
                kv = self.kv(res)
                for key, want in expected:
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, res.describe()))
                self.stop_server(srv)
        srv = self.start_server()
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        body = struct.pack("<IQQ", 1, 12345, 1)
        s.sendall(struct.pack("<IHHQIIII", 0x54594C46, 4, 1, 0, len(body), 0, 0, 0) + body)
        self.assertEqual(s.recv(64), b"", "a paging channel with a wrong secret was answered")
        s.close()
        res = self.run_ok(srv, CFG.transports[0], "managed_memory", CFG.variants[0],
                          log_level="warn")
        self.assertIn("managed_memory: PASS", res.stdout, res.describe())
        self.assertIn("paging channel from", srv.log_text(), srv.logs())
        self.stop_server(srv)
        # The tenant's memory quota holds managed memory in full from its allocation.
        srv = self.start_server(control=True, extra_args=["--memory-quota", "64M"])
        res = self.run_ok(srv, CFG.transports[0], "managed_memory", CFG.variants[0],
                          args=("quota",), log_level="warn")
        kv = self.kv(res)
        for key, want in (("quota.charged_mib", "40"),
                          ("quota.second", "cudaErrorMemoryAllocation"),
                          ("quota.after_free", "ok")):
            self.assertEqual(kv.get(key), want, "%s\n%s" % (key, res.describe()))
        self.assert_stats(srv, sessions=0, memory_used=0, memory_quota=64 << 20)
        self.stop_server(srv)

    def test_mapped_host(self):
        """Pinned host memory mapped for kernels over every transport and cudart, against
        the sim, which models the program's kernel (flyt_sim_affine): cudaHostAllocMapped
        and cudaHostGetDevicePointer (the host pointer itself), host writes read by a
        kernel and kernel writes seen by the host after synchronisation, odd offsets with
        host writes to the same pages while the kernel runs, copies to and from mapped
        memory, cudaHostRegisterMapped of malloc'd memory (bytes kept at registration and
        at unregistration), cudaMallocHost mapped when its device pointer is asked for,
        pointer attributes and flags, several buffers on one stream read by a host
        function, an event query, a blocking copy, cudaFreeHost while another buffer stays
        in use. The session ends with nothing left on the server."""
        expected = (("attr.unified_addressing", "1"), ("alloc.flags_mapped", "1"),
                    ("alloc.device_is_host", "1"), ("attr.type_host", "1"),
                    ("attr.device_pointer_is_host", "1"), ("attr.host_pointer", "1"),
                    ("attr.cu_memory_type", "1"), ("attr.cu_is_managed", "0"),
                    ("attr.cu_mapped", "1"), ("attr.cu_device_pointer", "same"),
                    ("attr.cu_host_pointer", "same"), ("host_to_kernel.bad", "0"),
                    ("kernel_to_host.bad", "0"), ("odd_offsets.bad", "0"),
                    ("odd_offsets.device_bad", "0"), ("copies.bad", "0"),
                    ("register.kept_bad", "0"), ("register.device_is_host", "1"),
                    ("register.kernel_bad", "0"), ("unregister.kept_bad", "0"),
                    ("late.device_is_host", "1"), ("late.kernel_bad", "0"),
                    ("late.copy_bad", "0"), ("memset_pinned.zeroed", "1,1,kept=1"),
                    ("memset_pinned.kernel", "2"), ("direct_kernel.bad", "0"),
                    ("callback.bad", "0"), ("event_query.bad", "0"),
                    ("blocking_copy.bad", "0"), ("after_free.bad", "0"), ("under_flyt", "1"))
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server(control=True)
                res = self.run_ok(srv, transport, "mapped_host", variant, log_level="warn")
                kv = self.kv(res)
                for key, want in expected:
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, res.describe()))
                self.assertNotIn("not supported", res.stderr + res.client_log, res.describe())
                self.assert_stats(srv, sessions=0, memory_used=0)
                self.stop_server(srv)

    def test_nvrtc_cache(self):
        """NVRTC's driver compile cache (table da9151d3) served in the client process: over
        every transport and cudart, a fresh CUDA_CACHE_PATH makes the first compile a miss
        and the repeats hits with the same cubin; a second process finds the entries on
        disk; another option misses; CUDA_CACHE_DISABLE=1 and FLYT_COMPILE_CACHE=0 turn
        it off as the driver does; damaged files are recompiled and replaced; the folder
        stays under CUDA_CACHE_MAXSIZE."""
        def states(kv):
            return {k: kv.get(k) for k in ("c0.ptx", "c0.cubin", "c1.ptx", "c1.cubin",
                                           "c2.ptx", "c2.cubin", "ftz.ptx")}

        def folder_files(path):
            folder = os.path.join(path, "flyt")
            return sorted(os.path.join(folder, f) for f in os.listdir(folder)
                          if not f.startswith(".")) if os.path.isdir(folder) else []

        fresh = {"c0.ptx": "miss", "c0.cubin": "miss", "c1.ptx": "hit", "c1.cubin": "hit",
                 "c2.ptx": "hit", "c2.cubin": "hit", "ftz.ptx": "miss"}
        warm = dict(fresh, **{"c0.ptx": "hit", "c0.cubin": "hit", "ftz.ptx": "hit"})
        off = {k: "off" for k in fresh}
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                cache = tempfile.mkdtemp(prefix="cc-", dir=self.tmp)
                res = self.run_ok(srv, transport, "nvrtc_cache", variant, log_level="warn",
                                  extra={"CUDA_CACHE_PATH": cache})
                self.assertEqual(states(self.kv(res)), fresh, res.describe())
                self.assertEqual(self.kv(res).get("under_flyt"), "1", res.describe())
                self.assertGreaterEqual(len(folder_files(cache)), 2, res.describe())
                res = self.run_ok(srv, transport, "nvrtc_cache", variant, log_level="warn",
                                  extra={"CUDA_CACHE_PATH": cache})
                self.assertEqual(states(self.kv(res)), warm,
                                 "a second process did not find the entries on disk\n" +
                                 res.describe())
                self.stop_server(srv)

        srv = self.start_server()
        transport, variant = CFG.transports[0], CFG.variants[0]
        for name, env in (("CUDA_CACHE_DISABLE", {"CUDA_CACHE_DISABLE": "1"}),
                          ("FLYT_COMPILE_CACHE", {"FLYT_COMPILE_CACHE": "0"})):
            with self.subTest(off=name):
                cache = tempfile.mkdtemp(prefix="cc-", dir=self.tmp)
                res = self.run_ok(srv, transport, "nvrtc_cache", variant, log_level="warn",
                                  extra=dict(env, CUDA_CACHE_PATH=cache))
                self.assertEqual(states(self.kv(res)), off, res.describe())
                self.assertEqual(folder_files(cache), [], res.describe())

        with self.subTest(case="damaged files"):
            cache = tempfile.mkdtemp(prefix="cc-", dir=self.tmp)
            self.run_ok(srv, transport, "nvrtc_cache", variant, log_level="warn",
                        extra={"CUDA_CACHE_PATH": cache})
            files = folder_files(cache)
            self.assertGreaterEqual(len(files), 2)
            for i, path in enumerate(files):
                with open(path, "r+b") as f:  # one truncated, the others with a flipped byte
                    if i == 0:
                        f.truncate(40)
                    else:
                        f.seek(-1, os.SEEK_END)
                        last = f.read(1)
                        f.seek(-1, os.SEEK_END)
                        f.write(bytes([last[0] ^ 0xff]))
            res = self.run_ok(srv, transport, "nvrtc_cache", variant, log_level="warn",
                              extra={"CUDA_CACHE_PATH": cache})
            kv = self.kv(res)
            self.assertEqual((kv.get("c0.ptx"), kv.get("c0.cubin")), ("miss", "miss"),
                             res.describe())
            self.assertIn("is damaged", res.client_log, res.describe())
            res = self.run_ok(srv, transport, "nvrtc_cache", variant, log_level="warn",
                              extra={"CUDA_CACHE_PATH": cache})
            self.assertEqual(states(self.kv(res)), warm, "damaged entries were not replaced\n" +
                             res.describe())

        with self.subTest(case="CUDA_CACHE_MAXSIZE"):
            cache = tempfile.mkdtemp(prefix="cc-", dir=self.tmp)
            limit = 40000
            self.run_ok(srv, transport, "nvrtc_cache", variant, log_level="warn",
                        extra={"CUDA_CACHE_PATH": cache, "CUDA_CACHE_MAXSIZE": str(limit)})
            total = sum(os.path.getsize(f) for f in folder_files(cache))
            self.assertGreater(total, 0)
            self.assertLessEqual(total, limit)
        self.stop_server(srv)

    def test_tensor_map(self):
        """TMA descriptors (cuTensorMapEncodeTiled/Im2col, cuTensorMapReplaceAddress) over
        every transport and cudart: encoded by the server's driver (the sim's checks here),
        the same arguments give the same bytes and the second encoding is answered from
        the client's cache (one round trip), a replaced address changes the bytes and
        replacing it back restores them, and bad arguments get the driver's
        CUDA_ERROR_INVALID_VALUE, a rank the driver never takes without a round trip."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "tensor_map", variant, log_level="warn",
                                  extra={"FLYT_CALL_COUNTS": "1"})
                kv = self.kv(res)
                where = res.describe()
                want = {"encode.same_bytes": "1", "encode.box_changes_bytes": "1",
                        "flyt.server_encodes": "1", "replace.changes_bytes": "1",
                        "replace.back_same_bytes": "1", "im2col": "CUDA_SUCCESS"}
                for what in ("null_map", "rank0", "rank6", "misaligned", "odd_stride", "zero_box",
                             "big_box", "big_element_stride", "null_dims"):
                    want["error." + what] = "CUDA_ERROR_INVALID_VALUE"
                for key, value in want.items():
                    self.assertEqual(kv.get(key), value, "%s\n%s" % (key, where))
                self.stop_server(srv)

    GRAPH_NODES_EXPECTED = (
        ("topo.edges", "a>b,a>c,b>e,c>e"), ("topo.roots", "a"), ("topo.deps_e", "b,c"),
        ("topo.dependents_a", "b,c"), ("topo.deps_a", "0"),
        ("topo.added", "a>b,a>c,a>e,b>e,c>e"), ("topo.add_again", "cudaErrorInvalidValue"),
        ("topo.remove_again", "cudaErrorInvalidValue"), ("topo.removed", "a>b,a>c,b>e,c>e"),
        ("topo.after_destroy", "a>b,b>e"), ("topo.nodes_after_destroy", "3"),
        ("topo.enabled_at_start", "1"), ("topo.enabled_after_disable", "0"),
        ("topo.disabled_memset_ran", "0"), ("topo.enabled_memset_ran", "1"),
        ("topo.disable_empty", "cudaErrorInvalidValue"),
        ("topo.captured", "not run (sim)"), ("other.fresh_graphs_refused", "0"),
        ("simple.types", "host,kernel,memcpy,memcpy,memcpy,memcpy,memcpy,memset"),
        ("simple.launches_ok", "6"), ("simple.host_node_runs", "6"),
        ("simple.exec_set_params", "ok"), ("simple.d2h_type", "memcpy"),
        ("simple.clone_types", "host,kernel,memcpy,memcpy,memcpy,memcpy,memcpy,memset"),
        ("simple.exec_update", "0"), ("simple.symbol", "ok"),
        ("cond.if", "10,0"), ("cond.if_types", "conditional,kernel,memcpy,memset"),
        ("cond.if_else", "10,11"), ("cond.switch", "10,12,0"),
        ("cond.while_iterations", "5,3,8"),
        # graphConditionalNodes' captured WHILE: a node added by hand to a capture.
        ("captured.idle", "0,0"), ("captured.begin", "1,0"), ("captured.dep_type", "memcpy"),
        ("captured.body", "kernel"), ("captured.after_add", "2"),
        ("captured.types", "conditional,empty,memcpy,memcpy"), ("captured.edges", "3"),
        ("captured.update_idle", "401"), ("captured.while_iterations", "4,7,1"),
        ("captured.dot", "1"), ("captured.dot_unwritable", "304"),
        # User objects: the executable graph's reference outlives its graph; the app's
        # references; a clone's and a child node's; misuse.
        ("user_object.exec", "0,1,app_thread0"), ("user_object.app_refs", "0,1"),
        ("user_object.copies", "0,1"),
        ("user_object.bad_flags", "1"),
        ("memory.types", "mem_alloc,mem_free,memcpy,memset"), ("memory.launches_ok", "4"),
        ("memory.freed_by_stream", "2"),
        ("memory.free_not_graph_memory", "cudaErrorInvalidValue"),
        ("memory.used_after_trim", "0"),
        ("other.types", "empty,event_record,graph,memcpy"),
        ("other.child_types", "memcpy,memset"), ("other.event_query", "0"),
        ("other.wait_types", "memcpy,wait_event"), ("other.generic", "ok"))

    def test_graph_nodes(self):
        """Graphs built node by node (graph_nodes.cu) over every transport and cudart:
        memcpy nodes to and from pageable and pinned host memory read and written at each
        launch (a host node after a D2H node sees its bytes), exec and node SetParams,
        queries, clone, cudaGraphExecUpdate, symbols; IF, IF/ELSE, SWITCH and a WHILE loop
        whose condition the sim's modelled kernels set, and a WHILE node added by hand to a
        capture (capture dependencies read, set and added; its body captured into it); allocation/free nodes relaunched,
        a free node for cudaMalloc memory refused; child graph, empty and event nodes;
        cudaGraphAddNode / NodeSetParams / ExecNodeSetParams; the topology calls (edges,
        roots, dependencies, dependents, edges added and removed, a node destroyed, a
        node disabled in an executable graph; Flyt's helper nodes of a captured copy to
        client memory never shown). The server is alive and holds nothing of the client
        afterwards."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server(control=True)
                res = self.run_ok(srv, transport, "graph_nodes", variant, log_level="warn")
                kv = self.kv(res)
                where = res.describe()
                for key, want in self.GRAPH_NODES_EXPECTED:
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
                self.assert_stats(srv, sessions=0, memory_used=0)
                self.stop_server(srv)

    def test_graph_nodes_quota(self):
        """Allocation nodes count against --memory-quota: one larger than the quota is
        refused with out-of-memory, one of 16 MiB shows in cudaMemGetInfo and comes back
        when its graph is destroyed; the quota is whole after the client exits."""
        quota = 64 << 20
        for transport in CFG.transports:
            with self.subTest(transport=transport):
                srv = self.start_server(control=True, extra_args=["--memory-quota", "64M"])
                res = self.run_ok(srv, transport, "graph_nodes", CFG.variants[0],
                                  args=("quota", str(quota)), log_level="warn")
                kv = self.kv(res)
                where = res.describe()
                for key, want in (("quota.over", "cudaErrorMemoryAllocation"),
                                  ("quota.charged", str(16 << 20)),
                                  ("quota.refunded", str(16 << 20))):
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
                self.assert_stats(srv, sessions=0, memory_used=0, memory_quota=quota)
                self.stop_server(srv)

    def test_graph_nodes_refusals(self):
        """What hand-built graphs cannot have through Flyt fails with
        cudaErrorNotSupported and a log line naming it: a memcpy node whose host rows lie
        apart, a child graph moved into its parent, a host-memory copy in a conditional
        body."""
        srv = self.start_server()
        res = self.run_ok(srv, CFG.transports[0], "graph_nodes", CFG.variants[0],
                          args=("refusals",), log_level="warn")
        kv = self.kv(res)
        where = "%s\n%s" % (res.describe(), srv.logs())
        self.assertEqual(kv.get("refusal.pitched_host"), "cudaErrorNotSupported", where)
        self.assertEqual(kv.get("refusal.child_move"), "cudaErrorNotSupported", where)
        self.assertEqual(kv.get("refusal.host_copy_in_body"), "cudaErrorNotSupported", where)
        self.assertIn("inside a conditional node's body", srv.log_text(), where)
        self.assertIn("pitched rows in client host memory", srv.log_text(), where)
        self.assertIn("child graph moved into its parent", res.stderr + res.client_log, where)
        self.stop_server(srv)

    def test_vmm_quota(self):
        """--memory-quota holds cuMemCreate: the quota is charged, OOM beyond it, refunded
        when released and unmapped; a client that leaves without freeing anything has its
        mappings, handles and reservations released by the server, and the quota back."""
        quota = 64 << 20
        gran = 2 << 20
        for transport in CFG.transports:
            with self.subTest(transport=transport):
                srv = self.start_server(control=True, extra_args=["--memory-quota", "64M"])
                res = self.run_ok(srv, transport, "vmm", CFG.variants[0], args=("leak",))
                self.assertIn("leaving", res.lines(), res.describe())
                self.assert_stats(srv, sessions=0, memory_used=0, memory_quota=quota)
                self.assertRegex(srv.log_text(), r"released 2 mappings, 2 allocation handles, "
                                 r"1 reservations", "the server did not release the leaked "
                                 "memory\n" + srv.logs())
                res = self.run_ok(srv, transport, "vmm", CFG.variants[0], args=("quota",),
                                  extra={"VMM_QUOTA_BYTES": str(quota)})
                kv = self.kv(res)
                self.assertEqual(kv.get("quota.chunks"), str(quota // gran), res.describe())
                self.assertEqual(kv.get("quota"), "ok", res.describe())
                self.assert_stats(srv, sessions=0, memory_used=0, memory_quota=quota)
                self.stop_server(srv)

    def test_shm_file_backing(self):
        """--shm-backing file:DIR: each connection's rings live in a file of DIR whose name
        is gone at once (nothing to leak); the programs run over it as over a memfd."""
        seg_dir = os.path.join(self.tmp, "segments")
        os.mkdir(seg_dir)
        srv = self.start_server(extra_args=["--shm-backing", "file:" + seg_dir])
        for variant in CFG.variants:
            with self.subTest(variant=variant):
                self.run_ok(srv, "shm", "memory_roundtrip", variant)
                res = self.run_ok(srv, "shm", "pinned_shared", variant)
                self.assertEqual(self.kv(res).get("mapped"), "1", res.describe())
        # While a client is connected the server maps a deleted file of seg_dir.
        prog = RunningProgram(self.tmp, srv, "shm", program_path("pinned_shared",
                                                                  CFG.variants[0]), ["hold"])
        try:
            self.assertTrue(prog.wait_line("^holding$", 60), "pinned_shared hold did not get "
                            "ready\n" + srv.logs())
            segs = []
            for pid in server_pids(srv):  # the client's worker maps it
                with open("/proc/%d/maps" % pid) as f:
                    segs += [l for l in f if seg_dir + "/flyt-" in l]
            self.assertTrue(segs and all(l.rstrip().endswith("(deleted)") for l in segs),
                            "want the ring segment mapped from a deleted file of %s: %s"
                            % (seg_dir, segs))
        finally:
            kill_group(prog.proc)
            prog.finish(10)
        self.assertEqual(os.listdir(seg_dir), [], "segment files left behind")
        self.stop_server(srv)
        bad = Server(self.tmp, name="badbacking", extra_args=["--shm-backing", "disk:/x"])
        with self.assertRaises(Exception):
            bad.start()

    @staticmethod
    def shared_maps(srv):
        """What the server's processes (its main process and workers) map of clients'
        pinned memory."""
        maps = []
        for pid in server_pids(srv):
            try:
                with open("/proc/%d/maps" % pid) as f:
                    maps += [l for l in f if "flyt-pinned" in l]
            except OSError:
                pass  # a worker that just ended
        return maps

    def assert_no_shared_maps(self, srv, wait_s=10):
        deadline = time.monotonic() + wait_s
        maps = self.shared_maps(srv)
        while maps and time.monotonic() < deadline:
            time.sleep(0.05)
            maps = self.shared_maps(srv)
        self.assertEqual(maps, [], "the server still maps a client's pinned memory\n%s"
                         % srv.logs())

    def kill_while_sharing(self, srv, variant):
        cmd = flyt_command(srv, "shm", program_path("pinned_shared", variant), ["hold"])
        env, note, log_path = client_env(self.tmp, srv, "shm")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            line = b""
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line or line.strip() == b"holding":
                    break
            self.assertEqual(line.strip(), b"holding", "pinned_shared hold did not get ready\n"
                             + srv.logs())
            inodes = {l.split()[4] for l in self.shared_maps(srv)}
            self.assertEqual(len(inodes), 3,
                             "want the client's three pinned buffers mapped in the server\n"
                             + srv.logs())
        finally:
            kill_group(proc)
            proc.wait()
            proc.stdout.close()
        self.assert_no_shared_maps(srv)
        # The server goes on serving.
        res = self.run_ok(srv, "shm", "pinned_shared", variant)
        self.assertEqual(self.kv(res).get("mapped"), "1", res.describe())

    def test_server_gone(self):
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                self.one_server_gone(variant, transport)

    def one_server_gone(self, variant, transport):
        srv = self.start_server()
        trigger = os.path.join(self.tmp, "trigger-%d" % next_id())
        program = program_path("server_gone", variant)
        cmd = flyt_command(srv, transport, program, [trigger])
        env, note, log_path = client_env(self.tmp, srv, transport,
                                         timeout_ms=SHORT_CLIENT_TIMEOUT_MS, watchdog_s=90)
        err_path = os.path.join(self.tmp, "server_gone-%d.stderr" % next_id())
        lines = []
        ready = threading.Event()
        start = time.monotonic()
        with open(err_path, "wb") as err_file:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_file,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)

        def reader():
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                lines.append(line)
                if line == "ready":
                    ready.set()

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        rc = None
        after_trigger = None
        try:
            deadline = time.monotonic() + 60
            while not ready.wait(0.1):
                if proc.poll() is not None or time.monotonic() > deadline:
                    break
            got_ready = ready.is_set()
            if not got_ready:
                kill_group(proc)
                t.join(5)
            else:
                srv.kill()
                with open(trigger, "w") as f:
                    f.write("go\n")
                t0 = time.monotonic()
                limit = SHORT_CLIENT_TIMEOUT_MS / 1000.0 + DEAD_SERVER_SLACK_S
                try:
                    proc.wait(timeout=limit)
                    rc = proc.returncode
                except subprocess.TimeoutExpired:
                    rc = None
                after_trigger = time.monotonic() - t0
        finally:
            kill_group(proc)
            t.join(5)
            proc.stdout.close()
        res = Result(cmd, note, rc, "\n".join(lines) + "\n", read_text(err_path), log_path,
                     time.monotonic() - start)
        where = "%s\n%s" % (res.describe(), srv.logs())
        self.assertTrue(got_ready, "server_gone never printed 'ready'\n" + where)
        self.assertIsNotNone(rc, "server_gone hung after the server was killed: still running "
                             "%.1fs after the trigger (FLYT_TIMEOUT_MS=%d)\n%s" % (
                                 after_trigger, SHORT_CLIENT_TIMEOUT_MS, where))
        self.assertEqual(rc, 0, "server_gone: %s\n%s" % (describe_rc(rc), where))
        m = re.search(r"^memcpy_error=(\d+) (\S+) elapsed_ms=(\d+)$", res.stdout, re.M)
        self.assertIsNotNone(m, "no memcpy_error line\n" + where)
        self.assertNotEqual(int(m.group(1)), 0, where)
        self.assertLessEqual(int(m.group(3)), SHORT_CLIENT_TIMEOUT_MS + 3000,
                             "cudaMemcpy took longer than FLYT_TIMEOUT_MS + 3 s to fail\n"
                             + where)
        m2 = re.search(r"^malloc_error=(\d+) ", res.stdout, re.M)
        self.assertIsNotNone(m2, "no malloc_error line\n" + where)
        self.assertNotEqual(int(m2.group(1)), 0, "cudaMalloc succeeded with no server\n" + where)
        self.assertIn("server_gone: PASS", res.stdout, where)
        # One error line for the loss, whichever call noticed it, saying what to do.
        lost = [l for l in res.client_log.splitlines() if "lost the connection" in l]
        self.assertEqual(len(lost), 1, "want one 'lost the connection' line\n" + where)
        self.assertIn("restart the application once the server is back", lost[0], where)

    def test_wrong_token(self):
        transport_list = CFG.transports
        for transport in transport_list:
            for case, token in (("wrong", "not-the-token"), ("missing", None)):
                with self.subTest(transport=transport, token=case):
                    srv = self.start_server()
                    marks = srv.output_marks()
                    res = run_program(self.tmp, srv, transport,
                                      program_path("device_query", CFG.variants[0]),
                                      token=token, timeout=60,
                                      timeout_ms=SHORT_CLIENT_TIMEOUT_MS)
                    where = "%s\n%s" % (res.describe(), srv.logs())
                    self.assertIsNotNone(res.rc, "a refused client hung\n" + where)
                    self.assertNotEqual(res.rc, 0, "a client with a %s token succeeded\n%s"
                                        % (case, where))
                    self.assertGreater(res.rc, 0, "the client crashed: %s\n%s"
                                       % (describe_rc(res.rc), where))
                    self.assertNotIn(res.rc, (128 + signal.SIGSEGV, 128 + signal.SIGABRT,
                                              128 + signal.SIGBUS),
                                     "the client crashed\n" + where)
                    self.assertNotIn("device_query: PASS", res.stdout, where)
                    self.assertRegex(res.client_log + res.stderr, r"(?i)token",
                                     "the client did not say the token was refused\n" + where)
                    self.assertRegex(srv.output_since(marks),
                                     r"(?i)token|auth|refus|reject|denied",
                                     "the server did not log the refusal\n" + where)
                    self.assertTrue(srv.alive(), "the server died\n" + where)
                    # The right token still works on the same server.
                    self.run_ok(srv, transport, "device_query", CFG.variants[0])
                    self.stop_server(srv)

    def test_hostile_frames(self):
        srv = self.start_server()
        rng = random.Random(0xF17)

        # 1. Capture a real session through a proxy, as seed for layout-free mutations.
        proxy = CaptureProxy(srv.port)

        class ThroughProxy:
            @staticmethod
            def url(transport):
                return proxy.url()

        try:
            res = run_program(self.tmp, ThroughProxy(), "tcp",
                              program_path("device_query", CFG.variants[0]))
            self.assert_passed(res, "device_query (through the capture proxy)", srv)
        finally:
            proxy.stop()
        seed = proxy.seed()
        self.assertGreater(len(seed), 0, "the capture proxy saw no client bytes")

        payloads = hostile_payloads(seed, rng)
        families = [srv.address(t) for t in CFG.transports]

        # 2. Idle and half-sent connections held open for the whole storm.
        held = []
        for i in range(32):
            fam, addr = families[i % len(families)]
            s = socket.socket(fam, socket.SOCK_STREAM)
            s.settimeout(5)
            try:
                s.connect(addr)
                if i % 4 == 1:
                    s.sendall(seed[:3])
                elif i % 4 == 2:
                    s.sendall(seed[:24])
                held.append(s)
            except OSError:
                s.close()

        # 3. Legit programs run while the storm goes on.
        legit = {}

        def legit_run(key, transport, name, variant):
            legit[key] = (name, run_program(self.tmp, srv, transport, program_path(name, variant)))

        legit_threads = []
        plan = [("a", CFG.transports[-1], "memory_roundtrip", CFG.variants[0]),
                ("b", CFG.transports[0], "kernel_args", CFG.variants[-1])]
        for key, transport, name, variant in plan:
            th = threading.Thread(target=legit_run, args=(key, transport, name, variant))
            th.start()
            legit_threads.append(th)

        outcomes = {}
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
                futures = {}
                for i, (desc, payload) in enumerate(payloads):
                    fam, addr = families[i % len(families)]
                    futures[pool.submit(send_hostile, fam, addr, payload)] = desc
                for fut in concurrent.futures.as_completed(futures):
                    outcomes[futures[fut]] = fut.result()
        finally:
            for th in legit_threads:
                th.join(RUN_TIMEOUT_S + 30)
            for s in held:
                s.close()

        summary = {}
        for v in outcomes.values():
            summary[v.split(":")[0]] = summary.get(v.split(":")[0], 0) + 1
        sys.stderr.write("\n[e2e] hostile frames: %d connections (%s), seed %d bytes\n"
                         % (len(outcomes), summary, len(seed)))

        self.assertTrue(srv.alive(), "the server died under hostile frames\n" + srv.logs())
        failed_connects = [d for d, v in outcomes.items() if v.startswith("connect failed")]
        self.assertEqual(failed_connects, [], "connections refused during the storm\n"
                         + srv.logs())
        for key in sorted(legit):
            name, res = legit[key]
            self.assert_passed(res, name, srv)
        self.assertEqual(len(legit), len(plan), "a legit run did not finish")
        kb = rss_kb(srv.proc.pid)
        self.assertTrue(kb is None or kb < SERVER_RSS_LIMIT_KB,
                        "server RSS %s kB after the storm (limit %d kB)" % (kb,
                                                                           SERVER_RSS_LIMIT_KB))
        # 4. Still serving afterwards, on every transport.
        for transport in CFG.transports:
            self.run_ok(srv, transport, "device_query", CFG.variants[0])
        self.stop_server(srv)

    def test_concurrent_sessions(self):
        """Several programs at once on one server: sessions must not disturb each other."""
        srv = self.start_server()
        jobs = []
        # Programs that pass on their own, so that a failure here points at session mix-ups.
        names = ("memory_roundtrip", "kernel_args", "memory_roundtrip", "device_query",
                 "kernel_args")
        i = 0
        for name in names:
            variant = CFG.variants[i % len(CFG.variants)]
            transport = CFG.transports[(i // len(CFG.variants)) % len(CFG.transports)]
            jobs.append((name, variant, transport))
            i += 1
        results = [None] * len(jobs)

        def go(k, name, variant, transport):
            results[k] = run_program(self.tmp, srv, transport, program_path(name, variant))

        threads = [threading.Thread(target=go, args=(k,) + job) for k, job in enumerate(jobs)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(RUN_TIMEOUT_S + 30)
        for (name, variant, transport), res in zip(jobs, results):
            self.assertIsNotNone(res, "%s (%s, %s) never finished" % (name, variant, transport))
            self.assert_passed(res, name, srv)
        # Each kernel_args run's launches appear in the record in its own order, whole lines.
        expected = [[l for l in res.lines() if l.startswith("launch ")]
                    for (name, _, _), res in zip(jobs, results) if name == "kernel_args"]
        total = sum(len(e) for e in expected)
        got = self.wait_records(srv, total)
        bad = [l[:200] for l in got if not RECORD_RE.match(l)]
        self.assertEqual(bad, [], "malformed (interleaved?) record lines")
        missing = collections.Counter(l for e in expected for l in e) - collections.Counter(got)
        self.assertEqual(len(missing), 0, "%d launches missing from the record, e.g. %s\n%s" % (
            sum(missing.values()), next(iter(missing), "")[:300], srv.logs()))
        for exp in expected:
            pos = 0
            for line in exp:
                try:
                    pos = got.index(line, pos) + 1
                except ValueError:
                    self.fail("launch missing from the record (or out of order): %s\n%s"
                              % (line[:300], srv.logs()))
        self.stop_server(srv)


    # -- the tenant's share: --memory-quota, --sm-count, the control socket, set-share

    def assert_stats(self, srv, **want):
        """stats has every field of the contract and the values in `want`. A session that
        ended is gone from stats once the server has noticed: waits for sessions=0."""
        stats = srv.control({"verb": "stats"})
        deadline = time.monotonic() + 10
        while (want.get("sessions") == 0 and stats.get("sessions") != 0
               and time.monotonic() < deadline):
            time.sleep(0.05)
            stats = srv.control({"verb": "stats"})
        where = "stats: %s\n%s" % (stats, srv.logs())
        self.assertTrue(stats.get("ok"), where)
        for key in ("pid", "listen", "sessions", "memory_used", "memory_quota", "sm", "sm_total",
                    "sm_mechanism", "calls", "idle_ms"):
            self.assertIn(key, stats, where)
        self.assertEqual(stats["pid"], srv.proc.pid, where)
        for key, value in want.items():
            self.assertEqual(stats.get(key), value, "%s: %s" % (key, where))
        return stats

    def test_share_quota(self):
        """Allocations until OOM under --memory-quota; cudaMemGetInfo and the SM count."""
        quota = 64 << 20
        cases = [(variant, transport, False) for variant, transport in self.matrix()]
        cases.append((CFG.variants[0], CFG.transports[0], True))
        for variant, transport, green in cases:
            with self.subTest(variant=variant, transport=transport, green=green):
                args = ["--memory-quota", "64M", "--sm-count", "20"]
                if green:
                    args.append("--sim-green-contexts")
                srv = self.start_server(control=True, extra_args=args)
                sm = 24 if green else 20  # green contexts come in multiples of 8 SMs
                mechanism = "green_context" if green else "none"
                self.assert_stats(srv, sessions=0, memory_used=0, memory_quota=quota, sm=sm,
                                  sm_total=SIM_SMS, sm_mechanism=mechanism, calls=0,
                                  listen=srv.listen_urls())
                res = self.run_ok(srv, transport, "share_quota", variant,
                                  args=("quota", str(quota), str(sm)))
                kv = self.kv(res)
                self.assertEqual(kv.get("oom_after"), "8", res.describe())
                self.assertEqual(kv.get("mem_total"), str(quota), res.describe())
                stats = self.assert_stats(srv, sessions=0, memory_used=0, memory_quota=quota,
                                          sm=sm, sm_mechanism=mechanism)
                self.assertGreater(stats["calls"], 0, stats)
                mode = os.stat(srv.control_path).st_mode & 0o777
                self.assertEqual(mode, 0o600, "control socket mode %o" % mode)
                self.stop_server(srv)
                self.assertFalse(os.path.exists(srv.control_path),
                                 "the control socket file outlived the server")

    def test_share_quota_pools(self):
        """A pool's idle memory counts against --memory-quota (--movable-memory: the server
        serves the pool): cudaMemGetInfo shows it taken, a cudaMalloc that needs the room
        gets it (the pool gives its idle memory back), and the quota is whole at the end."""
        quota = 64 << 20
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server(control=True,
                                        extra_args=["--memory-quota", "64M", "--movable-memory"])
                res = self.run_ok(srv, transport, "share_quota", variant,
                                  args=("pools", str(quota)))
                kv = self.kv(res)
                self.assertEqual(kv.get("pool_idle_counted"), "1", res.describe())
                self.assertEqual(kv.get("pool_reserved_after_malloc"), "0", res.describe())
                self.assertEqual(kv.get("free_after_pool"), str(quota), res.describe())
                self.assert_stats(srv, sessions=0, memory_used=0, memory_quota=quota)
                self.stop_server(srv)

    def test_control_socket(self):
        """stats and malformed requests; several requests per connection; a stale file."""
        stale = os.path.join(self.tmp, "stale.ctl")
        with open(stale, "w") as f:
            f.write("left by a dead server")
        srv = Server(self.tmp, name="stale", control=True)
        srv.control_path = stale
        srv.start()
        self.servers.append(srv)
        stats = self.assert_stats(srv, sessions=0, memory_used=0, memory_quota=0,
                                  sm=SIM_SMS, sm_total=SIM_SMS, sm_mechanism="none")
        time.sleep(0.2)
        later = self.assert_stats(srv, sessions=0)
        self.assertGreater(later["idle_ms"], stats["idle_ms"], "idle_ms does not grow before "
                           "the first session")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(srv.control_path)
        try:
            bad = [
                ({"verb": "no-such-verb"}, "bad_request"),
                ({"id": 7}, "bad_request"),
                ({"verb": "set-share"}, "bad_request"),
                ({"verb": "set-share", "sm": -1}, "bad_request"),
                ({"verb": "set-share", "sm": "all"}, "bad_request"),
                ({"verb": "set-share", "memory_bytes": -5}, "bad_request"),
                ({"verb": "set-share", "memory_bytes": 1.5}, "bad_request"),
            ]
            for request, code in bad:
                answer = control_call(None, request, sock=sock)
                self.assertFalse(answer.get("ok"), "%s -> %s" % (request, answer))
                self.assertEqual(answer.get("code"), code, "%s -> %s" % (request, answer))
                self.assertTrue(answer.get("error"), "%s -> %s" % (request, answer))
            answer = control_call(None, {"verb": "stats", "id": 42}, sock=sock)
            self.assertTrue(answer.get("ok"), answer)
        finally:
            sock.close()
        # A session's memory shows in stats while it runs, and goes when it ends.
        prog = RunningProgram(self.tmp, srv, "tcp", program_path("share_quota", CFG.variants[0]),
                              ("watch", "60", "1", "1"))
        try:
            if prog.wait_line(r"^ready$") is None:
                self.fail("share_quota never got ready\n" + prog.finish(5).describe())
            stats = self.assert_stats(srv, sessions=1, memory_used=8 << 20, idle_ms=0)
            self.assertGreater(stats["calls"], 0, stats)
        finally:
            kill_group(prog.proc)
            prog.finish(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stats = srv.control({"verb": "stats"})
            if stats.get("sessions") == 0:
                break
            time.sleep(0.05)
        self.assertEqual(stats.get("sessions"), 0, "the killed client's session stayed: %s" % stats)
        self.assertEqual(stats.get("memory_used"), 0, "its memory still counts: %s" % stats)
        self.stop_server(srv)
        self.assertFalse(os.path.exists(stale), "the control socket file outlived the server")

    def test_live_share_change(self):
        """set-share while a program runs: it sees the new SM count and memory at once, its
        stream keeps working (with fake green contexts: moved to the new context), and the
        new quota holds."""
        for green in (False, True):
            with self.subTest(green=green):
                args = ["--memory-quota", "64M", "--sm-count", "20"]
                if green:
                    args.append("--sim-green-contexts")
                srv = self.start_server(control=True, extra_args=args)
                sm_before = 24 if green else 20
                ask, sm_after = (36, 40) if green else (40, 40)
                new_quota = 32 << 20
                prog = RunningProgram(self.tmp, srv, CFG.transports[0],
                                      program_path("share_quota", CFG.variants[0]),
                                      ("watch", "60", str(sm_after), str(new_quota)))
                try:
                    if prog.wait_line(r"^ready$") is None:
                        self.fail("share_quota never got ready\n" + prog.finish(5).describe())
                    self.assert_stats(srv, sessions=1, memory_used=8 << 20, sm=sm_before)
                    # Below what is in use: allowed, and said so.
                    answer = srv.control({"verb": "set-share", "memory_bytes": 4 << 20})
                    self.assertTrue(answer.get("ok"), answer)
                    self.assertIn("below current use", answer.get("note", ""), answer)
                    answer = srv.control({"verb": "set-share", "sm": ask,
                                          "memory_bytes": new_quota})
                    self.assertTrue(answer.get("ok"), "%s\n%s" % (answer, srv.logs()))
                    self.assertIsInstance(answer.get("pause_us"), int, answer)
                    self.assertGreaterEqual(answer["pause_us"], 0, answer)
                    self.assertEqual(answer.get("sm"), sm_after, answer)
                    if green:
                        self.assertIn("granted", answer.get("note", ""), answer)
                finally:
                    res = prog.finish()
                self.assert_passed(res, "share_quota", srv)
                self.assertIn("change sm=%d total=%d" % (sm_after, new_quota), res.lines(),
                              res.describe())
                self.assert_stats(srv, sessions=0, memory_used=0, memory_quota=new_quota,
                                  sm=sm_after,
                                  sm_mechanism="green_context" if green else "none")
                if green:
                    self.assertRegex(srv.log_text(), r"stream\(s\) moved",
                                     "the session did not move its stream\n" + srv.logs())
                # A new session starts with the new share.
                res = self.run_ok(srv, CFG.transports[0], "share_quota", CFG.variants[0],
                                  args=("quota", str(new_quota), str(sm_after)))
                self.stop_server(srv)

    def make_tls_files(self):
        """A test CA, a server certificate for 127.0.0.1, client certificates of that CA
        and of a rogue CA."""
        d = tempfile.mkdtemp(prefix="tls-", dir=self.tmp)

        def openssl(*args):
            res = subprocess.run(["openssl"] + list(args), cwd=d, capture_output=True, text=True)
            self.assertEqual(res.returncode, 0, res.stderr)

        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        for ca in ("ca", "rogue-ca"):
            openssl("req", "-x509", *ec, "-keyout", ca + ".key", "-out", ca + ".pem", "-days",
                    "2", "-subj", "/CN=flyt e2e " + ca)
        with open(os.path.join(d, "server.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for name, ca, ext in (("server", "ca", ["-extfile", "server.ext"]),
                              ("client", "ca", []), ("rogue", "rogue-ca", [])):
            openssl("req", *ec, "-keyout", name + ".key", "-out", name + ".csr", "-subj",
                    "/CN=" + name)
            openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey",
                    ca + ".key", "-CAcreateserial", "-out", name + ".pem", "-days", "2", *ext)
        return lambda name: os.path.join(d, name)

    def test_tls(self):
        """tls://: the data plane over TLS 1.3 (the main process does the handshake, the
        worker continues the encrypted connection): programs pass over it with both cudart
        variants, the callback channel included; a client that does not trust the server's
        CA, expects another name or speaks plain TCP is refused and the server lives on;
        with --tls-ca only clients with a certificate of that CA get in; a tls:// listener
        without a certificate stops flyt-server with a clear message."""
        f = self.make_tls_files()
        port = free_tcp_port()
        url = "tls://127.0.0.1:%d" % port
        tls_args = ["--listen", url, "--tls-cert", f("server.pem"), "--tls-key", f("server.key")]

        class Over:
            """The server, reached at its tls:// address."""
            def __init__(self, srv, address):
                self.srv, self.address = srv, address

            def url(self, transport):
                return self.address

            def __getattr__(self, name):
                return getattr(self.srv, name)

        srv = self.start_server(extra_args=tls_args)
        tls = Over(srv, url)
        ca = {"FLYT_TLS_CA": f("ca.pem")}
        for variant in CFG.variants:
            for prog in ("memory_roundtrip", "kernel_args", "stream_event_order"):
                with self.subTest(variant=variant, program=prog):
                    self.run_ok(tls, "tls", prog, variant, extra=ca)
        for case, env, want in (
                ("no CA", {}, "certificate verify failed"),
                ("other name", dict(ca, FLYT_TLS_SERVER_NAME="gpu.example"),
                 "certificate verify failed")):
            with self.subTest(refused=case):
                res = run_program(self.tmp, tls, "tls", program_path("device_query",
                                                                     CFG.variants[0]),
                                  extra=env)
                self.assertNotEqual(res.rc, 0, res.describe())
                self.assertIn(want, res.client_log, res.describe())
        with self.subTest(refused="plain tcp"):
            res = run_program(self.tmp, Over(srv, "tcp://127.0.0.1:%d" % port), "tcp",
                              program_path("device_query", CFG.variants[0]),
                              timeout_ms=5000)
            self.assertNotEqual(res.rc, 0, res.describe())
            deadline = time.monotonic() + 5
            while "TLS handshake with" not in srv.log_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertIn("TLS handshake with", srv.log_text())
        with self.subTest(case="garbage"):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(os.urandom(3000))
                s.settimeout(5)
                try:
                    while s.recv(4096):
                        pass
                except OSError:
                    pass
            self.run_ok(tls, "tls", "device_query", CFG.variants[0], extra=ca)
        self.stop_server(srv)

        with self.subTest(case="--tls-ca"):
            port = free_tcp_port()
            url = "tls://127.0.0.1:%d" % port
            srv = self.start_server(extra_args=["--listen", url, "--tls-cert", f("server.pem"),
                                                "--tls-key", f("server.key"),
                                                "--tls-ca", f("ca.pem")])
            tls = Over(srv, url)
            self.run_ok(tls, "tls", "memory_roundtrip", CFG.variants[0],
                        extra=dict(ca, FLYT_TLS_CERT=f("client.pem"),
                                   FLYT_TLS_KEY=f("client.key")))
            for who, env in (("none", {}), ("rogue", {"FLYT_TLS_CERT": f("rogue.pem"),
                                                      "FLYT_TLS_KEY": f("rogue.key")})):
                res = run_program(self.tmp, tls, "tls", program_path("device_query",
                                                                     CFG.variants[0]),
                                  extra=dict(ca, **env))
                self.assertNotEqual(res.rc, 0, who + "\n" + res.describe())
            self.assertTrue(srv.alive())
            self.stop_server(srv)

        with self.subTest(case="no certificate"):
            res = subprocess.run([CFG.server_bin, "--backend", "sim", "--listen", url],
                                 capture_output=True, text=True, timeout=30,
                                 env=clean_env({}))
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("--tls-cert", res.stderr)

    def test_listen_port_zero(self):
        """--listen tcp://127.0.0.1:0: the real port is in the start-up line and in stats."""
        ctl = os.path.join(self.tmp, "zero.ctl")
        log_path = os.path.join(self.tmp, "zero.log")
        err_path = os.path.join(self.tmp, "zero.stderr")
        cmd = [CFG.server_bin, "--listen", "tcp://127.0.0.1:0", "--backend", "sim",
               "--token", TOKEN, "--control", "unix://" + ctl]
        env = clean_env({"FLYT_LOG": "info", "FLYT_LOG_FILE": log_path})
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + SERVER_START_TIMEOUT_S
            while not os.path.exists(ctl) and time.monotonic() < deadline:
                self.assertIsNone(proc.poll(), read_text(err_path))
                time.sleep(0.05)
            stats = control_call(ctl, {"verb": "stats"})
            self.assertTrue(stats.get("ok"), stats)
            listen = stats.get("listen")
            self.assertEqual(len(listen), 1, stats)
            m = re.match(r"^tcp://127\.0\.0\.1:(\d+)$", listen[0])
            self.assertIsNotNone(m, stats)
            port = int(m.group(1))
            self.assertNotEqual(port, 0, stats)
            while listen[0] not in read_text(err_path) and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertIn(listen[0], read_text(err_path), "the start-up line lacks the port")

            class Fixed:
                @staticmethod
                def url(transport):
                    return listen[0]

            res = run_program(self.tmp, Fixed, "tcp", program_path("device_query",
                                                                   CFG.variants[0]))
            self.assertEqual(res.rc, 0, res.describe())
            self.assertIn("device_query: PASS", res.lines(), res.describe())
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            kill_group(proc)
        self.assertFalse(os.path.exists(ctl), "the control socket file outlived the server")


    # -- Flyt's NVML library (libnvidia-ml.so.1 beside libcuda.so.1; docs/nvml.md)

    def test_framework_calls(self):
        """What frameworks ask around every step costs no round trip: an attribute set to
        the value it has, function attributes, occupancy, capture queries, a second
        synchronize; only the scalar copy (PyTorch's .item()) waits for a reply. A
        synchronize after a launch still reaches the server. A child forked after
        initialisation gets CUDA errors at once and the parent keeps working, on every
        transport (over shm the child must not close the parent's rings). The driver's
        cuOccupancyMaxPotentialBlockSize runs the app's shared-memory callback here and
        honours the block size limit."""
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                srv = self.start_server()
                res = self.run_ok(srv, transport, "framework_calls", variant)
                kv = self.kv(res)
                where = res.describe()
                self.assertEqual(kv.get("flyt_stats"), "1", where)
                self.assertEqual(kv.get("sync_per_iter"), "1.00", where)
                self.assertEqual(kv.get("sync_after_launch"), "1", where)
                self.assertEqual(kv.get("fork_child_malloc"), "error", where)
                self.assertEqual(kv.get("fork_child_memcpy"), "error", where)
                for key in ("potential.block_within_limit", "potential.grid_positive",
                            "potential.callbacks_ran"):
                    self.assertEqual(kv.get(key), "1", "%s\n%s" % (key, where))
                self.assertEqual(kv.get("potential.rc"), "0", where)
                self.stop_server(srv)

    def test_ipc(self):
        """CUDA IPC between two client processes (ipc re-executes itself as the child) of
        one server, over every transport and cudart: the child reads the parent's bytes
        through the opened handle and writes its own (copy and memset), records the
        parent's interprocess event; the driver's errors for a process's own handles
        (201), bogus handles (1 for memory, 205 for events), non-interprocess events
        (400), pool memory (1), cudaFree and a close too many on opened memory (1),
        timing or re-exporting an opened event (400), each leaving the session working;
        the mapping the child leaves open is closed by the server when the child ends."""
        srv = self.start_server()
        expected = (("own_open", "201"), ("own_event_open", "201"), ("bogus_open", "1"),
                    ("garbage_open", "1"), ("bogus_event_open", "205"),
                    ("plain_event_export", "400"), ("pool_export", "1"),
                    ("child.read", "ok"), ("child.write", "ok"),
                    ("child.event_elapsed", "400"), ("child.event_reexport", "400"),
                    ("child.bogus_open", "1"), ("child.free_opened", "1"),
                    ("child.close_again", "1"), ("child.done", "ok"),
                    ("child.left_open", "1"), ("child_status", "0"), ("parent.read", "ok"))
        runs = 0
        for variant, transport in self.matrix():
            with self.subTest(variant=variant, transport=transport):
                res = self.run_ok(srv, transport, "ipc", variant, log_level="warn")
                runs += 1
                kv = self.kv(res)
                where = "%s\n%s" % (res.describe(), srv.logs())
                for key, want in expected:
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
        deadline = time.monotonic() + 10
        while (srv.log_text().count("closed 1 IPC memory mappings") < runs
               and time.monotonic() < deadline):
            time.sleep(0.1)
        self.assertEqual(srv.log_text().count("closed 1 IPC memory mappings"), runs,
                         "the server must close the mapping each child left open\n"
                         + srv.logs())
        self.stop_server(srv)

    def test_nvml(self):
        """nvml_query (a plain C program) through `flyt run`: the tenant's view (identity as
        CUDA reports it, memory total = quota, SMs, used memory and processes following this
        program's and another program's allocations), unsupported entry points logged once;
        nvmlInit without a server, with NVIDIA's libcuda.so.1 first, and a server killed
        while NVML is in use."""
        quota = 64 << 20
        held = 8 << 20  # what share_quota's "watch" mode holds
        prog = os.path.join(CFG.programs_dir, "nvml_query")
        fake_driver = os.path.join(CFG.programs_dir, "fake_driver")
        lib_dir = os.path.normpath(os.path.join(os.path.dirname(CFG.flyt_bin), os.pardir,
                                                "lib", "flyt"))
        nvml_lib = os.path.join(lib_dir, "libnvidia-ml.so.1")
        for path in (prog, nvml_lib, os.path.join(fake_driver, "libcuda.so.1")):
            self.assertTrue(os.path.isfile(path), "missing %s (build flyt_e2e)" % path)
        self.assert_nvml_exports(nvml_lib)

        for transport in CFG.transports:
            with self.subTest(transport=transport):
                srv = self.start_server(extra_args=["--memory-quota", "64M", "--sm-count", "20"])
                holder = RunningProgram(self.tmp, srv, transport,
                                        program_path("share_quota", CFG.variants[0]),
                                        ("watch", "60", "1", "1"))
                try:
                    if holder.wait_line(r"^ready$") is None:
                        self.fail("share_quota never got ready\n" + holder.finish(5).describe())
                    res = run_program(self.tmp, srv, transport, prog,
                                      ("check", str(quota), "20", str(holder.proc.pid),
                                       str(held)), log_level="info")
                finally:
                    kill_group(holder.proc)
                    holder.finish(10)
                self.assert_passed(res, "nvml_query", srv)
                kv = self.kv(res)
                where = res.describe()
                self.assertEqual(kv.get("name"), SIM_NAME, where)
                self.assertEqual(kv.get("uuid"), SIM_UUID, where)
                self.assertEqual(kv.get("bus_id"), SIM_BUS_ID, where)
                self.assertEqual(kv.get("compute_capability"), "9.0", where)
                self.assertEqual(kv.get("mem_total"), str(quota), where)
                self.assertEqual(kv.get("mem_used_before"), str(held), where)
                self.assertEqual(kv.get("mem_used_after"), str(held + (8 << 20)), where)
                self.assertEqual(kv.get("sm_count"), "20", where)
                # NCCL's start-up queries: the sim's GPU with itself, its PCIe link, no NVLink,
                # As NVIDIA's NVML answers on a PCIe H200 (tests/gpu: nvml_native).
                for key, want in (("p2p_read_self", "5"), ("p2p_write_self", "5"),
                                  ("p2p_bad_index_rc", "2"), ("topology_self_rc", "3"),
                                  ("pcie", "gen5 x16 speed_enum=5"), ("nvlink0_state_rc", "3"),
                                  ("nvlink18_state_rc", "2"), ("nvlink0_remote_rc", "3"),
                                  ("nvlink0_p2p_cap_rc", "3")):
                    self.assertEqual(kv.get(key), want, "%s\n%s" % (key, where))
                procs = sorted(l.split("=", 1)[1] for l in res.lines()
                               if l.startswith("process="))
                self.assertEqual(procs, sorted(["%d:%d" % (holder.proc.pid, held),
                                                "%s:%d" % (kv.get("pid"), 8 << 20)]), where)
                said = [l for l in res.client_log.splitlines()
                        if "nvmlDeviceGetBAR1MemoryInfo is not answered by Flyt's NVML" in l]
                self.assertEqual(len(said), 1, "want the unsupported entry point logged once "
                                 "(called twice)\n" + where)
                stray = [l for l in res.lines() if not re.match(r"^[a-z0-9_]+=", l)
                         and l != "nvml_query: PASS"]
                self.assertEqual(stray, [], "lines on stdout that the program did not print\n"
                                 + where)
                self.stop_server(srv)

        # No server: nvmlInit fails (NVML_ERROR_DRIVER_NOT_LOADED) within the timeout.
        class Nowhere:
            @staticmethod
            def url(transport):
                return "tcp://127.0.0.1:%d" % free_tcp_port()

        res = run_program(self.tmp, Nowhere, "tcp", prog, ("noserver",),
                          timeout_ms=SHORT_CLIENT_TIMEOUT_MS)
        where = res.describe()
        self.assertEqual(res.rc, 0, where)
        self.assertEqual(self.kv(res).get("init_rc"), "9", where)
        self.assertLess(res.elapsed, SHORT_CLIENT_TIMEOUT_MS / 1000.0 + DEAD_SERVER_SLACK_S, where)
        self.assertIn("flyt-server cannot be reached", res.client_log, where)

        # NVIDIA's libcuda.so.1 found first: NVML_ERROR_LIBRARY_NOT_FOUND and why.
        env = clean_env({"LD_LIBRARY_PATH": fake_driver + os.pathsep + lib_dir,
                         "E2E_WATCHDOG_S": RUN_TIMEOUT_S - 20})
        proc = subprocess.run([prog, "notflyt"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, env=env, timeout=RUN_TIMEOUT_S)
        out, err = proc.stdout.decode(), proc.stderr.decode()
        where = "--- stdout:\n%s\n--- stderr:\n%s" % (out, err)
        self.assertEqual(proc.returncode, 0, where)
        self.assertIn("init_rc=12", out.splitlines(), where)
        self.assertIn("run the program under `flyt run`", err, where)

        # The server dies while NVML is in use: NVML_ERROR_GPU_IS_LOST, no hang.
        srv = self.start_server()
        prog_run = RunningProgram(self.tmp, srv, CFG.transports[0], prog, ("gone",),
                                  timeout_ms=SHORT_CLIENT_TIMEOUT_MS)
        try:
            if prog_run.wait_line(r"^ready$") is None:
                self.fail("nvml_query gone never got ready\n" + prog_run.finish(5).describe())
            killed = time.monotonic()
            srv.kill()
            res = prog_run.finish(SHORT_CLIENT_TIMEOUT_MS / 1000.0 + DEAD_SERVER_SLACK_S + 5)
        finally:
            kill_group(prog_run.proc)
        where = res.describe()
        self.assertEqual(res.rc, 0, where)
        self.assertIn("lost_rc=15", res.lines(), where)
        self.assertLess(time.monotonic() - killed,
                        SHORT_CLIENT_TIMEOUT_MS / 1000.0 + DEAD_SERVER_SLACK_S, where)

    def assert_nvml_exports(self, path):
        """Only nvml* entry points (and Flyt's marker) leave libnvidia-ml.so.1."""
        nm = shutil.which("nm")
        if nm is None:
            return
        out = subprocess.run([nm, "-D", "--defined-only", path], stdout=subprocess.PIPE,
                             check=True).stdout.decode()
        names = [l.split()[-1] for l in out.splitlines() if l.strip()]
        stray = [n for n in names if not n.startswith("nvml") and n != "flyt_nvml_marker"]
        self.assertEqual(stray, [], "symbols that are not NVML entry points")
        for name in ("nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString",
                     "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
                     "nvmlDeviceGetUUID", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
                     "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetComputeRunningProcesses_v3",
                     "nvmlDeviceGetPciInfo_v3", "nvmlSystemGetCudaDriverVersion_v2",
                     "nvmlDeviceGetNvLinkRemoteDeviceType"):
            self.assertIn(name, names)


# ---------------------------------------------------------------------------------------


    # -- one worker process per client process (issue 12)

    def stats_when(self, srv, pred, timeout=15.0):
        """The first stats answer for which pred(stats) holds (or the last one)."""
        deadline = time.monotonic() + timeout
        stats = srv.control({"verb": "stats"})
        while not pred(stats) and time.monotonic() < deadline:
            time.sleep(0.05)
            stats = srv.control({"verb": "stats"})
        return stats

    def worker_of(self, srv, client_pid, timeout=15.0):
        """The pid of the worker serving the client process `client_pid`."""
        stats = self.stats_when(srv, lambda s: any(
            w["client_pid"] == client_pid and w["state"] == "serving" for w in s["workers"]),
            timeout)
        for w in stats["workers"]:
            if w["client_pid"] == client_pid and w["state"] == "serving":
                return w["pid"]
        self.fail("no worker serves client pid %d: %s\n%s" % (client_pid, stats, srv.logs()))

    @staticmethod
    def client_pid(running):
        """The pid of the program `flyt run` started (it execs the program)."""
        return running.proc.pid

    def test_process_isolation(self):
        """A client's sticky fault ends only that client: the others of the same server,
        on every transport, keep working; each client has a worker process of its own."""
        srv = self.start_server(control=True)
        prog = program_path("isolation", CFG.variants[0])
        workers = []
        for k, transport in enumerate(CFG.transports * 2):
            workers.append(RunningProgram(self.tmp, srv, transport, prog, ["work", "4"]))
        time.sleep(1.0)
        faults = [run_program(self.tmp, srv, t, prog, ["fault"]) for t in CFG.transports]
        for res in faults:
            self.assert_passed(res, "isolation fault", srv)
            self.assertIn("synchronize cudaErrorIllegalAddress", res.stdout, res.describe())
            self.assertIn("device count cudaSuccess", res.stdout, res.describe())
        stats = srv.control({"verb": "stats"})
        pids = [w["pid"] for w in stats["workers"] if w["state"] == "serving"]
        self.assertEqual(len(pids), len(set(pids)), "two clients share a worker: %s" % stats)
        self.assertNotIn(stats["pid"], pids, "a client is served by the main process")
        for w in workers:
            self.assert_passed(w.finish(), "isolation work", srv)
        # The server and a new client are unaffected; no worker crashed.
        self.run_ok(srv, CFG.transports[0], "isolation", CFG.variants[-1], ["work", "0"])
        stats = self.stats_when(srv, lambda s: s["sessions"] == 0)
        self.assertEqual(stats["workers_crashed"], 0, "%s\n%s" % (stats, srv.logs()))
        self.assertGreaterEqual(stats["workers_started"], len(workers) + len(faults) + 1)
        self.assertEqual(stats["memory_used"], 0, stats)
        self.assertIn("sticky error", srv.log_text())
        # The pool's idle workers were replaced after the faults (under MPS an idle
        # client would keep the MPS server from recovering), and the pool is full again.
        self.assertIn("idle worker(s) replaced", srv.log_text(), srv.logs())
        stats = self.stats_when(srv, lambda s: s["pool_idle"] == s["pool_size"])
        self.assertEqual(stats["pool_idle"], stats["pool_size"], stats)
        self.stop_server(srv)

    def test_quota_across_processes(self):
        """The memory quota holds for all of a tenant's processes together, and a killed
        client's memory returns to it."""
        srv = self.start_server(control=True, extra_args=["--memory-quota", "64M"])
        prog = program_path("isolation", CFG.variants[0])
        for transport in CFG.transports:
            holder = RunningProgram(self.tmp, srv, transport, prog, ["hold", "40"])
            self.assertIsNotNone(holder.wait_line(r"^holding"), srv.logs())
            stats = self.stats_when(srv, lambda s: s["memory_used"] >= 40 << 20)
            self.assertEqual(stats["memory_used"], 40 << 20, stats)
            worker = self.worker_of(srv, self.client_pid(holder))
            self.assertEqual([w["memory_used"] for w in stats["workers"] if w["pid"] == worker],
                             [40 << 20], stats)
            res = self.run_ok(srv, transport, "isolation", CFG.variants[-1], ["alloc", "32"])
            self.assertIn("alloc 32 MiB: cudaErrorMemoryAllocation", res.stdout, res.describe())
            res = self.run_ok(srv, transport, "isolation", CFG.variants[-1], ["alloc", "16"])
            self.assertIn("alloc 16 MiB: cudaSuccess", res.stdout, res.describe())
            os.killpg(holder.proc.pid, signal.SIGKILL)
            holder.finish(timeout=10)
            stats = self.stats_when(srv, lambda s: s["memory_used"] == 0 and s["sessions"] == 0)
            self.assertEqual(stats["memory_used"], 0, "%s\n%s" % (stats, srv.logs()))
            self.assertEqual(stats["workers_crashed"], 0, stats)  # the client died, not the worker
            res = self.run_ok(srv, transport, "isolation", CFG.variants[-1], ["alloc", "32"])
            self.assertIn("alloc 32 MiB: cudaSuccess", res.stdout, res.describe())
        self.stop_server(srv)

    def test_worker_killed(self):
        """kill -9 of a worker: its memory returns to the
        quota, the crash is logged and counted, the other clients and the server go on."""
        srv = self.start_server(control=True, extra_args=["--memory-quota", "64M"])
        prog = program_path("isolation", CFG.variants[0])
        for transport in CFG.transports:
            holder = RunningProgram(self.tmp, srv, transport, prog, ["hold", "24"],
                                    extra={"E2E_WATCHDOG_S": "0"})
            bystander = RunningProgram(self.tmp, srv, transport, prog, ["work", "3"])
            self.assertIsNotNone(holder.wait_line(r"^holding"), srv.logs())
            crashed = srv.control({"verb": "stats"})["workers_crashed"]
            worker = self.worker_of(srv, self.client_pid(holder))
            os.kill(worker, signal.SIGKILL)
            stats = self.stats_when(srv, lambda s: s["workers_crashed"] == crashed + 1 and
                                    s["memory_used"] == 0)
            self.assertEqual(stats["workers_crashed"], crashed + 1, "%s\n%s" % (stats, srv.logs()))
            self.assertEqual(stats["memory_used"], 0, stats)
            self.assertNotIn(worker, [w["pid"] for w in stats["workers"]])
            self.assertIn("worker %d" % worker, srv.log_text())
            self.assert_passed(bystander.finish(), "isolation work", srv)
            os.killpg(holder.proc.pid, signal.SIGKILL)  # it waits in pause()
            holder.finish(timeout=10)
            self.run_ok(srv, transport, "isolation", CFG.variants[-1], ["work", "0"])
        self.stop_server(srv)

    def test_live_share_across_workers(self):
        """set-share reaches every worker: three clients of one server (fake green
        contexts: each worker makes its own and moves its streams) see the new SM count
        and quota at their next call, and their streams keep working."""
        srv = self.start_server(control=True, extra_args=[
            "--memory-quota", "64M", "--sm-count", "20", "--sim-green-contexts"])
        new_quota = 48 << 20
        prog = program_path("share_quota", CFG.variants[0])
        watchers = [RunningProgram(self.tmp, srv, t, prog, ("watch", "60", "40", str(new_quota)))
                    for t in CFG.transports]
        try:
            for w in watchers:
                self.assertIsNotNone(w.wait_line(r"^ready$"), "%s\n%s" % (w.out, srv.logs()))
            self.assert_stats(srv, sessions=len(watchers), memory_used=(8 << 20) * len(watchers))
            answer = srv.control({"verb": "set-share", "sm": 36, "memory_bytes": new_quota})
            self.assertTrue(answer.get("ok"), "%s\n%s" % (answer, srv.logs()))
        finally:
            results = [w.finish() for w in watchers]
        for res in results:
            self.assert_passed(res, "share_quota", srv)
            self.assertIn("change sm=40 total=%d" % new_quota, res.lines(), res.describe())
        stats = self.stats_when(srv, lambda st: st["sessions"] == 0)
        self.assertEqual((stats["sm"], stats["memory_used"], stats["switch_pending"]),
                         (40, 0, 0), stats)
        self.assertGreaterEqual(len(re.findall(r"stream\(s\) moved", srv.log_text())),
                                len(watchers), srv.logs())
        self.stop_server(srv)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", help="directory holding flyt-server and flyt")
    ap.add_argument("--server-bin", help="path of flyt-server")
    ap.add_argument("--flyt-bin", help="path of the flyt launcher")
    ap.add_argument("--programs-dir", help="directory of the built e2e programs "
                    "(default: <bin-dir>/../tests/e2e/programs)")
    ap.add_argument("--variants", default="static,shared")
    ap.add_argument("--transports", default="tcp,unix,shm")
    ap.add_argument("--ucx-tls", help="UCX_TLS for servers and clients (ucx transport)")
    ap.add_argument("--keep", action="store_true", help="keep temporary directories")
    args, rest = ap.parse_known_args()

    if args.bin_dir:
        CFG.server_bin = os.path.join(args.bin_dir, "flyt-server")
        CFG.flyt_bin = os.path.join(args.bin_dir, "flyt")
        CFG.programs_dir = os.path.join(args.bin_dir, os.pardir, "tests", "e2e", "programs")
    if args.server_bin:
        CFG.server_bin = args.server_bin
    if args.flyt_bin:
        CFG.flyt_bin = args.flyt_bin
    if args.programs_dir:
        CFG.programs_dir = args.programs_dir
    if not (CFG.server_bin and CFG.flyt_bin and CFG.programs_dir):
        ap.error("give --bin-dir, or --server-bin, --flyt-bin and --programs-dir")
    CFG.server_bin = os.path.abspath(CFG.server_bin)
    CFG.flyt_bin = os.path.abspath(CFG.flyt_bin)
    CFG.programs_dir = os.path.abspath(CFG.programs_dir)
    CFG.variants = tuple(v for v in args.variants.split(",") if v)
    CFG.transports = tuple(t for t in args.transports.split(",") if t)
    for v in CFG.variants:
        if v not in ("static", "shared"):
            ap.error("unknown variant %r" % v)
    for t in CFG.transports:
        if t not in ("tcp", "unix", "shm", "ucx"):
            ap.error("unknown transport %r" % t)
    CFG.ucx_tls = args.ucx_tls
    CFG.keep = args.keep
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
