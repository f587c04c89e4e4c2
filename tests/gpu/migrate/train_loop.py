"""A deterministic PyTorch training loop for the migration check (run_migrate.py).

Prints "step N loss=L" per step (L to 9 significant digits), sleeping PAUSE_MS between
steps so that the session can be moved while it runs, then "train_loop: PASS".

usage: python3 train_loop.py STEPS PAUSE_MS
"""
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
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
