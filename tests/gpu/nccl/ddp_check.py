"""torch.distributed with the nccl backend, as training scripts use it (issue 19).

Under torchrun (one process per GPU): all_reduce (sum, avg, max), all_gather_into_tensor,
reduce_scatter_tensor, broadcast and a barrier with known results, then DistributedDataParallel
steps of a small MLP, each rank on its half of a fixed batch. `--reference` runs the same
training in one process on one GPU with the whole batch (the gradient DDP averages is the
full batch's): the rank-0 parameters after the steps must match it. Each mode writes a JSON
summary (--out).
"""
import argparse
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

STEPS = 5
BATCH = 64  # split evenly over the ranks


def model_and_data(device):
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10)).to(device)
    g = torch.Generator().manual_seed(99)
    x = torch.randn(STEPS, BATCH, 256, generator=g)
    y = torch.randint(0, 10, (STEPS, BATCH), generator=g)
    return model, x, y


def train(model, x, y, device, lo, hi):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        out = model(x[s, lo:hi].to(device))
        loss = nn.functional.cross_entropy(out, y[s, lo:hi].to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def params_of(model):
    m = model.module if hasattr(model, "module") else model
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for p in m.parameters()])
    return flat


def collectives(rank, world, device):
    checks = {}
    t = torch.full((1000003,), float(rank + 1), device=device)
    dist.all_reduce(t)
    checks["all_reduce_sum"] = bool((t == world * (world + 1) / 2).all().item())
    t = torch.full((4097,), float((rank + 1) * 2), device=device)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    checks["all_reduce_avg"] = bool((t == world + 1).all().item())
    t = torch.arange(513, device=device, dtype=torch.int64) + rank * 1000
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    checks["all_reduce_max"] = bool(
        (t == torch.arange(513, device=device) + (world - 1) * 1000).all().item())
    part = torch.arange(1001, device=device, dtype=torch.float32) + rank * 10000
    whole = torch.empty(1001 * world, device=device)
    dist.all_gather_into_tensor(whole, part)
    want = torch.cat([torch.arange(1001, dtype=torch.float32) + r * 10000 for r in range(world)])
    checks["all_gather"] = bool(torch.equal(whole.cpu(), want))
    src = torch.full((517 * world,), float(rank + 1), device=device, dtype=torch.bfloat16)
    dst = torch.empty(517, device=device, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(dst, src)
    checks["reduce_scatter_bf16"] = bool((dst.float() == world * (world + 1) / 2).all().item())
    b = torch.arange(65539, device=device, dtype=torch.float32) if rank == world - 1 else \
        torch.zeros(65539, device=device)
    dist.broadcast(b, src=world - 1)
    checks["broadcast"] = bool(torch.equal(b.cpu(), torch.arange(65539, dtype=torch.float32)))
    dist.barrier()
    checks["barrier"] = True
    return checks


def io_bytes():
    """This process's bytes through read/write-like system calls (its sockets included)."""
    fields = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    return int(fields["rchar"]) + int(fields["wchar"])


def link_bytes(device, mib=256, reps=3):
    """Bytes this process moved through its sockets per byte all-reduced: a collective's
    bytes that went through the client would show here (at least 1 per byte)."""
    t = torch.ones(mib << 18, device=device)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    before = io_bytes()
    t0 = time.monotonic()
    for _ in range(reps):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    seconds = (time.monotonic() - t0) / reps
    moved = io_bytes() - before
    return moved / (reps * t.numel() * 4), seconds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--dataparallel", action="store_true",
                    help="one process, nn.DataParallel over cuda:0 and cuda:1 (NCCL broadcast "
                         "and reduce between the two GPUs)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.reference:
        device = torch.device("cuda:0")
        model, x, y = model_and_data(device)
        losses = train(model, x, y, device, 0, BATCH)
        flat = params_of(model)
        torch.save(flat, args.out + ".pt")
        json.dump({"mode": "reference", "losses": losses,
                   "params_sha": hashlib.sha256(flat.numpy().tobytes()).hexdigest()},
                  open(args.out, "w"), indent=1)
        return 0
    if args.dataparallel:
        device = torch.device("cuda:0")
        model, x, y = model_and_data(device)
        dp = nn.DataParallel(model, device_ids=[0, 1])
        t0 = time.monotonic()
        losses = train(dp, x, y, device, 0, BATCH)
        torch.cuda.synchronize()
        step_s = (time.monotonic() - t0) / STEPS
        flat = params_of(dp)
        torch.save(flat, args.out + ".pt")
        json.dump({"mode": "dataparallel", "checks": {"two_devices": torch.cuda.device_count() == 2},
                   "losses": losses, "init_s": 0.0, "step_s": step_s,
                   "client_bytes_per_allreduced_byte": float("nan"), "allreduce_256mib_s": 0.0,
                   "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
                   "params_sha": hashlib.sha256(flat.numpy().tobytes()).hexdigest()},
                  open(args.out, "w"), indent=1)
        return 0
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    t0 = time.monotonic()
    dist.init_process_group("nccl", device_id=device)
    init_s = time.monotonic() - t0
    checks = collectives(rank, world, device)
    per_byte, allreduce_s = link_bytes(device)
    model, x, y = model_and_data(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local])
    per = BATCH // world
    t0 = time.monotonic()
    losses = train(ddp, x, y, device, rank * per, (rank + 1) * per)
    torch.cuda.synchronize()
    step_s = (time.monotonic() - t0) / STEPS
    # The mean of the ranks' losses is the whole batch's loss.
    lt = torch.tensor(losses, device=device)
    dist.all_reduce(lt, op=dist.ReduceOp.AVG)
    flat = params_of(ddp)
    summary = {"mode": "ddp", "rank": rank, "world": world, "checks": checks,
               "losses": lt.cpu().tolist(), "init_s": init_s, "step_s": step_s,
               "client_bytes_per_allreduced_byte": per_byte, "allreduce_256mib_s": allreduce_s,
               "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
               "params_sha": hashlib.sha256(flat.numpy().tobytes()).hexdigest()}
    if rank == 0:
        torch.save(flat, args.out + ".pt")
        json.dump(summary, open(args.out, "w"), indent=1)
    dist.destroy_process_group()
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
