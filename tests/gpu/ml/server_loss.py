#!/usr/bin/env python3
"""Kills the flyt-server under a PyTorch training loop and checks the app is told, not hung.

Usage: python3 tests/gpu/ml/server_loss.py --build BUILD_DIR --out OUT_DIR [--modes "tcp unix shm"]
Also run by run_ml.py (its "Server loss" section).

Owns: one flyt-server per mode (its own, so no other run sees the kill), the child
server_loss_child.py run through `flyt run`, the SIGKILL of that server after the
child's 20th step, and the verdict: the child must get a CUDA error (an exception in
Python), get one again at once for its next call, and end within 30 s: no hang, no
crash. It ends either with its own status (3) or with PyTorch's own abort when a
destructor's CUDA call fails (std::terminate on c10::AcceleratorError, as for any
failed device); any other signal fails.
Must not touch: any other flyt-server; anything outside OUT_DIR and its temporary folder.
"""

import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_runner  # noqa: E402
STEPS_BEFORE_KILL = 20
EXIT_WITHIN_S = 30


def one_mode(build, work, log_dir, mode, backend, server_cls):
    server = server_cls(build, work, [mode], backend)
    cmd, env, log_path, err_path = check_runner.child_run(build, server, mode, log_dir, "server_loss",
                                                          "server_loss_child.py")
    lines = []  # (seconds since start, text)
    t0 = time.monotonic()
    with open(err_path, "w") as err:
        child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
    reached = threading.Event()

    def reader():
        for raw in child.stdout:
            text = raw.decode("utf-8", "replace").rstrip("\n")
            lines.append((time.monotonic() - t0, text))
            if text == f"step {STEPS_BEFORE_KILL}":
                reached.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    row = {"mode": mode}
    try:
        deadline = time.monotonic() + 120
        while not reached.wait(0.1):
            if child.poll() is not None or time.monotonic() > deadline:
                break
        if not reached.is_set():
            row["verdict"] = f"FAIL: the child did not reach step {STEPS_BEFORE_KILL} (rc {child.poll()})"
            return row
        t_kill = time.monotonic() - t0
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        try:
            rc = child.wait(EXIT_WITHIN_S + 30)
        except subprocess.TimeoutExpired:
            rc = None
        t_exit = time.monotonic() - t0
        t.join(5)
        steps = [x for _, x in lines if x.startswith("step ")]
        caught = next(((ts, x) for ts, x in lines if x.startswith("caught: ")), None)
        second = next((x for _, x in lines if x.startswith("second: ")), "")
        row.update(steps_before=STEPS_BEFORE_KILL, steps_total=len(steps),
                   caught=caught[1][len("caught: "):] if caught else "",
                   caught_after_s=round(caught[0] - t_kill, 3) if caught else None,
                   second=second[len("second: "):], rc=rc,
                   exit_after_s=round(t_exit - t_kill, 3))
        try:
            with open(log_path, errors="replace") as f:
                row["client_log"] = f.read().strip().splitlines()[:3]
        except OSError:
            row["client_log"] = []
        with open(err_path, errors="replace") as f:
            err_text = f.read()
        # PyTorch throws from a destructor when a CUDA call fails while it frees a pinned
        # tensor that a stream used (createEvent): std::terminate, SIGABRT. It does that for
        # any failing device; the trace names c10, not Flyt.
        torch_abort = rc == -signal.SIGABRT and "terminate called after throwing an instance of 'c10::" in err_text
        row["ending"] = ("its own exit" if rc == 3 else "PyTorch's abort in a destructor" if torch_abort
                         else f"status {rc}")
        problems = []
        if rc is None:
            problems.append(f"still running {EXIT_WITHIN_S + 30} s after the kill (hang)")
        elif rc != 3 and not torch_abort:
            problems.append(f"exit status {rc}: a crash, not the script's own exit (3) nor PyTorch's abort")
        elif t_exit - t_kill > EXIT_WITHIN_S:
            problems.append(f"exited {t_exit - t_kill:.1f} s after the kill (limit {EXIT_WITHIN_S} s)")
        if not caught:
            problems.append("no CUDA error reached Python")
        if not second or second.startswith("no error"):
            problems.append("the call after the error did not fail")
        row["verdict"] = "PASS" if not problems else "FAIL: " + "; ".join(problems)
        return row
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        server.stop()


def run_all(build, work, modes, backend="cuda"):
    """Markdown lines and whether every mode passed; the child's stderr and client log of
    each mode are left in `work`."""
    rows = check_runner.run_modes(one_mode, "loss", build, work, modes, backend)
    md = ["## Server loss (tests/gpu/ml/server_loss.py)", "",
          f"A training loop through Flyt; its flyt-server is killed (SIGKILL) after step {STEPS_BEFORE_KILL}. "
          f"Pass: Python gets a CUDA error, the next call fails too, and the process ends within "
          f"{EXIT_WITHIN_S} s, by its own exit (3) or PyTorch's abort in a destructor (SIGABRT after "
          f"'terminate called after throwing an instance of c10::...'); no other signal, no hang.", "",
          "| mode | steps done | error in Python | after (s) | next call | ended (s after kill) | how | verdict |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['mode']} | {r.get('steps_total', '')} | {r.get('caught', '')[:160]} | "
                  f"{r.get('caught_after_s', '')} | {r.get('second', '')[:120]} | {r.get('exit_after_s', '')} | "
                  f"{r.get('ending', '')} | {r['verdict']} |")
    logs = [(r["mode"], r.get("client_log")) for r in rows if r.get("client_log")]
    if logs:
        md += ["", "First lines of each client log:", "", "```"]
        for m, lines in logs:
            md += [f"[{m}] {x}" for x in lines]
        md.append("```")
    md.append("")
    return md, all(r["verdict"] == "PASS" for r in rows)


if __name__ == "__main__":
    sys.exit(check_runner.main(run_all, "server_loss"))
