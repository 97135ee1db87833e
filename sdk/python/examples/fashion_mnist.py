#!/usr/bin/env python3
"""Trains the MLP on Fashion-MNIST through the parameter-server cluster, with a Python worker
beside Rust workers in the same job.

By default it starts a local cluster from the release binaries (a scheduler, 2 shards),
submits the job (the README's model: ``mlp:256``, BSP, global batch 128, momentum 0.05) with
``psctl``, starts ``--rust-workers`` Rust workers, and trains as one more worker itself:
join, then per clock pull the model, compute the gradient of its share of the global batch,
push it, and report the clock. The job's tables keep the Rust workers' layout (``w0`` is
``[784, 256]``, ``x @ w + b``). At the end it pulls the model and prints the test accuracy.

    python examples/fashion_mnist.py                    # numpy
    python examples/fashion_mnist.py --backend torch    # PyTorch, through psclient.torch

With ``--scheduler URL --job NAME`` it joins an existing job instead.
"""
from __future__ import annotations

import argparse
import gzip
import pathlib
import sys
import tempfile
import time
from typing import List, Optional, Tuple

import numpy as np

import psclient
from psclient.local import LocalCluster

DATA = pathlib.Path("/usr/share/datasets/fashion-mnist")


def load_idx(path: pathlib.Path) -> np.ndarray:
    """An IDX file (gzip), as numpy."""
    raw = gzip.open(path).read()
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data: pathlib.Path, split: str) -> Tuple[np.ndarray, np.ndarray]:
    x = load_idx(data / f"{split}-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / np.float32(255.0)
    y = load_idx(data / f"{split}-labels-idx1-ubyte.gz").astype(np.int64)
    return x, y


class NumpyMlp:
    """A ReLU MLP with softmax cross-entropy, its parameters as the job's tables hold them."""

    def __init__(self, shapes: List[Tuple[int, ...]]) -> None:
        self.shapes = shapes

    def gradients(self, params: List[np.ndarray], x: np.ndarray, y: np.ndarray, scale: float) -> Tuple[List[np.ndarray], float]:
        """``scale`` times the gradients of the summed loss; and the mean loss."""
        ws = [p.reshape(s) for p, s in zip(params, self.shapes)]
        acts = [x]
        layers = len(ws) // 2
        for l in range(layers):
            z = acts[-1] @ ws[2 * l] + ws[2 * l + 1]
            acts.append(np.maximum(z, 0) if l < layers - 1 else z)
        logits = acts.pop()
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
        dz = p
        dz[np.arange(len(y)), y] -= 1
        dz *= np.float32(scale)
        grads: List[np.ndarray] = [np.empty(0)] * len(ws)
        for l in reversed(range(layers)):
            a = acts[l]
            grads[2 * l] = a.T @ dz
            grads[2 * l + 1] = dz.sum(axis=0)
            if l:
                dz = (dz @ ws[2 * l].T) * (a > 0)
        return [g.astype(np.float32) for g in grads], loss

    def predict(self, params: List[np.ndarray], x: np.ndarray) -> np.ndarray:
        ws = [p.reshape(s) for p, s in zip(params, self.shapes)]
        a = x
        layers = len(ws) // 2
        for l in range(layers):
            a = a @ ws[2 * l] + ws[2 * l + 1]
            if l < layers - 1:
                a = np.maximum(a, 0)
        return a.argmax(axis=1)


def train(args: argparse.Namespace, scheduler: str, job: str) -> float:
    x, y = load(args.data, "train")
    xt, yt = load(args.data, "t10k")
    with psclient.Session(scheduler, job, name=args.name) as session:
        ps = session.client()
        names = sorted(t.spec.name for t in session.spec.tables)
        layers = len(names) // 2
        tables = [n for l in range(layers) for n in (f"{job}/w{l}", f"{job}/b{l}")]
        shapes = [tuple(int(d) for d in ps.describe_table(t).spec.dense.shape) for t in tables]
        global_batch = session.spec.global_batch or 128
        print(f"{args.name}: worker {session.worker_id} of job `{job}` ({session.spec.model}, {session.spec.num_workers} workers), backend {args.backend}", flush=True)
        step = make_step(args.backend, ps, tables, shapes)
        rng = np.random.default_rng(args.seed)
        order: np.ndarray = np.empty(0, dtype=np.int64)
        clock = session.start()
        losses: List[float] = []
        started = time.monotonic()
        while clock is not None:
            a = session.assignment
            if len(order) < (a.batch_size or 64):
                # This worker's data shards: a seeded cut of the examples into num_data_shards.
                cut = np.random.default_rng(args.seed).permutation(len(x))
                ex = np.concatenate([cut[k :: max(a.num_data_shards, 1)] for k in a.data_shards] or [cut])
                order = np.concatenate([order, rng.permutation(ex)])
            batch, order = order[: a.batch_size or 64], order[a.batch_size or 64 :]
            losses.append(step(x[batch], y[batch], 1.0 / global_batch))
            if clock % args.report_every == 0:
                print(f"  clock {clock:5d}  loss {np.mean(losses[-args.report_every:]):.4f}  {time.monotonic() - started:6.1f} s", flush=True)
            clock = session.advance(examples=len(batch))
        params = [ps.pull_dense(t, exact=True) for t in tables]
        ps.close()
    accuracy = float((NumpyMlp(shapes).predict(params, xt) == yt).mean())
    print(f"{args.name}: the job ended after {len(losses)} clocks of this worker; test accuracy {100 * accuracy:.2f}%", flush=True)
    return accuracy


def make_step(backend: str, ps: psclient.Client, tables: List[str], shapes: List[Tuple[int, ...]]):  # type: ignore[no-untyped-def]
    """One clock's work: pull, compute, push; returns the batch's mean loss."""
    if backend == "numpy":
        model = NumpyMlp(shapes)

        def step_numpy(xb: np.ndarray, yb: np.ndarray, scale: float) -> float:
            params = [ps.pull_dense(t) for t in tables]
            grads, loss = model.gradients(params, xb, yb, scale)
            for t, g in zip(tables, grads):
                ps.push_dense(t, g)
            return loss

        return step_numpy
    import torch
    from torch import nn

    from psclient.torch import ParameterServerModule

    layers: List[nn.Module] = []
    for l in range(len(tables) // 2):
        fan_in, fan_out = shapes[2 * l]
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    mlp = nn.Sequential(*layers[:-1])
    linear = [i for i, m in enumerate(mlp) if isinstance(m, nn.Linear)]
    names = {f"{i}.{p}": t for i, (w, b) in zip(linear, zip(tables[::2], tables[1::2])) for p, t in (("weight", w), ("bias", b))}
    module = ParameterServerModule(mlp, ps, tables=names, transposed=[f"{i}.weight" for i in linear])

    def step_torch(xb: np.ndarray, yb: np.ndarray, scale: float) -> float:
        module.pull()
        loss = nn.functional.cross_entropy(module(torch.from_numpy(xb)), torch.from_numpy(yb), reduction="sum")
        loss.backward()
        module.push(scale)
        return float(loss.detach()) / len(yb)

    return step_torch


JOB = """name = "{job}"
consistency = "bsp"
num_shards = 2
num_workers = {workers}
dataset = "fashion-mnist"
model = "mlp:256"
global_batch = 128
max_clocks = {clocks}
seed = {seed}

[model_tables]
optimizer = "momentum"
learning_rate = 0.05
"""


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["numpy", "torch"], default="numpy")
    ap.add_argument("--rust-workers", type=int, default=1, help="Rust workers beside this one (local cluster)")
    ap.add_argument("--clocks", type=int, default=2 * 469, help="the job's length in clocks (469: an epoch)")
    ap.add_argument("--data", type=pathlib.Path, default=DATA)
    ap.add_argument("--scheduler", help="join a job on this scheduler instead of starting a cluster")
    ap.add_argument("--job", default="fmnist-py")
    ap.add_argument("--name", default="python-0")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--report-every", type=int, default=100)
    ap.add_argument("--dir", type=pathlib.Path, help="where the local cluster keeps its files (default: a temporary folder)")
    args = ap.parse_args(argv)
    if not (args.data / "train-images-idx3-ubyte.gz").exists():
        print(f"no Fashion-MNIST in {args.data}: apt-get install dataset-fashion-mnist, or --data DIR", file=sys.stderr)
        return 2
    if args.scheduler:
        train(args, args.scheduler, args.job)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        base = args.dir or pathlib.Path(tmp)
        with LocalCluster(base, 2, scheduler=True) as c:
            job_file = base / "job.toml"
            job_file.write_text(JOB.format(job=args.job, workers=args.rust_workers + 1, clocks=args.clocks, seed=args.seed))
            c.psctl("submit", str(job_file))
            rust = [
                c.worker(args.job, f"rust-{i}", "--data", str(args.data), "--evaluate", "--run-dir", str(base / f"rust-{i}"))
                for i in range(args.rust_workers)
            ]
            accuracy = train(args, c.scheduler_url or "", args.job)
            for w in rust:
                code = w.proc.wait(timeout=120)
                if code != 0:
                    print(f"{w.name} exited with {code}: {w.tail()}", file=sys.stderr)
                    return 1
                final = base / w.name / "final.json"
                if final.exists():
                    import json

                    print(f"{w.name}: test accuracy {100 * json.loads(final.read_text())['eval']['test_accuracy']:.2f}%")
    return 0 if accuracy > 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
