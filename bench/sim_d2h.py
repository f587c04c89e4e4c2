#!/usr/bin/env python3
"""CPU cost and bandwidth of pageable device-to-host copies over shm:// without a GPU.

Runs bench/d2h_bench through `flyt run` against flyt-server --backend sim on shm://, once
per client setting (default: FLYT_SHM_STAGED=off, i.e. the bytes through the rings, the
path before the staging area; the staging area with 1 copying thread; with 2), and reports
for each: best and median GB/s, the client's CPU seconds per GiB, and the server worker's
CPU seconds per GiB over the timed copies (read from /proc while the client waits). On the
sim the server's "DMA" is a memcpy, so its CPU is the emulated GPU's plus the server's own
copies; the client's is the copy-out.

Usage: bench/sim_d2h.py BUILD_DIR [D2H_BENCH] [--mib M] [--reps R] [--rounds K]
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

SETTINGS = [("rings (before)", {"FLYT_SHM_STAGED": "off"}),
            ("staged, 1 thread", {"FLYT_SHM_COPY_THREADS": "1"}),
            ("staged, 2 threads", {"FLYT_SHM_COPY_THREADS": "2"})]


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    out.append(int(d))
            except OSError:
                pass
    return out


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("bench", nargs="?")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    bench = a.bench or os.path.join(build, "bench", "d2h_bench")
    tmp = tempfile.mkdtemp(prefix="flyt-simd2h.")
    sock = os.path.join(tmp, "s.shm.sock")
    srv = subprocess.Popen([os.path.join(build, "bin", "flyt-server"), "--backend", "sim",
                            "--listen", "shm://" + sock], stdout=subprocess.DEVNULL,
                           stderr=open(os.path.join(tmp, "server.log"), "w"))
    try:
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        gib = a.mib * a.reps / 1024.0
        for rnd in range(a.rounds):
            for label, extra in SETTINGS:
                env = dict(os.environ, FLYT_SHM="off", **extra)
                before = set(children(srv.pid))
                p = subprocess.Popen([os.path.join(build, "bin", "flyt"), "run", "--server",
                                      "shm://" + sock, "--", bench, str(a.mib), str(a.reps), "1"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, text=True)
                results, worker_cpu, t0 = {}, None, None
                for line in p.stdout:
                    w = line.split()
                    if line.startswith("ready") or line.startswith("holding"):
                        # The worker serving this client: a child of the server that is busy.
                        ws = [c for c in children(srv.pid)]
                        cpu = sum(cpu_s(c) for c in ws)
                        if line.startswith("ready"):
                            t0 = cpu
                        else:
                            worker_cpu = cpu - t0
                    elif w and w[0] == "RESULT":
                        results[w[1]] = float(w[2])
                p.wait()
                print("round %d  %-18s best %6.2f GB/s  median %6.2f GB/s  client %.3f s/GiB  "
                      "server %.3f s/GiB" % (rnd + 1, label,
                                             results.get("d2h_pageable_gbps", 0),
                                             results.get("d2h_pageable_median_gbps", 0),
                                             results.get("d2h_client_cpu_s_per_gib", 0),
                                             (worker_cpu or 0) / gib))
                sys.stdout.flush()
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait()


if __name__ == "__main__":
    main()
