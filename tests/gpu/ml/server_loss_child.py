"""A PyTorch training loop whose flyt-server is killed under it (run by server_loss.py).

Owns: its own stdout protocol: "step N" after each step, then "caught: <error>" for the
first CUDA error, then "second: ..." for one more CUDA call after it. Exits 3 after
that, so that the parent can tell its own clean exit from a crash or abort while
PyTorch tears down with the server gone.
Must not touch: anything outside its own process.
"""

import sys
import time

import torch


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(512, 256, device="cuda")
    y = torch.randint(0, 10, (512,), device="cuda")
    pinned = torch.empty(512, 256).pin_memory()
    step = 0
    try:
        while step < 1_000_000:
            xb = pinned.to("cuda", non_blocking=True) + x  # a pinned copy in flight too
            loss = torch.nn.functional.cross_entropy(model(xb), y)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            loss.item()
            step += 1
            print(f"step {step}", flush=True)
    except Exception as e:  # torch.AcceleratorError or RuntimeError
        print(f"caught: {type(e).__name__}: {str(e).strip().splitlines()[0]}", flush=True)
    t = time.time()
    try:
        torch.ones(4, device="cuda").sum().item()
        print("second: no error", flush=True)
    except Exception as e:
        print(f"second: {type(e).__name__} after {time.time() - t:.3f} s: "
              f"{str(e).strip().splitlines()[0]}", flush=True)
    return 3


if __name__ == "__main__":
    sys.exit(main())
