#!/usr/bin/env python3
"""Process isolation through one flyt-server, proven on a GPU host.

Called by run_isolation.sh (which sets the environment and cleans up after a
kill); python3 standard library only.

  isolation.py --build BUILD_DIR --bins BIN_DIR --out OUTFILE --work WORKDIR [--budget S]

1. Native round: a schedule of programs runs natively, many at once:
   wave 1 (well-behaved programs, two `steady` neighbours that keep a context
   busy, device printf with tags), then, once both `steady` runs have finished
   an iteration, the three faulting programs (illegal address, device assert,
   trap), then wave 2 (more well-behaved programs and printf tags) and the
   faulting programs a second time.
2. One flyt-server (--listen tcp://127.0.0.1:0, unix://, shm://, --control
   unix://) serves the same schedule once per transport (MODES). A run passes
   when its exit code and stdout equal its native run's (faulting programs
   included: they must fail exactly as natively, and nobody else may).
   Afterwards the same server must still serve vector_add on every transport.
   The control socket's stats are sampled throughout: which worker served
   which client process, workers_crashed, the RSS of idle pool workers and of
   the main process.
3. first_kernel: process start -> first kernel done (CLOCK_REALTIME stamped by
   this script just before it starts the process, and by the program after
   its first launch + cudaDeviceSynchronize), native vs Flyt with the pool
   warm (default pool) and cold (--worker-pool 0), median of TIMING_RUNS runs
   per transport.
Writes OUTFILE (markdown). Exit 0 when every isolation check passed, 1 if
not, 2 on bad usage. Timings never fail the run.

Environment (defaults in run_isolation.sh): MODES, SERVER_BACKEND, VARIANT,
RUN_TIMEOUT, TIMING_RUNS, SERVER_LOG_LEVEL, CLIENT_LOG_LEVEL, FLYT_TOKEN,
ISO_WAVE1, ISO_FAULTS, ISO_WAVE2, ISO_STEADY_S, ISO_WORKER_POOL (warm server's
--worker-pool; empty = the server's default), ISO_COLD_POOL_ARGS (default
"--worker-pool 0"), ISO_CTL_PROTO (auto|framed|lines), ISO_SAMPLE_MS.
"""

import argparse
import json
import os
import re
import shlex
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

T0 = time.monotonic()
ENV = os.environ


def env_str(name, default):
    v = ENV.get(name)
    return default if v is None else v


def env_int(name, default):
    try:
        return int(ENV.get(name, default))
    except ValueError:
        return default


MODES = env_str("MODES", "tcp unix shm").split()
BACKEND = env_str("SERVER_BACKEND", "cuda")
VARIANT = env_str("VARIANT", "static")
RUN_TIMEOUT = env_int("RUN_TIMEOUT", 60)
TIMING_RUNS = env_int("TIMING_RUNS", 10)
SERVER_LOG_LEVEL = env_str("SERVER_LOG_LEVEL", "info")
CLIENT_LOG_LEVEL = env_str("CLIENT_LOG_LEVEL", "warn")
TOKEN = env_str("FLYT_TOKEN", "")
WAVE1 = env_str(
    "ISO_WAVE1",
    "vector_add matmul_tiled reduce_atomic streams_events cublas_sgemm device_printf symbols "
    "multithread_streams steady steady printf_tag:1 printf_tag:2").split()
FAULTS = env_str("ISO_FAULTS", "fault_illegal_address fault_device_assert fault_trap").split()
WAVE2 = env_str(
    "ISO_WAVE2",
    "vector_add matmul_tiled cuda_graphs device_printf printf_tag:3 printf_tag:4 async_mempool").split()
STEADY_S = env_str("ISO_STEADY_S", "6")
WARM_POOL = env_str("ISO_WORKER_POOL", "")
COLD_POOL_ARGS = shlex.split(env_str("ISO_COLD_POOL_ARGS", "--worker-pool 0"))
CTL_PROTO = env_str("ISO_CTL_PROTO", "auto")
# What each run is compared with: "native" (the schedule run natively, all at
# once), or "alone" (each program alone, one at a time, through the same
# server over the first mode: for plumbing checks with the sim backend, where
# no native run works).
REFERENCE = env_str("ISO_REFERENCE", "alone" if BACKEND == "sim" else "native")
SAMPLE_S = env_int("ISO_SAMPLE_MS", 50) / 1000.0
ISOLATION_PROGRAMS = ("steady", "printf_tag", "first_kernel")

LIVE = {}  # pid -> Popen of everything started (runs and servers), for clean-up
LIVE_LOCK = threading.Lock()


def log(msg):
    print("[isolation %s +%ds] %s" % (time.strftime("%H:%M:%S"), time.monotonic() - T0, msg),
          file=sys.stderr, flush=True)


def track(p, pidfile_dir):
    with LIVE_LOCK:
        LIVE[p.pid] = p
    try:  # run_isolation.sh kills what is listed here if this script dies first
        with open(os.path.join(pidfile_dir, str(p.pid)), "w") as f:
            f.write(" ".join(p.args) if isinstance(p.args, list) else str(p.args))
    except OSError:
        pass


def untrack(p, pidfile_dir):
    with LIVE_LOCK:
        LIVE.pop(p.pid, None)
    try:
        os.unlink(os.path.join(pidfile_dir, str(p.pid)))
    except OSError:
        pass


def kill_group(p, sig):
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            p.send_signal(sig)
        except (ProcessLookupError, OSError):
            pass


def kill_everything():
    with LIVE_LOCK:
        procs = list(LIVE.values())
    for p in procs:
        if p.poll() is None:
            kill_group(p, signal.SIGTERM)
    end = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_group(p, signal.SIGKILL)
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass


