#!/usr/bin/env python3
"""Runs the ML cases and benchmarks natively and through Flyt on a GPU host.

Usage: python3 tests/gpu/ml/run_ml.py --build BUILD_DIR --out OUT_DIR
           [--modes "tcp unix shm"] [--cases "a b" | none] [--bench "resnet18_train ..."]
           [--jobs 4] [--timeout 240] [--budget 500] [--bench-repeat 2] [--backend cuda]
           [--server-loss 1] [--tenant-view 1] [--bench-emulated "emu25 emu10"]

Owns: one flyt-server (--backend cuda) listening on TCP loopback, a Unix
socket and shared memory; each case of cases.py run once natively and once per
mode through `flyt run`, results compared (compare()); then server_loss.py
(a server killed under a training loop, per mode) and tenant_view.py (PyTorch
under a memory quota and SM share, per mode); then each benchmark of
bench_ml.py, natively and per mode, one at a time (nothing else on the GPU); the
benchmarks also run over TCP through emulated links (EMULATED_LINKS: a flyt-server of
their own with --emulate, the client with FLYT_EMULATE).
Writes OUT_DIR/ml.md (the report) and OUT_DIR/ml-logs.tgz (every run's JSON,
stderr and client log, and the server log). Exit status 0 when every case
that ran natively ran the same through Flyt.
Must not touch: the GPU's settings; anything outside OUT_DIR and its own
temporary folder.
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Benchmark modes over TCP through the network emulator (docs/emulator.md): both sides
# delay what they send by half the round trip plus the bytes' time on the link.
EMULATED_LINKS = {
    "emu25": ("25 Gbit/s, 20 us one way", "rtt_us=40,bandwidth_gbit=25"),
    "emu10": ("10 Gbit/s, 100 us one way", "rtt_us=200,bandwidth_gbit=10"),
    # RDMA NICs (the emulator's rdma link: latency overlaps, no kernel cost per message),
    # carried over ucx:// on this host (UCX picks shared memory), so the real link adds
    # as little as it can; bulk beyond what that link moves (~10 GB/s) is not projected.
    "rdma100": ("RDMA 100 Gbit/s, 1.5 us one way", "link=rdma,rtt_us=3,bandwidth_gbit=100"),
    "rdma200": ("RDMA 200 Gbit/s, 1.5 us one way", "link=rdma,rtt_us=3,bandwidth_gbit=200"),
    "rdma400": ("RDMA 400 Gbit/s, 1.5 us one way", "link=rdma,rtt_us=3,bandwidth_gbit=400"),
}
# The real transport under an emulated link (default tcp).
EMULATED_BASE = {"rdma100": "ucx", "rdma200": "ucx", "rdma400": "ucx"}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    def __init__(self, build, work, modes, backend="cuda", extra_args=()):
        self.work = work
        self.port = free_port()
        self.addr = {"tcp": f"tcp://127.0.0.1:{self.port}", "unix": f"unix://{work}/flyt.sock",
                     "shm": f"shm://{work}/flyt.shm", "ucx": f"ucx://127.0.0.1:{free_port()}"}
        listen = []
        for m in ["tcp", "unix"] + [x for x in ("shm", "ucx") if x in modes]:
            listen += ["--listen", self.addr[m]]
        self.log_path = os.path.join(work, "server.log")
        env = dict(os.environ, FLYT_LOG=os.environ.get("SERVER_LOG_LEVEL", "info"))
        self.proc = subprocess.Popen([os.path.join(build, "bin", "flyt-server"), "--backend", backend] + listen
                                     + list(extra_args),
                                     stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.2)
        raise RuntimeError("flyt-server did not start; log:\n" + open(self.log_path).read()[-3000:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def run(args, build, server, mode, script, name, outdir, timeout, extra_env=None, suffix=""):
    """Runs `python3 script name json` natively (mode None) or through Flyt."""
    tag = f"{name}.{mode or 'native'}{suffix}"
    out_json = os.path.join(outdir, tag + ".json")
    err_path = os.path.join(outdir, tag + ".stderr")
    env = dict(os.environ, **(extra_env or {}))
    # Each run compiles its own Triton/Inductor code (nothing carried over between modes).
    env["TRITON_CACHE_DIR"] = os.path.join(outdir, "cache", tag, "triton")
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(outdir, "cache", tag, "inductor")
    env["CUPY_CACHE_DIR"] = os.path.join(outdir, "cache", tag, "cupy")
    cmd = [sys.executable, os.path.join(HERE, script), name, out_json]
    if mode is not None:
        env["FLYT_LOG"] = os.environ.get("CLIENT_LOG_LEVEL", "warn")
        env["FLYT_LOG_FILE"] = os.path.join(outdir, tag + ".client.log")
        env["FLYT_SHM"] = "on" if mode == "shm" else "off"
        if mode in EMULATED_LINKS:
            env["FLYT_EMULATE"] = EMULATED_LINKS[mode][1]
        cmd = [os.path.join(build, "bin", "flyt"), "run", "--server", server.addr[mode], "--"] + cmd
    t0 = time.time()
    try:
        rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(err_path, "w"),
                            timeout=timeout, start_new_session=True).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    doc = {"status": "error", "error": f"no result (rc {rc})", "results": {}}
    if os.path.exists(out_json):
        with open(out_json) as f:
            doc = json.load(f)
    doc["rc"] = rc
    doc["wall_s"] = round(time.time() - t0, 1)
    doc["stderr_tail"] = tail(err_path, 25)
    doc["client_log_tail"] = tail(os.path.join(outdir, tag + ".client.log"), 25)
    return doc


def tail(path, n):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def compare(native, flyt, path=""):
    """Differences between two result trees (empty when they agree)."""
    diffs = []
    if isinstance(native, dict) and "approx" in native:
        a, b = native["approx"], flyt.get("approx") if isinstance(flyt, dict) else None
        if b is None or len(a) != len(b):
            return [f"{path}: {b!r} is not {len(a)} values"]
        for i, (x, y) in enumerate(zip(a, b)):
            if abs(x - y) > native["atol"] + native["rtol"] * abs(x):
                diffs.append(f"{path}[{i}]: native {x:.6g} flyt {y:.6g} (rtol {native['rtol']}, atol {native['atol']})")
        return diffs[:5]
    if isinstance(native, dict):
        if not isinstance(flyt, dict):
            return [f"{path}: {flyt!r} is not a mapping"]
        for k in sorted(set(native) | set(flyt)):
            if k.startswith("info_"):
                continue  # reported, never compared (cases.py)
            if k not in flyt or k not in native:
                diffs.append(f"{path}.{k}: only in {'native' if k in native else 'flyt'}")
            else:
                diffs += compare(native[k], flyt[k], f"{path}.{k}" if path else k)
        return diffs
    if native != flyt:
        return [f"{path}: native {str(native)[:200]} flyt {str(flyt)[:200]}"]
    return []


def probe_env():
    code = r"""
