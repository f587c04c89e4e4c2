"""What PyTorch sees of a tenant's share (run by tenant_view.py through `flyt run`).

Owns: one JSON object on stdout: the memory and SM figures PyTorch and NVML report, what
happens when the tenant allocates past its memory quota and after it frees, and a matmul
checked against the CPU on the SM-limited context.
Must not touch: anything outside its own process.
"""

import json
import sys

import torch

GIB = 1 << 30


def main():
    out = {}
    free, total = torch.cuda.mem_get_info()
    props = torch.cuda.get_device_properties(0)
    out.update(mem_total=total, mem_free=free, props_total=props.total_memory,
               sm_count=props.multi_processor_count)
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out["nvml_total"] = pynvml.nvmlDeviceGetMemoryInfo(h).total
        pynvml.nvmlShutdown()
    except ImportError:
        out["nvml_total"] = None
    # Within the quota, then past it, then again after freeing.
    a = torch.empty(total // 2, dtype=torch.uint8, device="cuda")
    try:
        b = torch.empty(total // 2 + GIB // 4, dtype=torch.uint8, device="cuda")
        out["over_quota"] = "allocated"
        del b
    except torch.OutOfMemoryError as e:
        out["over_quota"] = "OutOfMemoryError"
        out["over_quota_message"] = str(e).strip().splitlines()[0][:200]
    del a
    torch.cuda.empty_cache()
    c = torch.empty(total // 2 + GIB // 4, dtype=torch.uint8, device="cuda")
    c.fill_(7)
    out["after_free"] = int(c[-1].item())
    del c
    torch.cuda.empty_cache()
    x = torch.randn(1024, 1024, device="cuda")
    out["matmul_ok"] = bool(torch.allclose((x @ x).cpu(), x.cpu() @ x.cpu(), rtol=1e-3, atol=1e-3))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