class Deadline(Exception):
    pass


# --------------------------------------------------------------- control --
def _recv_exact(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise OSError("control socket closed")
        data += chunk
    return data


def _ctl_framed(path, body, timeout):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(struct.pack("<I", len(body)) + body)
        (n,) = struct.unpack("<I", _recv_exact(s, 4))
        if n > (16 << 20):
            raise OSError("control answer of %d bytes" % n)
        return json.loads(_recv_exact(s, n).decode())


def _ctl_lines(path, body, timeout):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(body + b"\n")
        data = b""
        while b"\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return json.loads(data.split(b"\n", 1)[0].decode())


class Control:
    """The server's control socket: 4-byte-length framing (docs/control_plane.md)
    or JSON lines; 'auto' finds out which on the first request."""

    def __init__(self, path):
        self.path = path
        self.proto = CTL_PROTO if CTL_PROTO in ("framed", "lines") else None

    def call(self, request, timeout=5.0):
        body = json.dumps(request).encode()
        if self.proto == "framed":
            return _ctl_framed(self.path, body, timeout)
        if self.proto == "lines":
            return _ctl_lines(self.path, body, timeout)
        try:
            answer = _ctl_framed(self.path, body, min(timeout, 3.0))
            self.proto = "framed"
            return answer
        except (OSError, ValueError, struct.error):
            pass
        answer = _ctl_lines(self.path, body, timeout)
        self.proto = "lines"
        return answer

    def stats(self, timeout=5.0):
        try:
            a = self.call({"verb": "stats"}, timeout)
            return a if isinstance(a, dict) else None
        except (OSError, ValueError, struct.error):
            return None


def rss_kib(pid):
    try:
        out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True,
                             timeout=5).stdout.strip()
        return int(out) if out else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def rc_text(rc):
    if isinstance(rc, int) and rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return "signal %d" % -rc
    return str(rc)


def mib(nbytes):
    return "n/a" if nbytes is None else "%.1f MiB" % (nbytes / 1048576.0)


# ---------------------------------------------------------------- server --
class Server:
    def __init__(self, h, name, extra_args):
        self.h = h
        self.name = name
        d = os.path.join(h.work, "srv-" + name)
        os.makedirs(d, exist_ok=True)
        self.dir = d
        self.ctl_path = os.path.join(d, "control.sock")
        self.unix_path = os.path.join(d, "flyt.sock")
        self.shm_path = os.path.join(d, "flyt-shm.sock")
        self.log_path = os.path.join(h.work, "logs", "server-%s.log" % name)
        self.argv = [h.server_bin, "--backend", BACKEND, "--listen", "tcp://127.0.0.1:0",
                     "--listen", "unix://" + self.unix_path]
        if "shm" in MODES:
            self.argv += ["--listen", "shm://" + self.shm_path]
        self.argv += ["--control", "unix://" + self.ctl_path] + extra_args
        if TOKEN:
            self.argv += ["--token", TOKEN]
        self.proc = None
        self.ctl = Control(self.ctl_path)
        self.urls = {}
        self.first_stats = None
        self.start_error = ""
        self.starts = 0

    def start(self, wait_s=30):
        self.urls = {}
        self.starts += 1
        for p in (self.ctl_path, self.unix_path, self.shm_path):
            try:
                os.unlink(p)
            except OSError:
                pass
        with open(self.log_path, "ab") as logf:
            logf.write(("# %s started %s\n# %s\n" % (self.name, time.strftime("%H:%M:%S"),
                                                     " ".join(self.argv))).encode())
            logf.flush()
            env = dict(ENV, FLYT_LOG=SERVER_LOG_LEVEL)
            env.pop("FLYT_LOG_FILE", None)
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)
        track(self.proc, self.h.pid_dir)
        end = time.monotonic() + wait_s
        stats = None
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                self.start_error = "exited with %s during start-up" % rc_text(self.proc.returncode)
                return False
            if os.path.exists(self.ctl_path):
                stats = self.ctl.stats(timeout=3)
                if stats and stats.get("ok"):
                    break
            time.sleep(0.1)
        if not stats or not stats.get("ok"):
            self.start_error = "no answer on the control socket after %d s" % wait_s
            return False
        for url in stats.get("listen", []):
            for kind in ("tcp", "unix", "shm"):
                if isinstance(url, str) and url.startswith(kind + "://"):
                    self.urls.setdefault(kind, url)
        self.urls.setdefault("unix", "unix://" + self.unix_path)
        if "shm" in MODES:
            self.urls.setdefault("shm", "shm://" + self.shm_path)
        # Listeners accept?
        while time.monotonic() < end:
            if self._listeners_ready():
                break
            time.sleep(0.1)
        self.first_stats = stats
        log("server %s ready (pid %d, %s, control %s)" %
            (self.name, self.proc.pid, " ".join(self.urls.get(m, "?") for m in MODES), self.ctl.proto))
        return True

    def _listeners_ready(self):
        tcp = self.urls.get("tcp", "")
        m = re.match(r"tcp://([^:/]+):(\d+)", tcp)
        try:
            if m:
                with socket.create_connection((m.group(1), int(m.group(2))), timeout=2):
                    pass
            if "unix" in MODES:
                with socket.socket(socket.AF_UNIX) as s:
                    s.settimeout(2)
                    s.connect(self.unix_path)
            if "shm" in MODES and not os.path.exists(self.shm_path):
                return False
        except OSError:
            return False
        return True

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def wait_pool_full(self, timeout):
        """Waits until pool_idle >= pool_size (when stats have them); returns stats."""
        end = time.monotonic() + timeout
        st = self.ctl.stats()
        while st and "pool_idle" in st and "pool_size" in st and time.monotonic() < end:
            if st["pool_idle"] >= st["pool_size"]:
                break
            time.sleep(0.05)
            st = self.ctl.stats()
        return st

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            kill_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_group(self.proc, signal.SIGKILL)
                self.proc.wait(timeout=5)
        untrack(self.proc, self.h.pid_dir)

    def log_size(self):
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0


