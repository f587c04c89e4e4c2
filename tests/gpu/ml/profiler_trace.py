#!/usr/bin/env python3
"""torch.profiler as a user runs it: CPU and CUDA activities around a few steps, the
Chrome trace exported, and what it holds counted by category (kernel, gpu_memcpy,
gpu_memset, cuda_runtime, ac2g flows), how many kernels are linked to an operator,
and aten::mm's device time. Run it natively and through `flyt run` and compare.

usage: profiler_trace.py [--steps N] [--json OUT]   (prints key=value lines)
"""
import argparse
import collections
import json
import os
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--warmup", type=int, default=0, help="steps run before profiling")
    ap.add_argument("--kernels", action="store_true",
                    help="also print each event that is not a CPU op or an API call: name, duration, the operator it is linked to")
    args = ap.parse_args()
    import torch

    a = torch.randn(512, 512, device="cuda")
    host = torch.empty(512, device="cpu")
    for _ in range(args.warmup):
        (a @ a).relu().sum(dim=0)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(args.steps):
            b = (a @ a).relu().sum(dim=0)
            host.copy_(b)
            a.fill_(0.5)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    events = trace.get("traceEvents", [])
    cats = collections.Counter(e.get("cat", "") for e in events if e.get("ph") in ("X", "s", "f"))
    kernels = [e for e in events if e.get("cat") == "kernel"]
    linked = sum(1 for e in kernels if "External id" in e.get("args", {}) or
                 "correlation" in e.get("args", {}))
    mm = [e for e in prof.key_averages() if e.key == "aten::mm"]
    out = collections.OrderedDict()
    for c in ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver",
              "ac2g"):
        out["cat_" + c] = cats.get(c, 0)
    out["kernels_with_correlation"] = linked
    out["mm_device_time_us"] = round(float(getattr(mm[0], "device_time_total", 0)), 1) if mm else 0
    out["result_ok"] = bool(torch.isfinite(b).all().item())
    for k, v in out.items():
        print(f"{k}={v}")
    if args.kernels:
        print("categories: " + ", ".join(f"{c} {n}" for c, n in sorted(cats.items())))
        for e in prof.key_averages():
            if getattr(e, "device_time_total", 0) > 0:
                print("op %-30s device_time_us=%.1f count=%d" % (e.key, e.device_time_total, e.count))
        # A kernel's operator: the cpu_op whose External id the kernel carries.
        ops_by_ext = {e["args"].get("External id"): e["name"] for e in events
                      if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
        for e in events:
            if e.get("ph") != "X" or e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver",
                                                        "python_function", "user_annotation"):
                continue
            a_ = e.get("args", {})
            print(e["cat"] + " %-50s dur=%.1f corr=%s op=%s ts=%.1f" % (
                e["name"][:50], e.get("dur", 0), a_.get("correlation"),
                ops_by_ext.get(a_.get("External id"), "-"), e.get("ts", 0)))
        for e in events:
            if e.get("cat") == "cpu_op" and e.get("ph") == "X":
                print("cpu_op %-30s ts=%.1f dur=%.1f" % (e["name"][:30], e.get("ts", 0), e.get("dur", 0)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
