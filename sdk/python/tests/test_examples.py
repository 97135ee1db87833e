"""The Fashion-MNIST example as a user runs it: a Python worker beside a Rust worker in one
job of a local cluster, in numpy (always) and in PyTorch (where torch is installed)."""
from __future__ import annotations

import pathlib
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

import fashion_mnist  # noqa: E402

DATA = fashion_mnist.DATA


def run(tmp_path: pathlib.Path, backend: str, capsys: pytest.CaptureFixture[str]) -> str:
    if not (DATA / "train-images-idx3-ubyte.gz").exists():
        pytest.fail("Fashion-MNIST is missing: apt-get install dataset-fashion-mnist (scripts/setup.sh --data)")
    code = fashion_mnist.main(["--backend", backend, "--clocks", "400", "--dir", str(tmp_path), "--report-every", "100"])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def accuracies(out: str) -> dict:
    acc = {}
    for line in out.splitlines():
        if "test accuracy" in line:
            name = line.split(":")[0]
            acc[name] = float(line.rsplit(" ", 1)[1].rstrip("%"))
    return acc


def test_numpy_worker_trains_beside_a_rust_worker(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run(tmp_path, "numpy", capsys)
    acc = accuracies(out)
    # Both workers train one model and read it once the job has ended (the scheduler stops a
    # worker that has finished its clocks only when every worker has), so both evaluate the
    # same values on the same test set.
    assert set(acc) == {"python-0", "rust-0"}, out
    assert acc["python-0"] > 75.0, out
    assert abs(acc["python-0"] - acc["rust-0"]) < 1.0, out
    assert "clock   300" in out


def test_torch_worker_trains_beside_a_rust_worker(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    acc = accuracies(run(tmp_path, "torch", capsys))
    assert acc["python-0"] > 75.0 and abs(acc["python-0"] - acc["rust-0"]) < 1.0, acc