class Sampler(threading.Thread):
    """Samples the server's stats every SAMPLE_S seconds into a JSON-lines file."""

    def __init__(self, server, path):
        super().__init__(daemon=True)
        self.server = server
        self.path = path
        self.stop_ev = threading.Event()
        self.samples = []

    def run(self):
        with open(self.path, "a") as f:
            while not self.stop_ev.is_set():
                st = self.server.ctl.stats(timeout=2)
                if st is not None:
                    st["_t"] = round(time.monotonic() - T0, 3)
                    self.samples.append(st)
                    f.write(json.dumps(st) + "\n")
                self.stop_ev.wait(SAMPLE_S)

    def finish(self):
        self.stop_ev.set()
        self.join(timeout=10)
        return self.samples


# ------------------------------------------------------------------ runs --
class Run:
    def __init__(self, label, prog, args, binary):
        self.label = label
        self.prog = prog
        self.args = args
        self.binary = binary
        self.proc = None
        self.rc = None
        self.timed_out = False
        self.t_spawn = 0.0
        self.t_end = 0.0
        self.spawn_ns = 0
        self.limit = 0
        self.base = ""
        self.slog = None
        self.soff = 0
        self.send = 0
        self.start_rel = 0.0  # seconds after the round began

    @property
    def wall(self):
        return self.t_end - self.t_spawn


