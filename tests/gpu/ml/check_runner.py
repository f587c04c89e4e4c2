"""Shared driver of the checks that need a flyt-server of their own (server_loss.py,
tenant_view.py): one server per mode, one row per mode, a command line for each.

Owns: the `flyt run` command line and logs of a check's child, calling its one_mode() per
transport with its own server folder, turning a
setup exception into a failed row, and the OUT_DIR/NAME.md file of a standalone run.
Must not touch: anything a check does inside one_mode().
"""

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def child_run(build, server, mode, log_dir, name, script):
    """(command, environment, client log path, stderr path) for running HERE/script through
    `flyt run` against `server` over `mode`, its logs named after `name` in log_dir."""
    log_path = os.path.join(log_dir, f"{name}.{mode}.client.log")
    err_path = os.path.join(log_dir, f"{name}.{mode}.stderr")
    env = dict(os.environ, FLYT_LOG="warn", FLYT_LOG_FILE=log_path,
               FLYT_SHM="on" if mode == "shm" else "off")
    cmd = [os.path.join(build, "bin", "flyt"), "run", "--server", server.addr[mode], "--",
           sys.executable, os.path.join(HERE, script)]
    return cmd, env, log_path, err_path


def run_modes(one_mode, prefix, build, work, modes, backend):
    """Rows of one_mode(build, server_work, log_dir, mode, backend, Server) per mode."""
    sys.path.insert(0, HERE)
    from run_ml import Server

    rows = []
    for m in modes:
        mode_work = tempfile.mkdtemp(prefix=f"{prefix}-{m}.", dir=work)
        try:
            rows.append(one_mode(os.path.abspath(build), mode_work, work, m, backend, Server))
        except Exception as e:  # a setup problem is a failure of this check, not of the suite
            rows.append({"mode": m, "verdict": f"FAIL: {type(e).__name__}: {e}"})
    return rows


def main(run_all, name):
    """Command line of a check: --build, --out, --modes, --backend; writes OUT/NAME.md."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default="tcp unix shm")
    ap.add_argument("--backend", default="cuda")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    md, ok = run_all(a.build, tempfile.mkdtemp(prefix=f"flyt-{name}."), a.modes.split(), a.backend)
    with open(os.path.join(a.out, f"{name}.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if ok else 1
