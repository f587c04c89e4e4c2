#!/usr/bin/env python3
"""Moving sessions between flyt-servers on a GPU host (docs/architecture.md §7.4).

Two flyt-servers on the one GPU stand in for two GPUs (of one node or of two). Checks
and measures, natively vs through Flyt in the same run:
  1. migrate_loop (tests/e2e/programs): moved A->B->A, a checkpoint, server A restarted
     on its port and restored from the file; its output equals the native run's. Then
     migrate_state the same way (the app's VMM, graphs changed in place, cudaMallocAsync,
     memory pools by handle: default and created, attributes, cudaMallocFromPoolAsync,
     texture objects over linear and pitch-2D memory read through tex1Dfetch/tex2D in
     kernels; with --movable; without it, graphs and textures only).
  2. a PyTorch training loop moved A->B->A mid-run: the same losses as natively; once per
     --torch-modes mode (train_loop.py: plain, expandable segments, cudaMallocAsync, a
     captured CUDA graph replayed).
  3. the pause of a migration with 1, 4, 16 GiB of device memory in use, and the
     checkpoint and restore times and sizes.
Writes a Markdown summary to OUT.

usage: run_migrate.py --build BUILD --programs DIR --out OUT.md [--sizes 1,4,16]
       [--movable] [--torch-modes plain,expandable,mallocasync,cudagraph]
Owns: its two servers and their work folder. Must not touch another flyt-server.
"""
import argparse
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

TOKEN = "migrate-check"
# Every wait (a native run, a step line, a program's end, a move) is bounded by this many
# seconds (--timeout): a run that hangs says where, instead of using up the machine.
LIMIT_S = 600


def progress(what):
    """One line on stderr as each stage starts, so that a hang shows where it is."""
    print("[run_migrate %.0f s] %s" % (time.monotonic() - START, what), file=sys.stderr, flush=True)


START = time.monotonic()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "e2e"))
from run_e2e import control_call  # noqa: E402  (the control-socket client, docs/control_plane.md)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def control(path, request, timeout=None):
    """One request on a flyt-server control socket (the e2e runner's client)."""
    return control_call(path, request, timeout or LIMIT_S + 60)


