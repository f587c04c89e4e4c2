#!/usr/bin/env python3
"""Checks what PyTorch sees through a flyt-server with a memory quota and an SM share.

Usage: python3 tests/gpu/ml/tenant_view.py --build BUILD_DIR --out OUT_DIR [--modes "tcp unix shm"]
Also run by run_ml.py (its "Tenant view" section).

Owns: one flyt-server per mode started with --memory-quota 4G --sm-count 64, the child
tenant_view_child.py run through `flyt run`, and the verdict: torch.cuda.mem_get_info,
the device properties and NVML all report the quota and the share, not the GPU; an
allocation past the quota raises torch.OutOfMemoryError; after freeing, the same size
fits; a matmul on the share is right.
Must not touch: any other flyt-server; anything outside OUT_DIR and its temporary folder.
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_runner  # noqa: E402
QUOTA = 4 << 30
SMS = 64  # a multiple of 8: Hopper's green-context granularity


def one_mode(build, work, log_dir, mode, backend, server_cls):
    server = server_cls(build, work, [mode], backend,
                        ["--memory-quota", str(QUOTA), "--sm-count", str(SMS)])
    cmd, env, log_path, err_path = check_runner.child_run(build, server, mode, log_dir, "tenant_view",
                                                          "tenant_view_child.py")
    try:
        with open(err_path, "w") as err:
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=err, timeout=120,
                               start_new_session=True)
        lines = [l for l in p.stdout.decode("utf-8", "replace").splitlines() if l.startswith("{")]
        if p.returncode != 0 or not lines:
            with open(err_path, errors="replace") as f:
                tail = f.read().strip().splitlines()[-3:]
            return {"mode": mode, "verdict": f"FAIL: rc {p.returncode}: {' / '.join(tail)[:300]}"}
        got = json.loads(lines[-1])
    except subprocess.TimeoutExpired:
        return {"mode": mode, "verdict": "FAIL: no answer in 120 s"}
    finally:
        server.stop()
    want = {"mem_total": QUOTA, "props_total": QUOTA, "sm_count": SMS, "over_quota": "OutOfMemoryError",
            "after_free": 7, "matmul_ok": True}
    if got.get("nvml_total") is not None:
        want["nvml_total"] = QUOTA
    wrong = [f"{k} = {got.get(k)!r}, want {v!r}" for k, v in want.items() if got.get(k) != v]
    if not 0 < got.get("mem_free", 0) <= QUOTA:
        wrong.append(f"mem_free = {got.get('mem_free')!r}, want within (0, quota]")
    return dict(got, mode=mode, verdict="PASS" if not wrong else "FAIL: " + "; ".join(wrong))


def run_all(build, work, modes, backend="cuda"):
    """Markdown lines and whether every mode passed; each mode's child stderr and client
    log are left in `work`."""
    rows = check_runner.run_modes(one_mode, "tenant", build, work, modes, backend)
    gib = lambda v: f"{v / (1 << 30):.2f} GiB" if isinstance(v, int) else str(v)
    md = ["## Tenant view (tests/gpu/ml/tenant_view.py)", "",
          f"flyt-server --memory-quota {QUOTA >> 30}G --sm-count {SMS}; what PyTorch and NVML report, "
          "and an allocation past the quota.", "",
          "| mode | mem_get_info total | device properties | NVML total | SMs | past the quota | "
          "after freeing | matmul | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['mode']} | {gib(r.get('mem_total', ''))} | {gib(r.get('props_total', ''))} | "
                  f"{gib(r.get('nvml_total', ''))} | {r.get('sm_count', '')} | "
                  f"{r.get('over_quota', '')}: {r.get('over_quota_message', '')[:120]} | "
                  f"{r.get('after_free', '')} | {r.get('matmul_ok', '')} | {r['verdict']} |")
    md.append("")
    return md, all(r["verdict"] == "PASS" for r in rows)


if __name__ == "__main__":
    sys.exit(check_runner.main(run_all, "tenant_view"))