import importlib, json, platform, sys
info = {"python": platform.python_version()}
for mod in ("torch", "triton", "cupy", "pynvml", "torchvision"):
    try:
        m = importlib.import_module(mod)
        info[mod] = getattr(m, "__version__", "present")
    except Exception as e:
        info[mod] = "missing (%s)" % type(e).__name__
try:
    import torch
    info["torch.version.cuda"] = torch.version.cuda
    info["cudnn"] = torch.backends.cudnn.version()
    info["gpu"] = torch.cuda.get_device_name(0)
except Exception as e:
    info["torch_cuda"] = repr(e)
print(json.dumps(info))
"""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
        info = json.loads(out.strip().splitlines()[-1])
    except Exception as e:  # noqa: BLE001 - reported, never fatal
        info = {"probe": repr(e)}
    info["gcc"] = shutil.which("gcc") or "missing"
    return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default="tcp unix shm")
    ap.add_argument("--cases", default="")
    ap.add_argument("--bench", default="resnet18_train gpt_train gpt_decode hf_generate hf_train")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--backend", default="cuda", help="flyt-server's backend (sim: plumbing only)")
    ap.add_argument("--bench-repeat", type=int, default=2, help="runs per benchmark and mode")
    ap.add_argument("--count-mode", default="unix", help="mode of the call-counting run ('' for none)")
    ap.add_argument("--server-loss", type=int, default=1,
                    help="1: kill a server under a training loop per mode (server_loss.py)")
    ap.add_argument("--tenant-view", type=int, default=1,
                    help="1: PyTorch under a memory quota and SM share, per mode (tenant_view.py)")
    ap.add_argument("--bench-emulated", default="emu25 emu10",
                    help="benchmark modes over emulated links (EMULATED_LINKS); '' for none")
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--budget", type=int, default=500, help="seconds for cases and benchmarks together")
    a = ap.parse_args()
    start = time.time()
    sys.path.insert(0, HERE)
    import cases as case_module

    build = os.path.abspath(a.build)
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="flyt-ml.")
    runs = os.path.join(work, "runs")
    os.makedirs(runs)
    modes = a.modes.split()
    # "none": benchmarks only (an empty --cases runs every case).
    names = [] if a.cases.strip() == "none" else (a.cases.split() or sorted(case_module.CASES))
    env_info = probe_env()
    server = Server(build, work, modes, a.backend)
    servers = {}  # emulated-link modes: a server each, with --emulate
    for m in a.bench_emulated.split() if a.bench.split() else []:
        if m not in EMULATED_LINKS:
            sys.exit(f"unknown emulated mode {m}; known: {' '.join(EMULATED_LINKS)}")
        os.makedirs(os.path.join(work, m))
        base = EMULATED_BASE.get(m, "tcp")
        servers[m] = Server(build, os.path.join(work, m), [base], a.backend,
                            extra_args=["--emulate", EMULATED_LINKS[m][1]])
        servers[m].addr[m] = servers[m].addr[base]
    bench_modes = modes + list(servers)
    report = ["# Flyt ML suite (tests/gpu/ml)", "", "| | |", "|---|---|",
              f"| date (UTC) | {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} |"]
    report += [f"| {k} | {v} |" for k, v in env_info.items()]
    commit = ""
    for p in (os.path.join(build, "COMMIT"),):
        if os.path.exists(p):
            commit = open(p).read().strip()
    report += [f"| Flyt commit | {commit or 'unknown'} |", ""]
    ok_all = True
    results = {}
    try:
        deadline = start + a.budget * 0.6
        tasks = [(n, m) for n in names for m in [None] + modes]
        with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
            futs = {}
            for n, m in tasks:
                futs[pool.submit(lambda n=n, m=m: run(a, build, server, m, "run_case.py", n, runs,
                                                      max(10, min(a.timeout, int(deadline - time.time()))))
                                 if time.time() < deadline else {"status": "skip", "error": "out of time",
                                                                 "results": {}})] = (n, m)
            for f in concurrent.futures.as_completed(futs):
                results[futs[f]] = f.result()
        report += ["## Cases (native vs Flyt)", "", "| case | native | " + " | ".join(modes) + " |",
                   "|---|---|" + "---|" * len(modes)]
        details = []
        for n in names:
            nat = results[(n, None)]
            row = [f"{nat['status']} ({nat.get('seconds', '?')} s)"]
            for m in modes:
                r = results[(n, m)]
                if nat["status"] != "ok":
                    cell = f"{r['status']} (native {nat['status']})"
                elif r["status"] != "ok":
                    cell = f"**{r['status']}**"
                    ok_all = False
                    details.append((n, m, r["error"][-1500:], r))
                else:
                    d = compare(nat["results"], r["results"])
                    info = {k: v for k, v in r["results"].items() if k.startswith("info_")}
                    if d and info:
                        d.append(f"flyt info: {json.dumps(info)[:600]}")
                        d.append("native info: " + json.dumps(
                            {k: v for k, v in nat["results"].items() if k.startswith("info_")})[:600])
                    if d:
                        cell = f"**FAIL** ({len(d)} diffs)"
                        ok_all = False
                        details.append((n, m, "\n".join(d), r))
                    else:
                        cell = f"PASS ({r.get('seconds', '?')} s)"
                row.append(cell)
            if nat["status"] != "ok":
                details.append((n, "native", nat["error"][-1500:], nat))
            report.append(f"| {n} | " + " | ".join(row) + " |")
        report.append("")
        if a.server_loss and start + a.budget - time.time() > 60:
            import server_loss

            loss_md, loss_ok = server_loss.run_all(build, runs, modes, a.backend)
            report += loss_md
            ok_all = ok_all and loss_ok
        if a.tenant_view and start + a.budget - time.time() > 60:
            import tenant_view

            view_md, view_ok = tenant_view.run_all(build, runs, modes, a.backend)
            report += view_md
            ok_all = ok_all and view_ok
        # Benchmarks: one run at a time.
        bench_rows = []
        for w in a.bench.split():
            key = "ms_per_token" if w == "gpt_decode" else "ms_per_step"
            tries = {m: [] for m in [None] + bench_modes}
            # Repeats interleave the modes, so that drift on the host hits all alike;
            # the run with the median time stands for its mode.
            for rep in range(a.bench_repeat):
                for m in [None] + bench_modes:
                    left = start + a.budget - time.time()
                    if left < 20:
                        continue
                    tries[m].append(run(a, build, servers.get(m, server), m, "bench_ml.py", w, runs,
                                        int(min(a.timeout, left)), suffix=f".r{rep}"))
            per = {}
            for m, docs in tries.items():
                timed = sorted((d for d in docs if key in d), key=lambda d: d[key])
                if timed:
                    per[m] = dict(timed[(len(timed) - 1) // 2], all_times=[d[key] for d in docs if key in d])
                else:
                    per[m] = docs[-1] if docs else {"status": "skip", "error": "out of time"}
            # Which calls a step makes: a separate run that counts them by name.
            if a.count_mode in modes and start + a.budget - time.time() > 20:
                per["counts"] = run(a, build, server, a.count_mode, "bench_ml.py", w, runs,
                                    int(min(a.timeout, start + a.budget - time.time())),
                                    {"FLYT_CALL_COUNTS": "1"}, ".counts")
            bench_rows.append((w, per))
        report += ["## Benchmarks", "",
                   "Ratio = native time / Flyt time (throughput relative to native; 1.0 = native speed).",
                   f"Each cell: the median of {a.bench_repeat} runs (all runs in brackets), modes interleaved.",
                   "Calls per step: the client's driver calls during the timed steps (sync: waited for a reply).",
                   "Emulated links (TCP through the emulator, both sides): " +
                   "; ".join(f"{m} = {EMULATED_LINKS[m][0]}" for m in servers) + ".",
                   "", "| workload | native | " + " | ".join(bench_modes) + " |",
                   "|---|---|" + "---|" * len(bench_modes)]
        for w, per in bench_rows:
            nat = per[None]
            key = "ms_per_token" if w == "gpt_decode" else "ms_per_step"
            unit = "ms/token" if w == "gpt_decode" else "ms/step"
            if key not in nat:
                report.append(f"| {w} | {nat.get('status')}: {nat.get('error', '')[-200:]!r} |")
                continue
            spread = lambda r: (" [" + ", ".join(f"{t:.3f}" for t in r["all_times"]) + "]"
                                if len(r.get("all_times", [])) > 1 else "")
            cells = [f"{nat[key]:.3f} {unit}{spread(nat)}"]
            for m in bench_modes:
                r = per[m]
                if key not in r:
                    cells.append(f"**{r.get('status')}**")
                    details.append((w, m, r.get("error", "")[-1500:], r))
                    continue
                calls = ""
                if "sync_calls_per_step" in r:
                    calls = (f"; {r['sync_calls_per_step'] + r['async_calls_per_step']:.0f} calls/step, "
                             f"{r['sync_calls_per_step']:.1f} sync, {r['sends_per_step']:.0f} sends")
                cells.append(f"{r[key]:.3f}{spread(r)} ({nat[key] / r[key]:.3f}×{calls})")
            report.append(f"| {w} | " + " | ".join(cells) + " |")
        report.append("")
        for w, per in bench_rows:
            by_name = per.get("counts", {}).get("calls_per_step_by_name")
            if not by_name:
                continue
            report += [f"Calls per step of {w} over {a.count_mode}, by name (FLYT_CALL_COUNTS=1, "
                       "a separate run; top 40):", "", "| class | call | per step |", "|---|---|---|"]
            for k, v in by_name.items():
                kind, name = k.split(" ", 1)
                report.append(f"| {kind} | {name} | {v:.2f} |")
            report.append("")
        if details:
            report += ["## Failure details", ""]
            for n, m, text, r in details:
                report += [f"### {n} over {m}", "", "```", text.strip(), "```"]
                for k in ("stderr_tail", "client_log_tail"):
                    if r.get(k):
                        report += [f"{k}:", "```", r[k].strip()[-2500:], "```"]
                report.append("")
    finally:
        server.stop()
        for emulated in servers.values():
            emulated.stop()
        report.append(f"Total: {time.time() - start:.0f} s.")
        with open(os.path.join(a.out, "ml.md"), "w") as f:
            f.write("\n".join(report) + "\n")
        shutil.copy(server.log_path, runs)
        with tarfile.open(os.path.join(a.out, "ml-logs.tgz"), "w:gz") as tar:
            for fn in sorted(os.listdir(runs)):
                p = os.path.join(runs, fn)
                if os.path.isfile(p) and os.path.getsize(p) < 8 << 20:
                    tar.add(p, arcname=fn)
    print("\n".join(report))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
