#!/usr/bin/env python3
"""What tracing costs training: the README's main job (an MLP on Fashion-MNIST through a local
cluster of 2 shards and 2 workers, `psctl local`) with no spans at all (RUST_LOG=warn), with
tracing off (the default: spans for the logs, nothing exported), sampled (1 step in 100, the
shards and the scheduler following the worker's decision) and always on, the spans sent to a
real OTLP collector (rotel, blackhole exporter). The modes take turns, REPS rounds, so
that the machine's drift falls on all three; each run's throughput is the evaluating worker's
examples over its training time (start-up and evaluation left out). Prints each mode's
median examples/s and its ratio to tracing off.

  scripts/trace-overhead.py [--reps 5] [--epochs 5]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PSCTL = ROOT / "target" / "release" / "psctl"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=5)
    args = ap.parse_args()
    agent = subprocess.check_output([ROOT / "scripts" / "rotel.sh"], text=True).strip()
    port = free_port()
    collector = subprocess.Popen(
        [agent, "start", "--exporter", "blackhole",
         "--otlp-grpc-endpoint", f"127.0.0.1:{port}",
         "--otlp-http-endpoint", f"127.0.0.1:{free_port()}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
        modes = {
            # No span is even created: the instrumentation's own cost shows against "off".
            "no spans": {"RUST_LOG": "warn"},
            "off": {},
            "sampled": {**endpoint, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                           "OTEL_TRACES_SAMPLER_ARG": "0.01"},
            "always on": {**endpoint, "OTEL_TRACES_SAMPLER": "parentbased_always_on"},
        }
        rates = {m: [] for m in modes}
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(args.reps):
                for mode, env in modes.items():
                    env = {k: v for k, v in os.environ.items()
                           if not k.startswith("OTEL_") and k != "RUST_LOG"} | env
                    out = subprocess.run(
                        [PSCTL, "local", "--json", "--epochs", str(args.epochs),
                         "--run-dir", f"{tmp}/{rep}-{len(rates[mode])}-{mode[:3]}"],
                        env=env, capture_output=True, text=True, check=True)
                    e = json.loads(out.stdout)["result"]["eval"]
                    rate = e["examples"] / e["train_s"]
                    rates[mode].append(rate)
                    print(f"round {rep + 1} {mode:>9}: {rate:8.0f} examples/s "
                          f"(test accuracy {e['test_accuracy']:.4f})", flush=True)
    finally:
        collector.terminate()
        collector.wait()
    base = statistics.median(rates["off"])
    print(f"\nmedian over {args.reps} rounds, {args.epochs} epochs each:")
    for mode, r in rates.items():
        m = statistics.median(r)
        print(f"  {mode:>9}: {m:8.0f} examples/s  {m / base:.3f}x of tracing off "
              f"(min {min(r):.0f}, max {max(r):.0f})")


if __name__ == "__main__":
    main()
