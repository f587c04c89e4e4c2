#!/usr/bin/env python3
"""torch.profiler's links between a matmul's CPU op, its runtime calls and its kernels, one
line per trace event (category, name, timestamp, duration, correlation id, external id).
Run it natively and through `flyt run` and compare the kernels' correlation ids with the
runtime calls' (natively each gemm kernel carries its cudaLaunchKernelExC's id).

usage: profiler_correlation.py   (prints one line per event)
"""
import torch, json, tempfile, os
a = torch.randn(512, 512, device="cuda")
for _ in range(2):
    (a @ a).sum()
torch.cuda.synchronize()
acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
with torch.profiler.profile(activities=acts) as prof:
    b = a @ a
    torch.cuda.synchronize()
with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "t.json"); prof.export_chrome_trace(p); t = json.load(open(p))
ev = t["traceEvents"]
for e in ev:
    if e.get("ph") != "X": continue
    c = e.get("cat")
    if c in ("cpu_op", "cuda_runtime", "cuda_driver", "kernel"):
        args = e.get("args", {})
        print("%-12s %-40s ts=%.1f dur=%.1f corr=%s ext=%s" % (c, e["name"][:40], e["ts"], e.get("dur", 0), args.get("correlation"), args.get("External id")))
