"""A deterministic PyTorch training loop for the migration check (run_migrate.py).

Prints "step N loss=L" per step (L to 9 significant digits), sleeping PAUSE_MS between
steps so that the session can be moved while it runs, then "train_loop: PASS".

usage: python3 train_loop.py STEPS PAUSE_MS [MODE]
  MODE plain (default); expandable (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the
  allocator's own VMM); mallocasync (backend:cudaMallocAsync); cudagraph (each step a
  replay of a training step captured with torch.cuda.graph).
"""
import os
import sys
import time

MODE = sys.argv[3] if len(sys.argv) > 3 else "plain"
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
if MODE == "expandable":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
elif MODE == "mallocasync":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
import torch  # noqa: E402


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    pause = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    dev = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator(device="cpu").manual_seed(1)
    x_all = torch.randn(64 * steps, 256, generator=gen)
    y_all = torch.randint(0, 10, (64 * steps,), generator=gen)
    if MODE == "cudagraph":
        static_x = torch.zeros(64, 256, device=dev)
        static_y = torch.zeros(64, dtype=torch.long, device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up before capture, as the PyTorch docs do
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(static_x), static_y).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = torch.nn.functional.cross_entropy(model(static_x), static_y)
            static_loss.backward()
            opt.step()
        for i in range(steps):
            static_x.copy_(x_all[i * 64:(i + 1) * 64].to(dev))
            static_y.copy_(y_all[i * 64:(i + 1) * 64].to(dev))
            graph.replay()
            print("step %d loss=%.9g" % (i, static_loss.item()), flush=True)
            if pause:
                time.sleep(pause / 1000)
        print("train_loop: PASS", flush=True)
        return
    for i in range(steps):
        x = x_all[i * 64:(i + 1) * 64].to(dev)
        y = y_all[i * 64:(i + 1) * 64].to(dev)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print("step %d loss=%.9g" % (i, loss.item()), flush=True)
        if pause:
            time.sleep(pause / 1000)
    print("train_loop: PASS", flush=True)


if __name__ == "__main__":
    main()
