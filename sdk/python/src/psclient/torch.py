"""PyTorch on the parameter servers (needs ``torch``, the package's ``torch`` extra).

- :class:`ParameterServerModule` keeps a module's parameters in dense tables: :meth:`pull`
  before the forward pass copies the shards' values into the parameters, :meth:`push` after
  the backward pass sends the gradients (under the client's codec for each table).
- :class:`EmbeddingBag` is an embedding bag whose rows live in a sparse table: each forward
  pass pulls the rows its ids touch, and :meth:`EmbeddingBag.push` sends their gradients.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from . import tables as tb
from .client import Client, PushSummary
from .errors import InvalidInput
from ._proto.ps.v1 import ps_pb2 as pb


class ParameterServerModule(nn.Module):
    """Wraps ``module``: each parameter named in ``tables`` (``{"0.weight": "job/w0", ...}``;
    default: every parameter, as ``prefix/<name>``) lives in that dense table.

    ``transposed`` names parameters whose table holds the transpose (a ``[in, out]`` table
    behind ``nn.Linear``'s ``[out, in]`` weight: the Rust workers' layout). With ``create``
    (an optimizer), the tables are created in the parameters' shapes with that optimizer and
    ``initializer`` (the shards initialise a table's values, zeros unless set; :meth:`pull`
    brings them in). Without it the tables must exist (a job's, for instance).
    """

    def __init__(
        self,
        module: nn.Module,
        client: Client,
        *,
        prefix: str = "",
        tables: Optional[Mapping[str, str]] = None,
        transposed: Iterable[str] = (),
        create: Optional[pb.Optimizer] = None,
        initializer: Optional[pb.Initializer] = None,
    ) -> None:
        super().__init__()
        self.module = module
        self.client = client
        params = dict(module.named_parameters())
        if tables is None:
            tables = {n: f"{prefix}/{n}" if prefix else n for n in params}
        unknown = set(tables) - set(params)
        if unknown:
            raise InvalidInput(f"the module has no parameters {sorted(unknown)}")
        self.transposed = frozenset(transposed)
        self.tables: Dict[str, str] = dict(tables)
        for name, table in self.tables.items():
            shape = tuple(params[name].shape)
            want = shape[::-1] if name in self.transposed else shape
            if create is not None:
                client.create_table(tb.dense_table(table, list(want), optimizer=create, initializer=initializer))
            spec = client.describe_table(table).spec
            if tuple(spec.dense.shape) != want:
                raise InvalidInput(f"table `{table}` has shape {list(spec.dense.shape)}; parameter `{name}` needs {list(want)}")

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def pull(self) -> None:
        """Copies the shards' current values into the parameters."""
        params = dict(self.module.named_parameters())
        for name, table in self.tables.items():
            p = params[name]
            v = self.client.pull_dense(table)
            t = torch.from_numpy(v)
            t = t.reshape(tuple(p.shape)[::-1]).T if name in self.transposed else t.reshape(p.shape)
            p.copy_(t)

    @torch.no_grad()
    def push(self, scale: float = 1.0) -> List[PushSummary]:
        """Pushes every parameter's gradient times ``scale`` (for instance one over the job's
        global batch, when the loss is summed), then clears the gradients."""
        params = dict(self.module.named_parameters())
        out = []
        for name, table in self.tables.items():
            p = params[name]
            if p.grad is None:
                continue
            g = p.grad.detach()
            if name in self.transposed:
                g = g.T
            g = g.contiguous().cpu().numpy().astype(np.float32, copy=False)
            out.append(self.client.push_dense(table, g * np.float32(scale) if scale != 1.0 else g))
            p.grad = None
        return out


class EmbeddingBag(nn.Module):
    """``nn.EmbeddingBag`` whose rows live in sparse table ``table`` (``dim`` values a row):
    any u64 id is valid, and only the rows a batch touches are pulled."""

    def __init__(self, client: Client, table: str, dim: int, *, mode: str = "sum") -> None:
        super().__init__()
        spec = client.describe_table(table).spec
        if spec.WhichOneof("kind") != "sparse" or spec.sparse.dim != dim:
            raise InvalidInput(f"table `{table}` is not a sparse table of dim {dim}")
        if mode not in ("sum", "mean", "max"):
            raise InvalidInput(f"mode `{mode}`: sum, mean or max")
        self.client, self.table, self.dim, self.mode = client, table, dim, mode
        self._pending: List[Tuple[np.ndarray, torch.Tensor]] = []

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """``ids`` (int64, flat; read as u64) with ``offsets`` (each bag's start), as
        ``nn.EmbeddingBag`` takes them."""
        raw = ids.detach().cpu().numpy().astype(np.int64).view(np.uint64)
        uniq, inverse = np.unique(raw, return_inverse=True)
        rows = torch.from_numpy(self.client.pull_sparse(self.table, uniq))
        rows.requires_grad_(self.training)
        if self.training:
            self._pending.append((uniq, rows))
        return F.embedding_bag(torch.from_numpy(inverse.astype(np.int64)), rows, offsets.cpu(), mode=self.mode)

    @torch.no_grad()
    def push(self, scale: float = 1.0) -> List[PushSummary]:
        """Pushes the gradients of the rows the forward passes since the last push used."""
        out = []
        for uniq, rows in self._pending:
            if rows.grad is not None:
                g = rows.grad.numpy() * np.float32(scale)
                out.append(self.client.push_sparse(self.table, uniq, g))
        self._pending.clear()
        return out
