"""Real clusters for the tests: `ps-server`, `scheduler` and `worker` processes from the
workspace's release build (`PS_BIN_DIR`, default this checkout's `target/release`), on
127.0.0.1 ports they pick themselves."""
from __future__ import annotations

import os
import pathlib
import subprocess
from typing import Iterator

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
os.environ.setdefault("PS_BIN_DIR", str(REPO / "target" / "release"))

from psclient.local import LocalCluster, Service, binary  # noqa: E402

__all__ = ["REPO", "LocalCluster", "Service", "binary", "interop"]


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    """Two durable shards, no scheduler."""
    with LocalCluster(tmp_path, 2) as c:
        yield c


def interop(*args: str) -> subprocess.CompletedProcess:
    """Runs the Rust side (`ps-interop`), failing the test with its output when it fails."""
    out = subprocess.run([binary("ps-interop"), *args], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        pytest.fail(f"ps-interop {' '.join(args)} failed: {out.stderr}")
    return out
