"""Training-step and decode benchmarks, run natively and through Flyt.

Usage: python3 bench_ml.py WORKLOAD OUT.json
  resnet18_train  ResNet-18 (11.7 M parameters), batch 64, 3x112x112, SGD, cuDNN autotuned
  gpt_train       GPT-style decoder (8 layers, d=512, 8 heads, context 256), batch 16, AdamW
  gpt_decode      the same model generating 128 tokens for one sequence with a KV cache,
                  each token brought to the host (as a streaming server does)
  hf_generate     HF transformers Llama (8 layers, d=1024, 16 heads, 4 KV heads: grouped-
                  query attention), bf16, generate() of 64 tokens for a batch of 4, with the
                  library's defaults (SDPA attention: PyTorch picks cuDNN's fused kernels)
  hf_generate_math  the same with PyTorch's math attention backend (for comparison)
  hf_train        the same model, one AdamW training step, batch 8 x 256 tokens, bf16
  sdpa_decode     scaled_dot_product_attention with the cuDNN backend at decode shapes
                  (one query, a KV cache growing by one each call), as generate() runs it

Owns: timing only (warm-up, then CUDA-synchronized wall time over the timed
steps). When the process runs on Flyt's libcuda.so.1, flyt_client_stats gives
the driver calls the client made during the timed steps (synchronous ones wait
for a reply; asynchronous ones are queued) and the messages it sent.
"""

import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cases  # noqa: E402

STAT_NAMES = ("sync_calls", "async_calls", "sends")


def flyt_stats():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.flyt_client_stats
    except (OSError, AttributeError):
        return None
    buf = (ctypes.c_uint64 * len(STAT_NAMES))()
    fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
    fn(buf, len(STAT_NAMES))
    return list(buf)


def call_counts():
    """{"SYNC name": count} when the client counts calls (FLYT_CALL_COUNTS=1)."""
    try:
        fn = ctypes.CDLL("libcuda.so.1").flyt_client_call_counts
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    buf = ctypes.create_string_buffer(1 << 20)
    fn(buf, len(buf))
    counts = {}
    for line in buf.value.decode().splitlines():
        kind, n, name = line.split(" ", 2)
        counts[f"{kind} {name}"] = int(n)
    return counts or None


def resnet18(torch, classes=100):
    nn = torch.nn

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def timed(torch, step, warmup, steps):
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    s0 = flyt_stats()
    c0 = call_counts()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for i in range(steps):
        step(warmup + i)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    cpu_seconds = time.process_time() - cpu0
    s1 = flyt_stats()
    c1 = call_counts()
    # CPU time of all the process's threads: tells work on the host from waiting.
    doc = {"steps": steps, "ms_per_step": seconds * 1000 / steps,
           "cpu_ms_per_step": cpu_seconds * 1000 / steps}
    if c0 is not None and c1 is not None:
        per = {k: (v - c0.get(k, 0)) / steps for k, v in c1.items() if v != c0.get(k, 0)}
        doc["calls_per_step_by_name"] = dict(sorted(per.items(), key=lambda kv: -kv[1])[:40])
    if s0 is not None:
        for name, a, b in zip(STAT_NAMES, s0, s1):
            doc[name + "_per_step"] = (b - a) / steps
    return doc


def timed_training(torch, opt, loss_of_step, warmup, steps):
    """An optimizer step per timed step; every tenth loss goes to the host, as a training
    loop's logging does."""

    def step(i):
        loss = loss_of_step()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i % 10 == 0:
            loss.item()

    return timed(torch, step, warmup, steps)


def bench_resnet18_train(torch):
    torch.backends.cudnn.benchmark = True
    model = resnet18(torch).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 3, 112, 112, device="cuda")
    y = torch.randint(0, 100, (64,), device="cuda")
    losses = []

    def step(i):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i % 10 == 0:
            losses.append(loss.item())  # a training loop's periodic logging

    return timed(torch, step, 10, 40)


def gpt_model(torch):
    cfg = cases._GptConfig(vocab=8192, dim=512, heads=8, layers=8, ctx=256)
    return cfg, cases.make_gpt(torch, cfg).cuda()