class Server:
    extra_args = []  # --movable: ["--movable-memory"]
    extra_env = {}  # --server-env K=V

    def __init__(self, build, work, name, port=None):
        self.build, self.work, self.name = build, work, name
        self.port = port or free_port()
        self.ctl = os.path.join(work, name + ".ctl")
        self.proc = None

    def url(self, transport="tcp"):
        if transport == "shm":  # the handshake's socket, named by the server's port
            return "shm://" + os.path.join(os.path.dirname(self.ctl), "shm-%d.sock" % self.port)
        return "tcp://127.0.0.1:%d" % self.port

    def start(self):
        if os.path.exists(self.ctl):
            os.unlink(self.ctl)
        log = open(os.path.join(self.work, self.name + ".log"), "ab")
        env = dict(os.environ, FLYT_LOG="info", **self.extra_env)
        self.proc = subprocess.Popen(
            [os.path.join(self.build, "bin/flyt-server"), "--backend", "cuda", "--listen",
             self.url(), "--listen", self.url("shm"), "--token", TOKEN, "--control",
             "unix://" + self.ctl] + self.extra_args,
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        for _ in range(600):
            if os.path.exists(self.ctl):
                try:
                    control(self.ctl, {"verb": "stats"}, timeout=5)
                    return self
                except OSError:
                    pass
            time.sleep(0.1)
        raise RuntimeError("flyt-server %s did not start" % self.name)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Program:
    """A program through `flyt run` whose stdout lines are read as they come."""

    def __init__(self, build, server, cmd, log, transport="tcp"):
        env = dict(os.environ, FLYT_LOG="info", FLYT_LOG_FILE=log, FLYT_SHM="off")
        self.log = log
        self.proc = subprocess.Popen(
            [os.path.join(build, "bin/flyt"), "run", "--server", server.url(transport), "--token",
             TOKEN, "--"] + cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        self.lines = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stdout:
            with self.cv:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            self.lines.append(None)
            self.cv.notify_all()

    def wait_line(self, pattern, timeout=None):
        progress("waiting for /%s/" % pattern)
        deadline = time.monotonic() + (timeout or LIMIT_S)
        with self.cv:
            i = 0
            while time.monotonic() < deadline:
                while i < len(self.lines):
                    line = self.lines[i]
                    i += 1
                    if line is None:
                        return None
                    if re.search(pattern, line):
                        return line
                self.cv.wait(1)
        return None

    def finish(self, timeout=None):
        progress("waiting for the program to end")
        try:
            rc = self.proc.wait(timeout=timeout or LIMIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = None
        time.sleep(0.2)
        with self.cv:
            return rc, [l for l in self.lines if l is not None]


def native(cmd, timeout=None):
    progress("native: %s" % " ".join(os.path.basename(c) for c in cmd))
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout or LIMIT_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace").splitlines()
        return "timed out", out
    return r.returncode, r.stdout.decode("utf-8", "replace").splitlines()


def native_first_step_s(cmd, timeout=None):
    """Seconds from a native start to its first step line (start-up and code loading)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    took = None
    for raw in proc.stdout:
        if raw.decode("utf-8", "replace").startswith("step 0 ") and took is None:
            took = time.monotonic() - t0
    proc.wait(timeout or LIMIT_S)
    return took


def all_moved(notes):
    """Every move, checkpoint and restore of `notes` took its one session."""
    return all(n.get("moved", n.get("checkpointed", n.get("restored"))) == 1 for n in notes)


def steps_of(lines):
    return [l for l in lines if l.startswith("step ")]


def took_ms(report):
    m = re.search(r" in ([0-9.]+) ms", report)
    return float(m.group(1)) if m else None


def bytes_of(report):
    m = re.search(r"\(([0-9]+) bytes\)", report)
    return int(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--programs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--movable", action="store_true",
                    help="servers with --movable-memory (server/session_movable.cc)")
    ap.add_argument("--server-env", action="append", default=[],
                    help="K=V in the flyt-servers' environment (repeatable)")
    ap.add_argument("--torch-modes", default=None,
                    help="train_loop.py modes (default: all four with --movable, else "
                         "plain,cudagraph: expandable segments and cudaMallocAsync move only "
                         "from a --movable-memory server)")
    ap.add_argument("--timeout", type=int, default=600,
                    help="seconds any one wait may take (native run, step line, move)")
    args = ap.parse_args()
    global LIMIT_S
    LIMIT_S = args.timeout
    if args.torch_modes is None:
        args.torch_modes = ("plain,expandable,mallocasync,cudagraph" if args.movable
                            else "plain,cudagraph")
    Server.extra_env = dict(kv.split("=", 1) for kv in args.server_env)
    if args.movable:
        Server.extra_args = ["--movable-memory"]
    work = tempfile.mkdtemp(prefix="flyt-migrate-")
    loop = os.path.join(args.programs, "migrate_loop")
    out = ["## Moving sessions between two flyt-servers on one GPU%s%s" % (
        " (--movable-memory)" if args.movable else "",
        "".join(" " + kv for kv in args.server_env)), ""]
    fails = 0
    a = Server(args.build, work, "a").start()
    b = Server(args.build, work, "b").start()
    servers = [a, b]

    def move(srv, verb, **extra):
        progress("%s on %s %s" % (verb, srv.name, extra))
        request = {"verb": verb, "wait_ms": LIMIT_S * 1000}
        request.update(extra)
        t0 = time.monotonic()
        answer = control(srv.ctl, request)
        answer["_wall_ms"] = (time.monotonic() - t0) * 1000
        return answer

    try:
        # 1. migrate_loop: A -> B -> A, then checkpoint, restart A, restore.
        rc, nat = native([loop, "30", "0"])
        prog = Program(args.build, a, [loop, "30", "150"], os.path.join(work, "loop.log"))
        notes = []
        prog.wait_line(r"^step 4 ")
        notes.append(move(a, "migrate", to=b.url()))
        prog.wait_line(r"^step 10 ")
        notes.append(move(b, "migrate", to=a.url()))
        prog.wait_line(r"^step 16 ")
        ckpt = os.path.join(work, "ckpt-loop")
        os.makedirs(ckpt)
        notes.append(move(a, "checkpoint", dir=ckpt))
        a.stop()
        a = Server(args.build, work, "a2", port=a.port).start()
        servers.append(a)
        notes.append(move(a, "restore", dir=ckpt))
        frc, flines = prog.finish()
        same = rc == 0 and frc == 0 and steps_of(nat) == steps_of(flines) and len(steps_of(nat)) == 30
        fails += not same or (args.movable and not all_moved(notes))
        out += ["### migrate_loop (allocate, copy, launch, free; 30 steps)", "",
                "native rc %s, Flyt rc %s; step lines equal to native: **%s**" % (
                    rc, frc, "yes" if same else "NO"), ""]
        for n in notes:
            out.append("- `%s`" % json.dumps({k: v for k, v in n.items() if k != "_wall_ms"}))
        out.append("")
        # 1a. migrate_loop over shm:// through a pinned buffer the server maps: moved to
        # B's shm:// address (the buffer shared with B again), then to A over tcp:// (the
        # program's own memory there).
        rc, nat = native([loop, "30", "0", "0", "pinned"])
        log = os.path.join(work, "loop-shm.log")
        prog = Program(args.build, a, [loop, "30", "150", "0", "pinned"], log, transport="shm")
        notes = []
        prog.wait_line(r"^step 4 ")
        notes.append(move(a, "migrate", to=b.url("shm")))
        prog.wait_line(r"^step 12 ")
        notes.append(move(b, "migrate", to=a.url()))
        frc, flines = prog.finish()
        client_log = open(log, errors="replace").read() if os.path.exists(log) else ""
        shared_again = client_log.count("pinned buffers shared with the new server again")
        own_memory = client_log.count("are this process's own memory after the move")
        same = rc == 0 and frc == 0 and steps_of(nat) == steps_of(flines) and len(steps_of(nat)) == 30
        ok = same and all_moved(notes) and shared_again == 1 and own_memory == 1
        fails += not ok
        out += ["### migrate_loop over shm:// through a pinned buffer (30 steps)", "",
                "native rc %s, Flyt rc %s; step lines equal to native: **%s**; every move took "
                "it: **%s**; the buffer shared with the shm:// target again: %d, the program's "
                "own memory after the tcp:// move: %d" % (
                    rc, frc, "yes" if same else "NO", "yes" if all_moved(notes) else "NO",
                    shared_again, own_memory), ""]
        for n in notes:
            out.append("- `%s`" % json.dumps({k: v for k, v in n.items() if k != "_wall_ms"}))
        if not ok:
            out += ["", "```"] + nat[-5:] + ["---"] + flines[-15:] + ["```"]
        out.append("")
        # 1b'. a process using the GPUs of two servers (FLYT_SERVER "a,b"; its loop on b's
        # GPU, a mirror on a's copied server to server every step): b's part moved to a third
        # server, then a's to a fourth. On a one-GPU host there is no native run of it (it
        # needs two devices): an undisturbed run through Flyt is the reference.
        class Pair:
            def __init__(self, first, second):
                self.first, self.second = first, second

            def url(self, transport="tcp"):
                return self.first.url(transport) + "," + self.second.url(transport)
        c = Server(args.build, work, "c").start()
        d = Server(args.build, work, "d").start()
        servers += [c, d]
        two = [loop, "24", "0", "0", "two-servers"]
        base = Program(args.build, Pair(a, b), two, os.path.join(work, "two-base.log"))
        brc, blines = base.finish()
        log = os.path.join(work, "two.log")
        prog = Program(args.build, Pair(a, b), [loop, "24", "150", "0", "two-servers"], log)
        notes = []
        prog.wait_line(r"^step 4 ")
        notes.append(move(b, "migrate", to=c.url()))
        prog.wait_line(r"^step 10 ")
        notes.append(move(a, "migrate", to=d.url()))
        frc, flines = prog.finish()
        client_log = open(log, errors="replace").read() if os.path.exists(log) else ""
        same = (brc == 0 and frc == 0 and steps_of(blines) == steps_of(flines) and
                len(steps_of(blines)) == 24)
        ok = same and all_moved(notes) and client_log.count("now lives at flyt-server") == 2
        fails += not ok
        out += ["### migrate_loop on the GPUs of two servers (24 steps)", "",
                "undisturbed rc %s, moved rc %s; step lines equal: **%s**; every move took it: "
                "**%s**" % (brc, frc, "yes" if same else "NO",
                            "yes" if all_moved(notes) else "NO"), ""]
        for n in notes:
            out.append("- `%s`" % json.dumps({k: v for k, v in n.items() if k != "_wall_ms"}))
        if not ok:
            out += ["", "```"] + blines[-5:] + ["---"] + flines[-15:] + ["```"]
        out.append("")
        for srv in (c, d):
            srv.stop()
        # 1b. migrate_state: the app's VMM, graphs, stream-ordered allocations, pools.
        state = [os.path.join(args.programs, "migrate_state"), "16", "0"]
        if not args.movable:
            state += ["graphs", "textures"]
        rc, nat = native(state)
        prog = Program(args.build, a, state[:2] + ["200"] + state[3:],
                       os.path.join(work, "state.log"))
        notes = []
        prog.wait_line(r"^step 2 ")
        notes.append(move(a, "migrate", to=b.url()))
        prog.wait_line(r"^step 5 ")
        notes.append(move(b, "migrate", to=a.url()))
        prog.wait_line(r"^step 8 ")
        ckpt = os.path.join(work, "ckpt-state")
        os.makedirs(ckpt)
        notes.append(move(a, "checkpoint", dir=ckpt))
        a.stop()
        a = Server(args.build, work, "a3", port=a.port).start()
        servers.append(a)
        notes.append(move(a, "restore", dir=ckpt))
        frc, flines = prog.finish()
        same = rc == 0 and frc == 0 and steps_of(nat) == steps_of(flines) and len(steps_of(nat)) == 16
        fails += not same or (args.movable and not all_moved(notes))
        out += ["### migrate_state (%s; 16 steps)" % (
                    "VMM, graphs, cudaMallocAsync, memory pools, textures" if args.movable
                    else "graphs, textures"),
                "",
                "native rc %s, Flyt rc %s; step lines equal to native: **%s**; every move "
                "took it: **%s**" % (rc, frc, "yes" if same else "NO",
                                     "yes" if all_moved(notes) else "NO"), ""]
        for n in notes:
            out.append("- `%s`" % json.dumps({k: v for k, v in n.items() if k != "_wall_ms"}))
        if not same:
            out += ["", "```"] + nat[-5:] + ["---"] + flines[-15:] + ["```"]
        out.append("")
        # 2. PyTorch training loop moved mid-run, once per mode.
        for mode in ([] if args.skip_torch else [m for m in args.torch_modes.split(",") if m]):
            script = [sys.executable, os.path.join(HERE, "train_loop.py")]
            train = script + ["40", "100", mode]
            rc, nat = native(script + ["40", "0", mode])
            native_first = native_first_step_s(script + ["40", "0", mode])
            t0 = time.monotonic()
            prog = Program(args.build, a, train, os.path.join(work, "train-%s.log" % mode))
            notes = []
            prog.wait_line(r"^step 0 ")
            flyt_first = time.monotonic() - t0
            prog.wait_line(r"^step 10 ")
            notes.append(move(a, "migrate", to=b.url()))
            prog.wait_line(r"^step 25 ")
            notes.append(move(b, "migrate", to=a.url()))
            frc, flines = prog.finish()
            same = rc == 0 and frc == 0 and steps_of(nat) == steps_of(flines)
            # PyTorch's cudaMallocAsync backend holds the default pool's handle (and sets
            # its release threshold): with --movable-memory the session serves that pool
            # and it moves (server/session_pools.cc).
            # Without --movable-memory a move may find the addresses taken: only reported.
            want_moves = True
            fails += not same or (args.movable and all_moved(notes) != want_moves)
            out += ["### PyTorch training loop (MLP, SGD, deterministic; 40 steps; %s)" % mode, "",
                    "native rc %s, Flyt rc %s; losses equal to native, step by step: **%s**; "
                    "moved: **%s** (expected: %s)" % (
                        rc, frc, "yes" if same else "NO", "yes" if all_moved(notes) else "no",
                        "yes" if want_moves else "no, refused"), ""]
            out.append("start to first step: native %.2f s, Flyt %.2f s%s" % (
                native_first or -1, flyt_first,
                " (movable memory: eager module loading)" if args.movable else ""))
            out.append("")
            for n in notes:
                out.append("- `%s`" % json.dumps({k: v for k, v in n.items() if k != "_wall_ms"}))
            if not same:
                out += ["", "```"] + steps_of(nat)[-5:] + ["---"] + flines[-15:] + ["```"]
            out.append("")
        # 3. Pause against device memory; checkpoint and restore.
        out += ["### Pause against device memory in use", "",
                "| memory | migrate pause (source: drain, snapshot, target restore) | bytes moved | "
                "checkpoint time | checkpoint file | restore time | program ok |",
                "|---|---|---|---|---|---|---|"]
        for gib in [int(x) for x in args.sizes.split(",") if x]:
            prog = Program(args.build, a, [loop, "8", "300", str(gib * 1024)],
                           os.path.join(work, "size%d.log" % gib))
            prog.wait_line(r"^step 1 ")
            m = move(a, "migrate", to=b.url())
            report = m.get("sessions", [{}])[0].get("message", "") if m.get("sessions") else ""
            ck_ms = ck_size = rs_ms = "-"
            if gib <= 16:
                prog.wait_line(r"^step 3 ")
                d = os.path.join(work, "ckpt-%d" % gib)
                os.makedirs(d)
                c = move(b, "checkpoint", dir=d, leave_running=True)
                cr = c.get("sessions", [{}])[0].get("message", "") if c.get("sessions") else ""
                ck_ms = "%.0f ms" % (took_ms(cr) or -1)
                files = os.listdir(d)
                ck_size = "%.2f GiB" % (os.path.getsize(os.path.join(d, files[0])) / 2**30) if files else "-"
                r = move(a, "restore", dir=d)
                rs_ms = "%.0f ms (%s)" % (r["_wall_ms"], "ok" if r.get("restored") == 1 else json.dumps(r))
            frc, flines = prog.finish()
            ok = frc == 0 and flines and flines[-1] == "migrate_loop: PASS"
            fails += not ok
            out.append("| %d GiB | %s | %s | %s | %s | %s | %s |" % (
                gib, "%.0f ms" % took_ms(report) if took_ms(report) else json.dumps(m),
                bytes_of(report), ck_ms, ck_size, rs_ms, "yes" if ok else "NO (rc %s)" % frc))
            # The restored copy waits for a client that is elsewhere: start afresh.
            for s in (a, b):
                s.stop()
            a = Server(args.build, work, "a%d" % gib, port=a.port).start()
            b = Server(args.build, work, "b%d" % gib, port=b.port).start()
            servers += [a, b]
        out.append("")
    finally:
        for s in servers:
            s.stop()
    out.append("Failures: %d" % fails)
    with open(args.out, "w") as f:
        f.write("\n".join(out) + "\n")
    logs = os.path.join(os.path.dirname(args.out), "migrate-logs")
    shutil.copytree(work, logs, ignore=shutil.ignore_patterns("*.flyt", "*.ctl", "*.sock"),
                    dirs_exist_ok=True)
    print("\n".join(out))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
