"""psclient.torch against real shards (where torch is installed; skipped elsewhere)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import psclient  # noqa: E402
from psclient.torch import EmbeddingBag, ParameterServerModule  # noqa: E402

from conftest import LocalCluster  # noqa: E402


def test_module_parameters_live_on_the_shards(cluster: LocalCluster) -> None:
    with psclient.Client(cluster.endpoints) as ps:
        lin = torch.nn.Linear(4, 3)
        m = ParameterServerModule(lin, ps, prefix="m", create=psclient.sgd(1.0), initializer=psclient.normal(0, 1, seed=5))
        assert set(m.tables.values()) == {"m/weight", "m/bias"}
        m.pull()
        assert np.array_equal(lin.weight.detach().numpy().reshape(-1), ps.pull_dense("m/weight"))
        before = {n: p.detach().clone() for n, p in lin.named_parameters()}
        x = torch.randn(8, 4)
        m(x).pow(2).sum().backward()
        grads = {n: p.grad.detach().clone() for n, p in lin.named_parameters()}
        m.push(scale=0.5)
        assert all(p.grad is None for p in lin.parameters())
        m.pull()
        for n, p in lin.named_parameters():
            assert torch.allclose(p.detach(), before[n] - 0.5 * grads[n], atol=1e-6), n
        # A transposed layout ([in, out] tables behind [out, in] weights), as Rust workers keep.
        ps.create_table(psclient.dense_table("t/w", [4, 3], initializer=psclient.normal(0, 1, seed=6)))
        ps.create_table(psclient.dense_table("t/b", [3]))
        lin2 = torch.nn.Linear(4, 3)
        m2 = ParameterServerModule(lin2, ps, tables={"weight": "t/w", "bias": "t/b"}, transposed=["weight"])
        m2.pull()
        assert np.array_equal(lin2.weight.detach().numpy().T.reshape(-1), ps.pull_dense("t/w"))
        with pytest.raises(ValueError):
            ParameterServerModule(lin2, ps, tables={"weight": "t/w", "bias": "t/b"})  # shape mismatch


def test_embedding_bag_pulls_and_pushes_only_the_rows_used(cluster: LocalCluster) -> None:
    with psclient.Client(cluster.endpoints) as ps:
        ps.create_table(psclient.sparse_table("e", 4, optimizer=psclient.sgd(1.0), initializer=psclient.normal(0, 1, seed=1)))
        bag = EmbeddingBag(ps, "e", 4, mode="sum")
        ids = torch.tensor([1, 2**40, 1, 7], dtype=torch.int64)
        offsets = torch.tensor([0, 2])
        rows = ps.pull_sparse("e", np.array([1, 2**40, 7], dtype=np.uint64))
        out = bag(ids, offsets)
        assert torch.allclose(out[0], torch.from_numpy(rows[0] + rows[1]))
        assert torch.allclose(out[1], torch.from_numpy(rows[0] + rows[2]))
        out.sum().backward()
        bag.push()
        after = ps.pull_sparse("e", np.array([1, 2**40, 7], dtype=np.uint64))
        # Id 1 is in both bags: gradient 2 per value; the others 1.
        assert np.allclose(after, rows - np.array([[2.0], [1.0], [1.0]], dtype=np.float32), atol=1e-6)
        stats = sum(t.rows for st in ps.stats() for t in st.tables if t.name == "e")
        assert stats == 3
