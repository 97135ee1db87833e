"""The Python client and the Rust SDK (`ps-interop`) on the same tables: what one pushes the
other reads bit for bit, and the same pushes under the same codec (with error feedback) leave
bit-identical tables."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

import psclient

from conftest import LocalCluster, interop


def rust(cluster: LocalCluster, *args: str, codec: str = "f32") -> None:
    cmd, table, *rest = args
    interop(cmd, "--endpoints", ",".join(cluster.endpoints), "--table", table, "--codec", codec, *rest)


def test_dense_values_cross_between_the_sdks(cluster: LocalCluster, tmp_path: pathlib.Path) -> None:
    n = 700_000  # three default chunks, over the bulk stream both ways
    with psclient.Client(cluster.endpoints) as ps:
        ps.create_table(psclient.dense_table("x", [n], optimizer=psclient.momentum(0.1, 0.9)))
        g = np.random.default_rng(9).standard_normal(n).astype(np.float32)
        ps.push_dense("x", g)
        (tmp_path / "g2").write_bytes((g * 2).astype("<f4").tobytes())
        rust(cluster, "push-dense", "x", str(tmp_path / "g2"))
        rust(cluster, "pull-dense", "x", str(tmp_path / "out"))
        ours = ps.pull_dense("x")
        theirs = np.frombuffer((tmp_path / "out").read_bytes(), dtype="<f4")
        assert ours.tobytes() == theirs.tobytes()
        v = np.float32(0.9) * g + g * 2
        want = (np.float32(0) - np.float32(0.1) * g) - np.float32(0.1) * v
        assert np.array_equal(ours, want)


def test_sparse_rows_cross_between_the_sdks(cluster: LocalCluster, tmp_path: pathlib.Path) -> None:
    with psclient.Client(cluster.endpoints) as ps:
        ps.create_table(psclient.sparse_table("e", 16, optimizer=psclient.adagrad(0.05), initializer=psclient.normal(0, 0.1, seed=1)))
        ids = np.random.default_rng(2).integers(0, 2**63, 3000, dtype=np.uint64)
        ids[100:200] = ids[:100]  # duplicates
        g = np.random.default_rng(3).standard_normal((3000, 16)).astype(np.float32)
        (tmp_path / "ids").write_bytes(ids.astype("<u8").tobytes())
        (tmp_path / "g").write_bytes(g.astype("<f4").tobytes())
        rust(cluster, "pull-sparse", "e", str(tmp_path / "ids"), str(tmp_path / "init"))
        assert ps.pull_sparse("e", ids).tobytes() == (tmp_path / "init").read_bytes()
        rust(cluster, "push-sparse", "e", str(tmp_path / "ids"), str(tmp_path / "g"))
        ps.push_sparse("e", ids, g)
        rust(cluster, "pull-sparse", "e", str(tmp_path / "ids"), str(tmp_path / "out"))
        assert ps.pull_sparse("e", ids).tobytes() == (tmp_path / "out").read_bytes()


@pytest.mark.parametrize("codec", ["fp16", "bf16", "int8", "topk:0.01", "topk:0.2:f32"])
def test_codecs_with_error_feedback_match_the_rust_sdk(cluster: LocalCluster, tmp_path: pathlib.Path, codec: str) -> None:
    """The same pushes through each SDK's codec and residual, into the same tables of twin
    clusters (same names, so the same routing and the same requests): the tables end
    bit-identical (same encodings, same residuals carried from push to push)."""
    n = 300_000
    with LocalCluster(tmp_path / "twin", 2) as twin:
        rng = np.random.default_rng(11)
        gs = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
        ids = np.arange(500, dtype=np.uint64) * np.uint64(7919)
        row_grads = [rng.standard_normal((500, 64)).astype(np.float32) for _ in range(2)]
        clients = [psclient.Client(c.endpoints, codec=codec) for c in (cluster, twin)]
        for ps in clients:
            ps.create_table(psclient.dense_table("d", [n], optimizer=psclient.sgd(1.0), chunk_elems=65_536))
            ps.create_table(psclient.sparse_table("r", 64, optimizer=psclient.sgd(1.0)))
        py = clients[0]
        for i, g in enumerate(gs):
            py.push_dense("d", g)
            (tmp_path / f"g{i}").write_bytes(g.astype("<f4").tobytes())
        for i, r in enumerate(row_grads):
            py.push_sparse("r", ids, r)
            (tmp_path / f"r{i}").write_bytes(r.astype("<f4").tobytes())
        (tmp_path / "ids").write_bytes(ids.astype("<u8").tobytes())
        # One Rust client pushes the gradients in order (its residual lives in its process).
        rust(twin, "push-dense", "d", *(str(tmp_path / f"g{i}") for i in range(3)), codec=codec)
        rust(twin, "push-sparse", "r", str(tmp_path / "ids"), str(tmp_path / "r0"), str(tmp_path / "r1"), codec=codec)
        assert py.pull_dense("d").tobytes() == clients[1].pull_dense("d").tobytes()
        assert py.pull_sparse("r", ids).tobytes() == clients[1].pull_sparse("r", ids).tobytes()
        for ps in clients:
            ps.close()
