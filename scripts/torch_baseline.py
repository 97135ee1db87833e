#!/usr/bin/env python3
"""PyTorch eager baselines for gpu-bench, on the same GPU.

step: the MLP step gpu-bench times (784-256-10, ReLU, softmax cross-entropy, plain f32): upload
the batch, forward, backward, then top-k 1% of every gradient with error feedback (torch.topk of
the magnitudes), the kept values and indices copied to the host.
topk: torch.topk of the magnitudes of 16 M floats, k = 1%, the result on the device.

Prints one JSON line per figure, like gpu-bench.
"""
import argparse
import json
import time

import torch


def step_bench(batch, hidden, steps, ratio):
    dev = torch.device("cuda")
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
    ).to(dev)
    loss_fn = torch.nn.CrossEntropyLoss()
    xs = [torch.rand(batch, 784) for _ in range(4)]
    ys = [torch.randint(0, 10, (batch,)) for _ in range(4)]
    residual = [torch.zeros_like(p) for p in model.parameters()]

    def run(i):
        x = xs[i % 4].to(dev, non_blocking=False)
        y = ys[i % 4].to(dev)
        model.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), y)
        loss.backward()
        nbytes = 0
        for p, r in zip(model.parameters(), residual):
            acc = (p.grad + r).flatten()
            k = max(1, int(-(-ratio * acc.numel() // 1)))
            _, idx = torch.topk(acc.abs(), k, sorted=False)
            vals = acc[idx]
            r.view(-1).copy_(acc)
            r.view(-1)[idx] = 0
            host_vals = vals.half().cpu()
            host_idx = idx.int().cpu()
            nbytes += host_vals.numel() * 2 + host_idx.numel() * 4
        return nbytes

    for i in range(10):
        run(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        nbytes = run(i)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    print(json.dumps({
        "bench": "step", "backend": "pytorch-eager", "batch": batch, "hidden": hidden,
        "steps": steps, "ms_per_step": secs * 1e3 / steps,
        "samples_per_s": steps * batch / secs, "payload_bytes": nbytes,
    }))


def topk_bench(n, ratio, reps):
    dev = torch.device("cuda")
    torch.manual_seed(2)
    x = torch.rand(n, device=dev) * 2 - 1
    k = max(1, int(ratio * n))
    for _ in range(3):
        torch.topk(x.abs(), k, sorted=False)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.topk(x.abs(), k, sorted=False)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    print(json.dumps({
        "bench": "topk", "backend": "torch.topk", "n": n, "ratio": ratio, "k": k,
        "reps": reps, "ms_median": times[reps // 2], "ms_min": times[0],
    }))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["step", "topk"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--ratio", type=float, default=0.01)
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    if a.what == "step":
        step_bench(a.batch, a.hidden, a.steps, a.ratio)
    else:
        topk_bench(a.n, a.ratio, a.reps)


if __name__ == "__main__":
    main()
