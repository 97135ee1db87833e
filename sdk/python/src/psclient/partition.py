"""The partitioner: which shard owns a sparse id or a dense chunk.

The same functions as the shards' and the Rust SDK's (`ps_core::hash`, `ps_core::Partitioner`),
vectorised over numpy arrays of ids. They are part of the wire contract: the shards refuse a
request that reaches the wrong owner. `tests/test_vectors.py` checks them against values the
Rust code computes at test time, so the two can never drift apart.

- A table's hash is FNV-1a (64-bit) of its name's UTF-8 bytes.
- Sparse ids go on a consistent-hash ring: shard ``s`` has ``virtual_nodes`` points
  ``combine(s, v)``; id ``i`` of table ``t`` belongs to the first point at or after
  ``mix64(i ^ hash(t))``, wrapping past the last.
- Dense chunk ``c`` of table ``t`` belongs to shard ``(hash(t) % n + c % n) % n``.
"""
from __future__ import annotations

from typing import Union

import numpy as np
import numpy.typing as npt

U64 = np.uint64
_MASK64 = (1 << 64) - 1

IdArray = npt.NDArray[np.uint64]


def fnv1a(data: bytes) -> int:
    """FNV-1a over bytes, 64-bit."""
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & _MASK64
    return h


def table_hash(name: str) -> int:
    """The stable hash of a table's name, which seeds routing and initial values."""
    return fnv1a(name.encode("utf-8"))


def mix64(z: Union[int, npt.ArrayLike]) -> Union[int, IdArray]:
    """The SplitMix64 finalizer: a bijection on u64 (an int in, an int out; an array in, a
    uint64 array out)."""
    if isinstance(z, int):
        z &= _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)
    a = np.asarray(z, dtype=U64)
    with np.errstate(over="ignore"):
        a = (a ^ (a >> U64(30))) * U64(0xBF58476D1CE4E5B9)
        a = (a ^ (a >> U64(27))) * U64(0x94D049BB133111EB)
        return a ^ (a >> U64(31))


def combine(a: int, b: int) -> int:
    """Combines two hashes (order matters)."""
    m = mix64(b)
    assert isinstance(m, int)
    rot = ((m << 17) | (m >> 47)) & _MASK64
    r = mix64(a ^ rot)
    assert isinstance(r, int)
    return r


class Partitioner:
    """Routes keys to shards; built from the shards' count and virtual nodes (ShardInfo)."""

    def __init__(self, num_shards: int, virtual_nodes: int) -> None:
        self.num_shards = max(int(num_shards), 1)
        self.virtual_nodes = max(int(virtual_nodes), 1)
        ring = sorted(
            (combine(s, v), s) for s in range(self.num_shards) for v in range(self.virtual_nodes)
        )
        self._points = np.array([p for p, _ in ring], dtype=U64)
        self._owners = np.array([s for _, s in ring], dtype=np.int64)

    def shards_for_ids(self, table_hash_: int, ids: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The owning shard of each id of the table whose name hashes to ``table_hash_``."""
        ids = np.asarray(ids, dtype=U64)
        if self.num_shards == 1:
            return np.zeros(ids.shape, dtype=np.int64)
        points = mix64(ids ^ U64(table_hash_))
        i = np.searchsorted(self._points, points, side="left")
        i[i == len(self._points)] = 0
        return self._owners[i]

    def shard_for_id(self, table_hash_: int, id_: int) -> int:
        return int(self.shards_for_ids(table_hash_, np.array([id_], dtype=U64))[0])

    def shard_for_chunk(self, table_hash_: int, chunk: int) -> int:
        n = self.num_shards
        return ((table_hash_ % n) + (chunk % n)) % n