class Harness:
    def __init__(self, a):
        self.build = os.path.abspath(a.build)
        self.bins = os.path.abspath(a.bins)
        self.out = a.out
        self.work = os.path.abspath(a.work)
        self.budget = a.budget
        self.deadline = T0 + a.budget
        self.server_bin = os.path.join(self.build, "bin", "flyt-server")
        self.flyt_bin = os.path.join(self.build, "bin", "flyt")
        self.pid_dir = os.path.join(self.work, "pids")
        for d in ("out", "logs", "pids"):
            os.makedirs(os.path.join(self.work, d), exist_ok=True)
        self.expect = {}
        try:
            with open(os.path.join(self.bins, "programs.tsv")) as f:
                for line in f:
                    parts = line.rstrip("\n").split("\t")
                    if len(parts) >= 2 and parts[0] != "name":
                        self.expect[parts[0]] = parts[1]
        except OSError:
            pass
        self.events = []
        self.failures = []  # (title, markdown body)
        self.native = {}  # label -> Run
        self.results = {}  # mode -> {label: Run}
        self.cells = {}  # mode -> {label: (ok, text)}
        self.rounds = {}  # mode -> dict of round facts
        self.health = {}  # mode -> (ok, text)
        self.server_facts = {}
        self.timing = {}  # (kind, mode) -> list of dicts
        self.timing_notes = []
        self.schedule = []
        self.warm = None
        self.reference_bad = []

    def left(self):
        return self.deadline - time.monotonic()

    # ---------------------------------------------------------- binaries --
    def binary(self, prog):
        if prog in ISOLATION_PROGRAMS:
            return os.path.join(self.bins, "isolation", prog + ".static")
        return os.path.join(self.bins, "%s.%s" % (prog, VARIANT))

    def make_schedule(self):
        """[(phase, label, prog, args)]; labels are unique (name#n, printf_tag:T)."""
        counts = {}
        sched = []

        def add(phase, token):
            prog, _, arg = token.partition(":")
            key = prog + (":" + arg if arg else "")
            counts[key] = counts.get(key, 0) + 1
            label = key if counts[key] == 1 else "%s#%d" % (key, counts[key])
            if counts[key] == 2:  # first one gets its #1 too, for symmetry
                for i, (ph, lb, pg, ag) in enumerate(sched):
                    if lb == key:
                        sched[i] = (ph, key + "#1", pg, ag)
            sched.append((phase, label, prog, [arg] if arg else []))

        for t in WAVE1:
            add("wave1", t)
        for t in FAULTS:
            add("faults1", t)
        for t in WAVE2:
            add("wave2", t)
        for t in FAULTS:
            add("faults2", t)
        self.schedule = sched

    # -------------------------------------------------------------- runs --
    def spawn(self, run, mode, server, tag_dir, extra_env=None):
        base = os.path.join(self.work, "out", tag_dir, run.label.replace(":", "_").replace("#", "_"))
        os.makedirs(os.path.dirname(base), exist_ok=True)
        run.base = base
        env = dict(ENV)
        env.pop("FLYT_LOG_FILE", None)
        env["FLYT_ISO_STEADY_S"] = STEADY_S
        env["FLYT_ISO_READY_FILE"] = base + ".ready"
        if extra_env:
            env.update(extra_env)
        try:
            os.unlink(base + ".ready")
        except OSError:
            pass
        if mode == "native":
            argv = [run.binary] + run.args
        else:
            env["FLYT_LOG"] = CLIENT_LOG_LEVEL
            env["FLYT_LOG_FILE"] = base + ".client.log"
            env["FLYT_SHM"] = "off" if mode in ("tcp", "unix") else env.get("FLYT_SHM", "auto")
            argv = [self.flyt_bin, "run", "--server", server.urls.get(mode, "")]
            if TOKEN:
                argv += ["--token", TOKEN]
            argv += ["--", run.binary] + run.args
            run.slog = server.log_path
            run.soff = server.log_size()
        run.limit = max(5, min(RUN_TIMEOUT, int(self.left()) - 5))
        out = open(base + ".out", "wb")
        err = open(base + ".err", "wb")
        run.spawn_ns = time.time_ns()
        env["FLYT_ISO_SPAWN_NS"] = str(run.spawn_ns)
        run.t_spawn = time.monotonic()
        try:
            run.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        cwd=self.bins, env=env, start_new_session=True)
            track(run.proc, self.pid_dir)
        except OSError as e:
            err.write(("cannot start: %s\n" % e).encode())
            run.rc = 127
            run.t_end = time.monotonic()
        finally:
            out.close()
            err.close()
        return run

    def reap(self, runs, block_until=None, server=None):
        """Polls runs; kills those past their limit. Returns when all have ended
        (block_until None) or at block_until (monotonic)."""
        while True:
            pending = 0
            now = time.monotonic()
            for r in runs:
                if r.proc is None or r.rc is not None:
                    continue
                rc = r.proc.poll()
                if rc is None:
                    if now - r.t_spawn > r.limit:
                        if not r.timed_out:
                            r.timed_out = True
                            r.t_kill = now
                            kill_group(r.proc, signal.SIGTERM)
                        elif now - r.t_kill > 5:
                            kill_group(r.proc, signal.SIGKILL)
                    pending += 1
                    continue
                r.rc = 124 if r.timed_out else rc
                r.t_end = now
                untrack(r.proc, self.pid_dir)
                if server is not None:
                    r.send = server.log_size()
            if pending == 0 or (block_until is not None and now >= block_until):
                return pending
            time.sleep(0.01)

    def run_round(self, mode, server):
        """Runs the schedule once (natively or through server over mode)."""
        runs = []
        t_round = time.monotonic()
        by_phase = {}
        for phase, label, prog, args in self.schedule:
            r = Run(label, prog, args, self.binary(prog))
            by_phase.setdefault(phase, []).append(r)
        facts = {"fault_start": None, "steady_ready": "n/a"}

        def start(phase):
            for r in by_phase.get(phase, []):
                if not os.access(r.binary, os.X_OK):
                    r.rc = "missing"
                    continue
                self.spawn(r, mode, server, mode)
                r.start_rel = time.monotonic() - t_round
                runs.append(r)

        start("wave1")
        # Faults start once every steady neighbour has finished an iteration
        # (it is then known to hold a working context), or has ended, or after 30 s.
        steady = [r for r in by_phase.get("wave1", []) if r.prog == "steady" and r.proc]
        end = time.monotonic() + min(30, max(1, self.left() - 10))
        while steady and time.monotonic() < end:
            self.reap(runs, block_until=time.monotonic(), server=server)
            if all(os.path.exists(r.base + ".ready") or r.rc is not None for r in steady):
                break
            time.sleep(0.02)
        if steady:
            ready = sum(os.path.exists(r.base + ".ready") and r.rc is None for r in steady)
            facts["steady_ready"] = "%d of %d steady runs were mid-run when the faults started" % (
                ready, len(steady))
        facts["fault_start"] = time.monotonic() - t_round
        start("faults1")
        self.reap(runs, block_until=time.monotonic() + 0.3, server=server)
        start("wave2")
        start("faults2")
        self.reap(runs, server=server)
        facts["seconds"] = time.monotonic() - t_round
        # Most processes alive at once.
        ev = []
        for r in runs:
            ev.append((r.t_spawn, 1))
            ev.append((r.t_end, -1))
        cur = peak = 0
        for _, d in sorted(ev):
            cur += d
            peak = max(peak, cur)
        facts["peak"] = peak
        facts["count"] = len(runs)
        allruns = [r for ph in ("wave1", "faults1", "wave2", "faults2") for r in by_phase.get(ph, [])]
        return allruns, facts

    # ------------------------------------------------------------ compare --
    def read(self, path, limit=None):
        try:
            with open(path, "rb") as f:
                return f.read() if limit is None else f.read(limit)
        except OSError:
            return b""

    def compare(self, mode, r):
        n = self.native.get(r.label)
        if r.rc == "missing":
            return False, "FAIL: binary missing"
        if n is None or n.rc is None:
            return None, "SKIP (no reference run)"
        if n.rc == "missing":
            return False, "FAIL: binary missing"
        nerr = self.read(n.base + ".err")
        if b"error while loading shared libraries" in nerr:
            return None, "SKIP (reference run cannot load its libraries)"
        reasons = []
        if r.timed_out:
            reasons.append("timeout after %d s" % r.limit)
        elif r.rc != n.rc:
            reasons.append("rc %s, %s %s" % (rc_text(r.rc), self.ref_name(), rc_text(n.rc)))
        nout = self.read(n.base + ".out")
        out = self.read(r.base + ".out")
        if nout != out:
            reasons.append("stdout differs")
        if not reasons:
            return True, "PASS %.2f s" % r.wall
        why = "; ".join(reasons)
        self.add_failure(mode, r, n, why)
        return False, "FAIL: %s (%.2f s)" % (why, r.wall)

    def add_failure(self, mode, r, n, why):
        import difflib
        a = self.read(n.base + ".out").decode(errors="replace").splitlines()
        b = self.read(r.base + ".out").decode(errors="replace").splitlines()
        diff = list(difflib.unified_diff(a, b, self.ref_name(), mode, lineterm="", n=1))[:40]
        body = ["stdout diff (%s vs %s), first 40 lines:" % (self.ref_name(), mode), "```diff"]
        body += diff + ["```"]
        err = self.read(r.base + ".err").decode(errors="replace").splitlines()[-30:]
        body += ["stderr of the %s run, last 30 lines:" % mode, "```"] + err + ["```"]
        clog = self.read(r.base + ".client.log").decode(errors="replace").splitlines()[-30:]
        if clog:
            body += ["client log, last 30 lines:", "```"] + clog + ["```"]
        if r.slog and r.send > r.soff:
            with open(r.slog, "rb") as f:
                f.seek(r.soff)
                win = f.read(min(r.send - r.soff, 1 << 20)).decode(errors="replace").splitlines()
            body += ["server log written during this run (other sessions interleaved), "
                     "first 40 lines:", "```"] + win[:40] + ["```"]
        self.failures.append(("%s via %s: %s" % (r.label, mode, why), "\n".join(body)))

    # ------------------------------------------------------------ phases --
    def phase_native(self):
        log("native round: %d runs" % len(self.schedule))
        runs, facts = self.run_round("native", None)
        self.native = {r.label: r for r in runs}
        self.rounds["native"] = facts
        self.check_reference(runs)

    def phase_alone(self, srv):
        """Reference runs for REFERENCE=alone: each program by itself through srv."""
        mode = MODES[0]
        log("reference: %d runs alone via %s" % (len(self.schedule), mode))
        runs = []
        for _, label, prog, args in self.schedule:
            r = Run(label, prog, args, self.binary(prog))
            if not os.access(r.binary, os.X_OK):
                r.rc = "missing"
            elif self.left() > 20:
                self.spawn(r, mode, srv, "alone-" + mode)
                self.reap([r], server=srv)
            runs.append(r)
        self.native = {r.label: r for r in runs}
        self.check_reference(runs)

    def check_reference(self, runs):
        bad = []
        for r in runs:
            exp = "0" if r.prog in ISOLATION_PROGRAMS else self.expect.get(r.prog, "0")
            if r.rc not in ("missing", None) and str(r.rc) != exp:
                bad.append("%s (%s, expected %s)" % (r.label, rc_text(r.rc), exp))
        self.reference_bad = bad
        if bad:
            self.events.append("%s runs with an unexpected exit code: %s" % (self.ref_name(), ", ".join(bad)))

    def ref_name(self):
        return "native" if REFERENCE == "native" else "alone via %s" % MODES[0]

    def worker_facts(self, samples, runs):
        """Which worker served which of our client processes, from stats samples."""
        our = {r.proc.pid: r.label for r in runs if r.proc is not None}
        seen = {}  # client pid -> set of worker pids
        by_worker = {}  # worker pid -> set of client pids
        overlap = set()
        peak_serving = 0
        peak_workers = 0
        have_workers = False
        crashed = []
        for st in samples:
            ws = st.get("workers")
            if "workers_crashed" in st:
                crashed.append(st["workers_crashed"])
            if not isinstance(ws, list):
                continue
            have_workers = True
            peak_workers = max(peak_workers, len(ws))
            serving = [w for w in ws if isinstance(w, dict) and w.get("state") == "serving"]
            peak_serving = max(peak_serving, len(serving))
            now_clients = {}
            for w in serving:
                wp, cp = w.get("pid"), w.get("client_pid")
                if wp is None or cp is None:
                    continue
                seen.setdefault(cp, set()).add(wp)
                by_worker.setdefault(wp, set()).add(cp)
                now_clients.setdefault(wp, set()).add(cp)
            for wp, cps in now_clients.items():
                if len(cps) > 1:
                    overlap.add(wp)
        worker_of = {}
        for cp, wps in seen.items():
            if cp in our:
                worker_of[our[cp]] = ",".join(str(w) for w in sorted(wps))
        reused = {wp: cps for wp, cps in by_worker.items() if len(cps) > 1}
        return {
            "have_workers": have_workers,
            "worker_of": worker_of,
            "clients_seen": len([cp for cp in seen if cp in our]),
            "clients": len(our),
            "peak_serving": peak_serving,
            "peak_workers": peak_workers,
            "reused": reused,
            "overlap": overlap,
            "crashed": (crashed[0], crashed[-1]) if crashed else None,
            "samples": len(samples),
        }

    def phase_modes(self):
        srv = Server(self, "warm", ["--worker-pool", WARM_POOL] if WARM_POOL else [])
        self.warm = srv
        if not srv.start():
            self.events.append("flyt-server did not start: %s" % srv.start_error)
            return
        st = srv.wait_pool_full(20)
        self.server_facts["start"] = self.snapshot(srv, st)
        if REFERENCE != "native":
            self.phase_alone(srv)
        for mode in MODES:
            if self.left() < 20:
                self.events.append("no time left for the %s round" % mode)
                continue
            if not srv.alive():
                self.events.append("server dead before the %s round (exit %s); restarted" %
                                   (mode, rc_text(srv.proc.returncode)))
                srv.stop()
                if not srv.start():
                    self.events.append("restart failed: %s" % srv.start_error)
                    return
            if mode not in srv.urls:
                self.events.append("server does not listen on %s" % mode)
                continue
            srv.wait_pool_full(10)
            log("%s round" % mode)
            sampler = Sampler(srv, os.path.join(self.work, "stats-%s.jsonl" % mode))
            sampler.start()
            runs, facts = self.run_round(mode, srv)
            time.sleep(0.2)
            samples = sampler.finish()
            facts.update(self.worker_facts(samples, runs))
            facts["server_alive"] = srv.alive()
            if not srv.alive():
                self.events.append("server died during the %s round (exit %s)" %
                                   (mode, rc_text(srv.proc.returncode)))
            self.rounds[mode] = facts
            self.results[mode] = {r.label: r for r in runs}
            self.cells[mode] = {r.label: self.compare(mode, r) for r in runs}
            bad = [lb for lb, (ok, _) in self.cells[mode].items() if ok is False]
            log("%s round: %d runs, %d failed%s" % (mode, len(runs), len(bad),
                                                     (": " + " ".join(bad)) if bad else ""))
            self.health_check(srv, mode)
        st = srv.wait_pool_full(10)
        self.server_facts["end"] = self.snapshot(srv, st)

    def health_check(self, srv, mode):
        """The server that served the round, still alive, serves vector_add over mode."""
        ref = next((lb for lb in self.native if lb.split("#")[0] == "vector_add"), None)
        if not srv.alive():
            self.health[mode] = (False, "FAIL: server not running (exit %s)" % rc_text(srv.proc.returncode))
        elif ref is None or self.left() < 10:
            self.health[mode] = (None, "SKIP (%s)" % ("no vector_add in the schedule" if ref is None
                                                      else "no time left"))
        else:
            r = Run(ref, "vector_add", [], self.binary("vector_add"))
            self.spawn(r, mode, srv, "after-" + mode)
            self.reap([r], server=srv)
            self.health[mode] = self.compare("after-" + mode, r)

    def snapshot(self, srv, st):
        facts = {"main_rss_kib": rss_kib(srv.proc.pid) if srv.alive() else None, "stats": st}
        if st:
            idle = [w for w in st.get("workers") or []
                    if isinstance(w, dict) and w.get("state") == "idle"]
            facts["idle_rss"] = [w.get("rss_bytes") for w in idle]
            facts["idle_ps_kib"] = [rss_kib(w["pid"]) for w in idle if isinstance(w.get("pid"), int)]
        return facts

    # ------------------------------------------------------------ timing --
    def first_kernel_once(self, mode, server, kind, i):
        r = Run("first_kernel", "first_kernel", [], self.binary("first_kernel"))
        self.spawn(r, mode, server, "timing/%s-%s-%02d" % (kind, mode, i))
        self.reap([r])
        text = self.read(r.base + ".out").decode(errors="replace")
        m = re.search(r"main_ns=(\d+) done_ns=(\d+)", text)
        # Under the sim no kernel runs (the program's check fails): the times still count.
        if not m or (r.rc != 0 and BACKEND != "sim"):
            return {"ok": False, "rc": r.rc, "wall": r.wall}
        main_ns, done_ns = int(m.group(1)), int(m.group(2))
        return {"ok": True, "total": (done_ns - r.spawn_ns) / 1e6, "load": (main_ns - r.spawn_ns) / 1e6,
                "cuda": (done_ns - main_ns) / 1e6, "wall": r.wall}

    def timing_series(self, kind, mode, server, pool_wait):
        res = []
        for i in range(TIMING_RUNS):
            if self.left() < 8:
                self.timing_notes.append("%s %s: stopped after %d runs (time budget)" % (kind, mode, i))
                break
            if server is not None:
                if not server.alive():
                    self.timing_notes.append("%s %s: server not running" % (kind, mode))
                    break
                if pool_wait:
                    st = server.wait_pool_full(3)
                    if st and "pool_idle" in st and st["pool_idle"] < st.get("pool_size", 1):
                        self.timing_notes.append("%s %s run %d: pool not full again after 3 s "
                                                 "(pool_idle %s of %s)" % (
                                                     kind, mode, i, st["pool_idle"], st.get("pool_size")))
                else:
                    time.sleep(0.1)
            res.append(self.first_kernel_once(mode, server, kind, i))
        self.timing[(kind, mode)] = res

    def phase_timing(self):
        if not os.access(self.binary("first_kernel"), os.X_OK):
            self.timing_notes.append("no isolation/first_kernel.static binary")
            return
        log("timing: native")
        self.timing_series("native", "native", None, False)
        srv = self.warm
        if srv is None or not srv.alive():
            self.timing_notes.append("warm server not running: no Flyt timings")
        else:
            pool = srv.ctl.stats() or {}
            if "pool_size" not in pool:
                self.timing_notes.append("stats have no pool_size: 'warm' runs are against a server "
                                         "without a worker pool")
            for mode in MODES:
                if mode in srv.urls:
                    log("timing: warm %s" % mode)
                    self.timing_series("warm", mode, srv, True)
        if self.warm is not None:
            self.warm.stop()
        try:
            helptext = subprocess.run([self.server_bin, "--help"], capture_output=True, text=True,
                                      timeout=10)
            helptext = helptext.stdout + helptext.stderr
        except (OSError, subprocess.SubprocessError):
            helptext = ""
        if COLD_POOL_ARGS and COLD_POOL_ARGS[0] not in helptext:
            self.timing_notes.append("flyt-server --help does not mention %s: no cold-pool timings"
                                     % COLD_POOL_ARGS[0])
            return
        if self.left() < 20:
            self.timing_notes.append("no time left for cold-pool timings")
            return
        cold = Server(self, "cold", COLD_POOL_ARGS)
        if not cold.start():
            self.timing_notes.append("cold server (%s) did not start: %s" %
                                     (" ".join(COLD_POOL_ARGS), cold.start_error))
            return
        try:
            for mode in MODES:
                if mode in cold.urls:
                    log("timing: cold %s" % mode)
                    self.timing_series("cold", mode, cold, False)
        finally:
            cold.stop()

    # ------------------------------------------------------------ report --
    def verdict(self):
        checks = []
        if REFERENCE == "native" and self.native:
            # As run_programs.sh: a native run that does not end as its program
            # says (FLYT_EXPECT_RC) makes the comparison worthless.
            checks.append((not self.reference_bad, "native runs exit as their programs expect%s" % (
                (": not " + ", ".join(self.reference_bad)) if self.reference_bad else "")))
        for mode in MODES:
            cells = self.cells.get(mode)
            if cells is None:
                checks.append((False, "%s: round not run" % mode))
                continue
            bad = [lb for lb, (ok, _) in cells.items() if ok is False]
            skipped = [lb for lb, (ok, _) in cells.items() if ok is None]
            checks.append((not bad, "%s: %d of %d runs as %s%s%s" % (
                mode, len(cells) - len(bad) - len(skipped), len(cells),
                "natively" if REFERENCE == "native" else "alone",
                ("; differ: " + ", ".join(bad)) if bad else "",
                ("; skipped: " + ", ".join(skipped)) if skipped else "")))
            f = self.rounds.get(mode, {})
            checks.append((f.get("server_alive", False), "%s: server alive after the round" % mode))
            if f.get("overlap"):
                checks.append((False, "%s: one worker served two clients at once (pids %s)" %
                               (mode, ", ".join(map(str, sorted(f["overlap"]))))))
            h = self.health.get(mode)
            if h is not None:
                checks.append((h[0] is not False, "%s: vector_add on the same server afterwards: %s" %
                               (mode, h[1])))
        return checks

    def write(self):
        checks = self.verdict()
        ok = all(c for c, _ in checks) and bool(self.cells)
        L = []
        L.append("## Isolation: many processes at once through one flyt-server, faults included")
        L.append("")
        L.append("**Result: %s.**" % ("PASS" if ok else "FAIL"))
        L.append("")
        for c, text in checks:
            L.append("- %s %s" % ("ok:" if c else "**FAIL:**", text))
        L.append("")
        srv = self.warm
        L.append("- server: `%s` (FLYT_LOG=%s; started %d time%s); clients `flyt run --server URL` "
                 "(FLYT_SHM=off on tcp and unix), FLYT_LOG=%s" % (
                     " ".join(srv.argv) if srv else "not started", SERVER_LOG_LEVEL,
                     srv.starts if srv else 0, "" if srv and srv.starts == 1 else "s", CLIENT_LOG_LEVEL))
        L.append("- schedule per round (%s binaries; run timeout %d s): wave 1 `%s`; once both `steady` "
                 "runs hold a working context: faults `%s`; 0.3 s later wave 2 `%s` and the faults "
                 "again. `steady` runs %s s." % (VARIANT, RUN_TIMEOUT, " ".join(WAVE1), " ".join(FAULTS),
                                                  " ".join(WAVE2), STEADY_S))
        if REFERENCE == "native":
            L.append("- PASS = same exit code and byte-identical stdout as the same program's native run "
                     "(the native round ran the same schedule, also all at once); times are wall seconds")
        else:
            L.append("- PASS = same exit code and byte-identical stdout as the same program run alone "
                     "through the same server over %s (ISO_REFERENCE=%s: a plumbing check, not the "
                     "comparison with native runs); times are wall seconds" % (MODES[0], REFERENCE))
        L.append("")
        # Round overview
        L.append("| round | runs | most at once | seconds | faults started at | steady | workers seen "
                 "serving at once | clients seen in stats | workers_crashed (first..last sample) |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for mode in ["native"] + MODES:
            f = self.rounds.get(mode)
            if not f:
                continue
            if mode == "native" or not f.get("have_workers"):
                wk = "-" if mode == "native" else "n/a (no `workers` in stats)"
                cs = "-" if mode == "native" else "n/a"
            else:
                wk = "%d (of %d workers)" % (f["peak_serving"], f["peak_workers"])
                cs = "%d of %d" % (f["clients_seen"], f["clients"])
            cr = f.get("crashed")
            crs = "%s..%s" % cr if cr else ("-" if mode == "native" else "n/a")
            L.append("| %s | %d | %d | %.1f | %.2f s | %s | %s | %s | %s |" % (
                mode, f.get("count", 0), f.get("peak", 0), f.get("seconds", 0),
                f.get("fault_start") or 0, f.get("steady_ready", "n/a"), wk, cs, crs))
        L.append("")
        for mode in MODES:
            if mode not in self.cells:
                continue
            f = self.rounds.get(mode, {})
            L.append("### %s" % mode)
            L.append("")
            L.append("| run | phase | started at (s) | %s rc | %s | %s rc | %s | worker pid |" % (
                self.ref_name(), self.ref_name(), mode, mode))
            L.append("|---|---|---|---|---|---|---|---|")
            phase_of = {lb: ph for ph, lb, _, _ in self.schedule}
            for lb in [lb for _, lb, _, _ in self.schedule]:
                r = self.results[mode].get(lb)
                n = self.native.get(lb)
                if r is None:
                    continue
                _, text = self.cells[mode][lb]
                L.append("| %s | %s | %.2f | %s | %s | %s | %s | %s |" % (
                    lb, phase_of.get(lb, ""), r.start_rel,
                    rc_text(n.rc) if n else "-", ("%.2f s" % n.wall) if n and n.proc else "-",
                    rc_text(r.rc), text, f.get("worker_of", {}).get(lb, "-")))
            h = self.health.get(mode)
            if h:
                L.append("| vector_add afterwards | health | - | - | - | - | %s | - |" % h[1])
            if f.get("reused"):
                L.append("")
                L.append("Workers that served more than one client process (one after the other): " +
                         "; ".join("%s: clients %s" % (wp, ",".join(map(str, sorted(c))))
                                   for wp, c in sorted(f["reused"].items())))
            L.append("")
        # Server facts
        L.append("### Server memory and workers")
        L.append("")
        L.append("| when | main process RSS (ps) | pool size / idle | idle workers' rss_bytes (stats) | "
                 "idle workers' RSS (ps) | workers_started | workers_crashed |")
        L.append("|---|---|---|---|---|---|---|")
        for when, title in (("start", "after start, pool full"), ("end", "after all rounds + health check")):
            f = self.server_facts.get(when)
            if not f:
                continue
            st = f.get("stats") or {}
            idle = f.get("idle_rss") or []
            idle_ps = [k for k in (f.get("idle_ps_kib") or []) if k is not None]
            L.append("| %s | %s | %s / %s | %s | %s | %s | %s |" % (
                title, mib(f["main_rss_kib"] * 1024) if f.get("main_rss_kib") else "n/a",
                st.get("pool_size", "n/a"), st.get("pool_idle", "n/a"),
                ", ".join(mib(b) for b in idle) if idle else "n/a",
                ", ".join(mib(k * 1024) for k in idle_ps) if idle_ps else "n/a",
                st.get("workers_started", "n/a"), st.get("workers_crashed", "n/a")))
        L.append("")
        # Timing
        L.append("### Process start to first kernel done (first_kernel)")
        L.append("")
        L.append("Spawn = this harness's CLOCK_REALTIME just before it started the process (`flyt run` "
                 "for Flyt, which execs the program); done = the program's CLOCK_REALTIME once its "
                 "first launch + cudaDeviceSynchronize returned. Median [min-max] ms over n runs, "
                 "one at a time. Warm: the default worker pool, each run started once the pool was "
                 "full again; cold: `%s`, every client waits for a fresh worker." % " ".join(COLD_POOL_ARGS))
        L.append("")
        L.append("| transport | native | Flyt, pool warm | Flyt, pool cold |")
        L.append("|---|---|---|---|")

        def fmt(key, field="total"):
            res = self.timing.get(key)
            if res is None:
                return "-"
            vals = [x[field] for x in res if x["ok"]]
            bad = len(res) - len(vals)
            if not vals:
                return "no run succeeded (%d)" % len(res) if res else "-"
            s = "%.1f [%.1f-%.1f] n=%d" % (statistics.median(vals), min(vals), max(vals), len(vals))
            return s + (" (%d failed)" % bad if bad else "")

        for mode in MODES:
            L.append("| %s | %s | %s | %s |" % (mode, fmt(("native", "native")), fmt(("warm", mode)),
                                                fmt(("cold", mode))))
        L.append("")
        L.append("Split, median ms: spawn -> main() (process start, dynamic loading; `flyt run`'s exec "
                 "for Flyt) | main() -> first kernel done (CUDA init, connecting, a worker, code load, "
                 "launch, synchronize):")
        L.append("")
        L.append("| series | spawn -> main | main -> done | spawn -> exit (wall) |")
        L.append("|---|---|---|---|")

        def med(key, field):
            vals = [x[field] for x in self.timing.get(key, []) if x["ok"]]
            return "%.1f" % statistics.median(vals) if vals else "-"

        for key in [("native", "native")] + [(k, m) for k in ("warm", "cold") for m in MODES]:
            if key not in self.timing:
                continue
            walls = [x["wall"] * 1000 for x in self.timing[key] if x["ok"]]
            L.append("| %s | %s | %s | %s |" % (
                key[0] if key[1] == "native" else "%s %s" % key, med(key, "load"), med(key, "cuda"),
                "%.1f" % statistics.median(walls) if walls else "-"))
        if self.timing_notes:
            L.append("")
            for n in self.timing_notes:
                L.append("- %s" % n)
        if self.events:
            L.append("")
            L.append("### Events")
            L.append("")
            for e in self.events:
                L.append("- %s" % e)
        if self.failures:
            L.append("")
            L.append("### Isolation failure details")
            L.append("")
            for title, body in self.failures[:20]:
                L.append("#### %s" % title)
                L.append("")
                L.append(body)
                L.append("")
            if len(self.failures) > 20:
                L.append("(%d more failures; see the logs)" % (len(self.failures) - 20))
        L.append("")
        L.append("Logs, outputs and stats samples: %s (%.0f s of a %d s budget)" % (
            self.work, time.monotonic() - T0, self.budget))
        with open(self.out, "w") as f:
            f.write("\n".join(L) + "\n")
        return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--bins", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--budget", type=int, default=240)
    a = ap.parse_args()
    h = Harness(a)

    def on_signal(signum, _frame):
        raise Deadline("signal %d" % signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    have_flyt = True
    for b in (h.server_bin, h.flyt_bin):
        if not os.access(b, os.X_OK):
            h.events.append("missing %s: no Flyt rounds" % b)
            have_flyt = False
    h.make_schedule()
    ok = False
    try:
        if REFERENCE == "native":
            h.phase_native()
        if have_flyt:
            h.phase_modes()
            h.phase_timing()
    except Deadline as e:
        h.events.append("stopped early: %s" % e)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        kill_everything()
        try:
            ok = h.write()
        except Exception as e:  # the report must come out; say why it is short
            with open(a.out, "a") as f:
                f.write("\n\nreport failed: %r\n" % e)
            raise
    with open(a.out) as f:
        sys.stdout.write(f.read())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
