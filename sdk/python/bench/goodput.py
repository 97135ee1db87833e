#!/usr/bin/env python3
"""Python push+pull goodput against the Rust SDK's, in one run on the same shards.

Starts `--shards` durable shards (real `ps-server` processes), creates a dense table of each
size, and times push+pull round trips (a gradient of the whole table pushed, the table pulled)
from the Python client and from the Rust SDK (`ps-interop bench`, a separate process), in
interleaved rounds. Goodput counts the f32 bytes of the push and of the pull. Prints a table
with medians and the Python/Rust ratio (target: at least 0.7 with the bulk stream).
`--fused` times both sides' `push_pull_dense` instead (a step's push and pull in one call; the
halves are then not timed apart).

    python sdk/python/bench/goodput.py [--sizes 1000000,16000000] [--rounds 3] [--shards 2] [--fused]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import psclient
from psclient.local import LocalCluster, binary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000000,16000000")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each: Python's and Rust's timings)")
    ap.add_argument("--reps", type=int, default=5, help="round trips timed per round and side")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--no-bulk", action="store_true", help="both sides through gRPC only")
    ap.add_argument("--fused", action="store_true", help="time push_pull_dense steps on both sides")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(pathlib.Path(tmp), args.shards, dense_log_mib=None) as c:
        ps = psclient.Client(c.endpoints, bulk=not args.no_bulk)
        for n in sizes:
            table = f"bench-{n}"
            ps.create_table(psclient.dense_table(table, [n], optimizer=psclient.sgd(1.0)))
            # Values lz4 cannot shrink, as a real gradient's: pushes stay plain f32.
            grad = np.random.default_rng(n).uniform(-0.5, 0.5, n).astype(np.float32)
            # Pulled into one array, as a training loop keeps its parameters (the Rust side
            # does the same).
            w = np.empty(n, dtype=np.float32)
            ps.push_dense(table, grad)  # warm-up: connections, the table's spec
            ps.pull_dense_into(table, w)
            py, rs = [], []  # (push seconds, pull seconds) per round trip
            for _ in range(args.rounds):
                for _ in range(args.reps):
                    t = time.perf_counter()
                    if args.fused:
                        ps.push_pull_dense(table, grad, w)
                        py.append((time.perf_counter() - t, 0.0))
                        continue
                    ps.push_dense(table, grad)
                    pushed = time.perf_counter() - t
                    ps.pull_dense_into(table, w)
                    py.append((pushed, time.perf_counter() - t - pushed))
                cmd = [binary("ps-interop"), "bench", "--endpoints", ",".join(c.endpoints), "--table", table, "--rounds", str(args.reps + 1)]
                if args.no_bulk:
                    cmd.append("--no-bulk")
                if args.fused:
                    cmd.append("--fused")
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                rs.extend(tuple(r) for r in json.loads(out.stdout)[1:])  # the first pays the connections
            rows.append((n, goodput(n, py), goodput(n, rs)))
        ps.close()
    transport = "gRPC only" if args.no_bulk else "bulk stream"
    if args.fused:
        print(f"{transport}, push_pull_dense, medians of {args.rounds}x{args.reps} steps; GB/s: push+pull")
    else:
        print(f"{transport}, medians of {args.rounds}x{args.reps} round trips; GB/s: push+pull (push, pull)")
    print("| floats | shards | Python | Rust SDK | Python / Rust |")
    print("| --- | --- | --- | --- | --- |")
    for n, p, r in rows:
        if args.fused:
            print(f"| {n:,} | {args.shards} | {p[0]:.2f} | {r[0]:.2f} | {p[0] / r[0]:.2f} |")
        else:
            print(f"| {n:,} | {args.shards} | {p[0]:.2f} ({p[1]:.2f}, {p[2]:.2f}) | {r[0]:.2f} ({r[1]:.2f}, {r[2]:.2f}) | {p[0] / r[0]:.2f} |")
    return 0


def goodput(n: int, times: list) -> tuple:
    """GB/s of a push+pull round trip and of each half, from the medians (a half timed as 0,
    as a fused step's pull is, reads 0)."""
    gb = 4 * n / 1e9
    push = statistics.median(t[0] for t in times)
    pull = statistics.median(t[1] for t in times)
    both = statistics.median(t[0] + t[1] for t in times)
    return 2 * gb / both, gb / push, gb / pull if pull else 0.0


if __name__ == "__main__":
    sys.exit(main())