def bench_gpt_train(torch):
    cfg, model = gpt_model(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    idx = torch.randint(0, cfg.vocab, (16, cfg.ctx), device="cuda")
    tgt = torch.roll(idx, -1, dims=1)

    def loss():
        logits = model(idx)
        return torch.nn.functional.cross_entropy(logits.view(-1, cfg.vocab), tgt.view(-1))

    return timed_training(torch, opt, loss, 5, 30)


def bench_gpt_decode(torch):
    cfg, model = gpt_model(torch)
    model.eval()
    prompt = torch.randint(0, cfg.vocab, (1, 16), device="cuda")
    new_tokens = 128

    def step(i):
        with torch.no_grad():
            caches = [dict() for _ in range(cfg.layers)]
            logits = model(prompt, caches, 0)
            nxt = logits[:, -1].argmax(dim=-1, keepdim=True)
            pos = prompt.shape[1]
            for _ in range(new_tokens):
                nxt.item()  # the token goes to the host, as it does when streaming
                logits = model(nxt, caches, pos)
                pos += 1
                nxt = logits[:, -1].argmax(dim=-1, keepdim=True)

    doc = timed(torch, step, 1, 3)
    doc["tokens_per_step"] = new_tokens
    doc["ms_per_token"] = doc["ms_per_step"] / new_tokens
    return doc


def hf_llama(torch):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                      num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                      max_position_embeddings=2048)
    return cfg, LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16)


def bench_hf_generate(torch, backend=None):
    cfg, model = hf_llama(torch)
    model.eval()
    batch, new_tokens = 4, 64
    prompt = torch.randint(0, cfg.vocab_size, (batch, 32), device="cuda")

    def step(i):
        with torch.no_grad():
            if backend is None:
                out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                     do_sample=False, pad_token_id=0)
            else:
                from torch.nn.attention import sdpa_kernel

                with sdpa_kernel(backend):
                    out = model.generate(prompt, max_new_tokens=new_tokens,
                                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        assert out.shape == (batch, 32 + new_tokens), out.shape

    doc = timed(torch, step, 1, 3)
    doc["tokens_per_s"] = batch * new_tokens * 1000 / doc["ms_per_step"]
    return doc


def bench_hf_generate_math(torch):
    from torch.nn.attention import SDPBackend

    return bench_hf_generate(torch, SDPBackend.MATH)


def bench_hf_train(torch):
    cfg, model = hf_llama(torch)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (8, 256), device="cuda")

    return timed_training(torch, opt, lambda: model(input_ids=ids, labels=ids).loss, 3, 20)


def bench_sdpa_decode(torch):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    batch, heads, dim, start, calls = 4, 16, 64, 32, 64
    q = torch.randn(batch, heads, 1, dim, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(batch, heads, start + 4 * calls + 8, dim, device="cuda", dtype=torch.bfloat16)
    fn = torch.nn.functional.scaled_dot_product_attention

    def step(i):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for n in range(calls):  # a new KV length each call, as in decode
                length = start + i * calls + n
                fn(q, kv[:, :, :length], kv[:, :, :length])

    doc = timed(torch, step, 1, 3)
    doc["ms_per_call"] = doc["ms_per_step"] / calls
    return doc


WORKLOADS = {"resnet18_train": bench_resnet18_train, "gpt_train": bench_gpt_train,
             "gpt_decode": bench_gpt_decode, "hf_generate": bench_hf_generate,
             "hf_generate_math": bench_hf_generate_math, "hf_train": bench_hf_train,
             "sdpa_decode": bench_sdpa_decode}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in WORKLOADS:
        sys.stderr.write("usage: bench_ml.py WORKLOAD OUT.json; workloads: %s\n" % " ".join(WORKLOADS))
        return 2
    import torch

    torch.manual_seed(0)
    doc = {"workload": sys.argv[1], "flyt": flyt_stats() is not None}
    doc.update(WORKLOADS[sys.argv[1]](torch))
    with open(sys.argv[2], "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
