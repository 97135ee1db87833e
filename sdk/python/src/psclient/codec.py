"""Gradient codecs and payloads, vectorised in numpy: the same encodings as the Rust SDK's
(`ps_codec`), byte for byte (`tests/test_vectors.py` compares them with the Rust encoder's
output at test time).

A codec is named by the same text as everywhere else in the project: ``f32``, ``fp16``,
``bf16``, ``int8[:block]``, ``int4[:block]``, ``sign[:block]``, ``topk:ratio[:f16|f32]``. Lossy
codecs keep what
they drop in a residual that is added to the next gradient (error feedback, :class:`Residual`
and :class:`RowResiduals`; embedding rows pushed in fp16 or bf16 keep none,
:attr:`Codec.keeps_row_residual`).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Dict, Optional, Tuple

import numpy as np
import numpy.typing as npt

from ._proto.ps.v1 import ps_pb2 as pb
from .errors import InvalidInput, ProtocolError

F32Array = npt.NDArray[np.float32]

DEFAULT_BLOCK = 256
MAX_BLOCK = 16_777_216
# Payloads of fewer values go as plain f32: compressing them saves too little to matter.
DEFAULT_MIN_VALUES = 1024
# lz4 goes on top of a codec's bytes when it saves at least this share.
LZ4_MIN_SAVING = 0.10
LZ4_MIN_BYTES = 1024

try:  # lz4 is a dependency; a build without it simply never compresses
    import lz4.block as _lz4
except ImportError:  # pragma: no cover
    _lz4 = None


@dataclasses.dataclass(frozen=True)
class Codec:
    """A push codec: ``kind`` is f32, fp16, bf16, int8, int4, sign or topk."""

    kind: str = "f32"
    block: int = DEFAULT_BLOCK
    ratio: float = 1.0
    sparse_f16: bool = True

    @staticmethod
    def parse(text: str) -> "Codec":
        """Parses the codec's text form; a bad one raises :class:`InvalidInput`."""
        name, *args = text.split(":")
        name = name.lower()
        max_args = {"f32": 0, "fp16": 0, "f16": 0, "bf16": 0, "int8": 1, "int4": 1, "sign": 1, "topk": 2}
        if name not in max_args:
            raise InvalidInput(
                f"unknown codec `{text}`; known here: f32, fp16, bf16, int8[:block], "
                "int4[:block], sign[:block], topk:ratio[:f16|f32]"
            )
        if len(args) > max_args[name]:
            raise InvalidInput(f"too many parameters in `{text}`")
        if name in ("f32", "bf16"):
            return Codec(name)
        if name in ("fp16", "f16"):
            return Codec("fp16")
        if name in ("int8", "int4", "sign"):
            block = _number(args[0], text) if args else DEFAULT_BLOCK
            if not 1 <= block <= MAX_BLOCK:
                raise InvalidInput(f"block {block} is out of range 1..={MAX_BLOCK}")
            return Codec(name, block=block)
        if not args:
            raise InvalidInput(f"`{text}` needs a ratio, as in `topk:0.01`")
        try:
            ratio = float(args[0])
        except ValueError:
            raise InvalidInput(f"`{args[0]}` in `{text}` is not a ratio") from None
        if not 0.0 < ratio <= 1.0:
            raise InvalidInput(f"ratio {ratio} is out of range (0, 1]")
        values = args[1] if len(args) > 1 else "f16"
        if values not in ("f16", "fp16", "f32"):
            raise InvalidInput(f"sparse values are f32 or f16, not `{values}`")
        return Codec("topk", ratio=ratio, sparse_f16=values != "f32")

    def __str__(self) -> str:
        if self.kind in ("int8", "int4", "sign"):
            return f"{self.kind}:{self.block}"
        if self.kind == "topk":
            return f"topk:{self.ratio}" + ("" if self.sparse_f16 else ":f32")
        return self.kind

    @property
    def lossless(self) -> bool:
        return self.kind == "f32"

    @property
    def keeps_row_residual(self) -> bool:
        """Whether a sparse table's pushes keep a residual per row: every lossy codec but fp16
        and bf16, whose rounding loses at most half a unit in the last place while a residual
        per row costs a lookup per row pushed (as the Rust SDK's
        ``CompressOptions::keeps_row_residual``)."""
        return not self.lossless and self.kind not in ("fp16", "bf16")

    def max_bytes_per_value(self) -> float:
        """An upper bound of the bytes per value, for sizing requests."""
        scale = 4.0 / self.block
        if self.kind == "f32":
            return 4.0
        if self.kind in ("fp16", "bf16"):
            return 2.0
        if self.kind == "int8":
            return 1.0 + scale
        if self.kind == "int4":
            return 0.5 + scale
        if self.kind == "sign":
            return 0.125 + scale
        return self.ratio * ((2.0 if self.sparse_f16 else 4.0) + 10.0)


def _number(text: str, whole: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(f"`{text}` in `{whole}` is not a number") from None


def entries(ratio: float, n: int) -> int:
    """The entries top-k keeps of ``n`` values: ceil(ratio * n), at least one."""
    if n == 0:
        return 0
    return min(max(int(np.ceil(ratio * n)), 1), n)


# --- encoders ------------------------------------------------------------------------------


def f32_bytes(values: F32Array) -> bytes:
    return np.ascontiguousarray(values, dtype="<f4").tobytes()


def bf16_bits(values: F32Array) -> npt.NDArray[np.uint16]:
    """bfloat16 bits, rounded to nearest even; a NaN stays a (quiet) NaN."""
    b = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    with np.errstate(over="ignore"):
        rounded = (b + (np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    nan = (b >> np.uint32(16)) | np.uint32(0x40)
    return np.where(np.isnan(values), nan, rounded).astype(np.uint16)


def _block_max_abs(values: F32Array, block: int) -> F32Array:
    """Each block's largest magnitude, NaN where a block holds a NaN or an infinity."""
    n = len(values)
    nb = -(-n // block)
    bits = np.zeros(nb * block, dtype=np.uint32)
    bits[:n] = values.view(np.uint32) & np.uint32(0x7FFFFFFF)
    m = bits.reshape(nb, block).max(axis=1)
    out = m.view(np.float32).copy()
    out[m >= np.uint32(0x7F800000)] = np.nan
    return out


def _block_codes(values: F32Array, block: int, levels: float) -> Tuple[F32Array, npt.NDArray[np.int64]]:
    """Per block of ``block`` values a scale (its largest magnitude / ``levels``), and each value
    as the nearest whole number of its block's scale (ties to even; 0 for NaN and infinities,
    whose block's scale is NaN), as the Rust quantizers compute them."""
    n = len(values)
    scales = (_block_max_abs(values, block) / np.float32(levels)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(scales > 0, np.float32(1.0) / scales, np.float32(0.0)).astype(np.float32)
    per_value = np.repeat(inv, block)[:n]
    with np.errstate(invalid="ignore"):
        x = (values * per_value).astype(np.float32)
    return scales, np.rint(np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)).astype(np.int64)


def _int8(values: F32Array, block: int) -> bytes:
    scales, q = _block_codes(values, block, 127.0)
    return scales.astype("<f4").tobytes() + (q & 0xFF).astype(np.uint8).tobytes()


def _int4(values: F32Array, block: int) -> bytes:
    """Two 4-bit two's-complement codes a byte (value i in the low half of byte i // 2 when i is
    even), after a scale of max abs / 7 per block."""
    scales, q = _block_codes(values, block, 7.0)
    codes = (q & 0xF).astype(np.uint8)
    if len(codes) % 2:
        codes = np.append(codes, np.uint8(0))
    return scales.astype("<f4").tobytes() + (codes[0::2] | (codes[1::2] << np.uint8(4))).tobytes()


def _sign(values: F32Array, block: int) -> bytes:
    n = len(values)
    nb = -(-n // block)
    padded = np.zeros(nb * block, dtype=np.float64)
    padded[:n] = np.abs(values)
    counts = np.full(nb, block, dtype=np.float64)
    counts[-1] = n - (nb - 1) * block
    blocks = padded.reshape(nb, block)
    scales = (blocks.sum(axis=1) / counts).astype(np.float32)
    scales[~np.isfinite(blocks).all(axis=1)] = np.nan
    bits = np.packbits(np.signbit(values), bitorder="little")
    return scales.astype("<f4").tobytes() + bits.tobytes()


def top_k_entries(values: F32Array, k: int) -> Tuple[npt.NDArray[np.int64], F32Array]:
    """The ``k`` values of largest magnitude, indices ascending; ties at the k-th magnitude go
    to the lowest indices, and NaNs count as the largest (as the Rust encoder does)."""
    n = len(values)
    if k >= n:
        return np.arange(n, dtype=np.int64), values.copy()
    keys = values.view(np.uint32) & np.uint32(0x7FFFFFFF)
    kth = np.partition(keys, n - k)[n - k]
    above = keys > kth
    ties = np.flatnonzero(keys == kth)[: k - int(above.sum())]
    keep = above
    keep[ties] = True
    idx = np.flatnonzero(keep)
    return idx, values[idx]


def _varints(indices: npt.NDArray[np.int64]) -> bytes:
    """LEB128 varints: the first index, then each gap minus one."""
    if len(indices) == 0:
        return b""
    gaps = np.empty(len(indices), dtype=np.uint64)
    gaps[0] = indices[0]
    gaps[1:] = np.diff(indices) - 1
    out = bytearray()
    small = gaps < 128
    if small.all():
        return gaps.astype(np.uint8).tobytes()
    for g in gaps.tolist():
        while True:
            b = g & 0x7F
            g >>= 7
            if g:
                out.append(b | 0x80)
            else:
                out.append(b)
                break
    return bytes(out)


def _read_varints(data: bytes, k: int, n: int) -> npt.NDArray[np.int64]:
    out = np.empty(k, dtype=np.int64)
    pos, nxt = 0, 0
    for e in range(k):
        gap, shift = 0, 0
        while True:
            if pos >= len(data) or shift > 63:
                raise ProtocolError(f"entry {e}: the index varint is malformed")
            b = data[pos]
            pos += 1
            gap |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        i = nxt + gap
        if i >= n:
            raise ProtocolError(f"entry {e}: index {i} is out of range ({n} values)")
        out[e] = i
        nxt = i + 1
    if pos != len(data):
        raise ProtocolError(f"{len(data) - pos} bytes follow the last of the {k} indices")
    return out


def encode(values: F32Array, codec: Codec, *, min_values: int = DEFAULT_MIN_VALUES, lz4: bool = True) -> "pb.Payload":
    """Encodes ``values`` (f32) as a payload under ``codec``: plain f32 below ``min_values``
    values, lz4 on top where it saves at least 10%."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    n = len(values)
    p = pb.Payload(num_values=n)
    kind = codec.kind if n >= min_values else "f32"
    if kind == "f32":
        p.encoding = pb.ENCODING_F32
        raw = f32_bytes(values)
    elif kind == "fp16":
        p.encoding = pb.ENCODING_F16
        with np.errstate(over="ignore"):
            raw = values.astype("<f2").tobytes()
    elif kind == "bf16":
        p.encoding = pb.ENCODING_BF16
        raw = bf16_bits(values).astype("<u2").tobytes()
    elif kind == "int8":
        p.encoding, p.block_size = pb.ENCODING_INT8, codec.block
        raw = _int8(values, codec.block)
    elif kind == "int4":
        p.encoding, p.block_size = pb.ENCODING_INT4, codec.block
        raw = _int4(values, codec.block)
    elif kind == "sign":
        p.encoding, p.block_size = pb.ENCODING_SIGN, codec.block
        raw = _sign(values, codec.block)
    else:
        idx, picked = top_k_entries(values, entries(codec.ratio, n))
        p.num_entries = len(idx)
        if codec.sparse_f16:
            p.encoding = pb.ENCODING_SPARSE_F16
            with np.errstate(over="ignore"):
                vals = picked.astype("<f2").tobytes()
        else:
            p.encoding = pb.ENCODING_SPARSE_F32
            vals = f32_bytes(picked)
        raw = vals + _varints(idx)
    p.raw_len = len(raw)
    p.data = _maybe_lz4(raw, p) if lz4 else raw
    return p


def _maybe_lz4(raw: bytes, p: "pb.Payload") -> bytes:
    if _lz4 is None or len(raw) < LZ4_MIN_BYTES:
        return raw
    sample = raw[: 1 << 16]
    if len(sample) < len(raw) and len(_lz4.compress(sample, store_size=False)) > len(sample) * (1 - LZ4_MIN_SAVING):
        return raw
    packed = _lz4.compress(raw, store_size=False)
    if len(packed) <= len(raw) * (1 - LZ4_MIN_SAVING):
        p.compression = pb.COMPRESSION_LZ4
        return packed
    return raw


# --- decoders ------------------------------------------------------------------------------


def raw_bytes(p: "pb.Payload", limit: int) -> bytes:
    if p.compression == pb.COMPRESSION_NONE:
        return p.data
    if p.compression != pb.COMPRESSION_LZ4 or _lz4 is None:
        raise ProtocolError(f"payload compression {p.compression} is not supported here")
    if p.raw_len > limit:
        raise ProtocolError(f"an lz4 payload claims {p.raw_len} bytes, more than {limit}")
    try:
        return _lz4.decompress(p.data, uncompressed_size=p.raw_len)
    except Exception as e:  # lz4's own error type
        raise ProtocolError(f"lz4 payload does not decompress: {e}") from None


def decode(p: "pb.Payload", out: Optional[F32Array] = None) -> F32Array:
    """Decodes a payload into f32 values (into ``out`` when given, which must hold exactly
    ``num_values``)."""
    n = p.num_values
    if out is None:
        out = np.empty(n, dtype=np.float32)
    elif len(out) != n:
        raise ProtocolError(f"a payload of {n} values answered for a place of {len(out)}")
    raw = raw_bytes(p, 16 * n + 64)
    enc = p.encoding
    if enc in (pb.ENCODING_F32, pb.ENCODING_UNSPECIFIED):
        _expect(raw, 4 * n, "f32")
        out[:] = np.frombuffer(raw, dtype="<f4")
    elif enc == pb.ENCODING_F16:
        _expect(raw, 2 * n, "f16")
        out[:] = np.frombuffer(raw, dtype="<f2")
    elif enc == pb.ENCODING_BF16:
        _expect(raw, 2 * n, "bf16")
        out[:] = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    elif enc == pb.ENCODING_INT8:
        block = max(p.block_size, 1)
        nb = -(-n // block)
        _expect(raw, 4 * nb + n, "int8")
        scales = np.frombuffer(raw[: 4 * nb], dtype="<f4")
        q = np.frombuffer(raw[4 * nb :], dtype=np.int8).astype(np.float32)
        out[:] = q * np.repeat(scales, block)[:n]
    elif enc == pb.ENCODING_INT4:
        block = max(p.block_size, 1)
        nb = -(-n // block)
        _expect(raw, 4 * nb + -(-n // 2), "int4")
        scales = np.frombuffer(raw[: 4 * nb], dtype="<f4")
        packed = np.frombuffer(raw[4 * nb :], dtype=np.uint8)
        nibbles = np.empty(2 * len(packed), dtype=np.uint8)
        nibbles[0::2], nibbles[1::2] = packed & 0xF, packed >> 4
        if n % 2 and nibbles[-1] != 0:
            raise ProtocolError("int4 payload: the padding bits of the last byte are not zero")
        if (nibbles == 8).any():
            raise ProtocolError("int4 payload: the code -8 is never written")
        codes = nibbles[:n].astype(np.int8)
        codes[codes > 7] -= 16
        out[:] = codes.astype(np.float32) * np.repeat(scales, block)[:n]
    elif enc == pb.ENCODING_SIGN:
        block = max(p.block_size, 1)
        nb = -(-n // block)
        _expect(raw, 4 * nb + -(-n // 8), "sign")
        scales = np.frombuffer(raw[: 4 * nb], dtype="<f4")
        negative = np.unpackbits(np.frombuffer(raw[4 * nb :], dtype=np.uint8), bitorder="little")[:n].astype(bool)
        mag = np.repeat(scales, block)[:n]
        out[:] = np.where(negative, -mag, mag)
    elif enc in (pb.ENCODING_SPARSE_F16, pb.ENCODING_SPARSE_F32):
        values, idx = _sparse_entries(p, raw)
        out[:] = 0
        out[idx] = np.frombuffer(values, dtype="<f2" if enc == pb.ENCODING_SPARSE_F16 else "<f4")
    else:
        raise ProtocolError(f"payload encoding {enc} is not supported here")
    return out


def rows_carried(p: "pb.Payload", dim: int) -> Optional[Tuple[npt.NDArray[np.int64], "pb.Payload"]]:
    """For a sparse payload (top-k) over rows of ``dim`` values: the rows holding at least one
    entry, ascending, and the same entries re-indexed over those rows alone (the values' bytes
    unchanged, uncompressed); ``None`` for a dense encoding, which carries every row. A sparse
    push sends only these rows and their ids."""
    if p.encoding not in (pb.ENCODING_SPARSE_F16, pb.ENCODING_SPARSE_F32):
        return None
    n, k = p.num_values, p.num_entries
    if dim <= 0 or n % dim:
        raise ProtocolError(f"{n} values are not rows of {dim}")
    values, idx = _sparse_entries(p, raw_bytes(p, 16 * n + 64))
    rows, rank = np.unique(idx // dim, return_inverse=True)
    data = values + _varints(rank.astype(np.int64) * dim + idx % dim)
    q = pb.Payload(num_values=len(rows) * dim, encoding=p.encoding, num_entries=k, raw_len=len(data), data=data)
    return rows.astype(np.int64), q


def _sparse_entries(p: "pb.Payload", raw: bytes) -> Tuple[bytes, npt.NDArray[np.int64]]:
    """A sparse payload's entries (``raw``, its uncompressed data): the values' bytes and their
    positions, checked against the payload's ``num_values`` and ``num_entries``."""
    n, k = p.num_values, p.num_entries
    vb = 2 if p.encoding == pb.ENCODING_SPARSE_F16 else 4
    if k > n or vb * k > len(raw):
        raise ProtocolError(f"a sparse payload of {k} entries does not fit its data")
    return raw[: vb * k], _read_varints(raw[vb * k :], k, n)


def _expect(raw: bytes, want: int, what: str) -> None:
    if len(raw) != want:
        raise ProtocolError(f"an {what} payload of {len(raw)} bytes where {want} were expected")


# --- error feedback ------------------------------------------------------------------------


class Residual:
    """What a dense tensor's pushes still owe: lossy codecs send part of it and keep the rest
    for the next push."""

    def __init__(self, length: int) -> None:
        self.values = np.zeros(length, dtype=np.float32)

    def take(self, start: int, stop: int, codec: Codec, *, min_values: int, lz4: bool) -> "pb.Payload":
        acc = self.values[start:stop]
        p = encode(acc, codec, min_values=min_values, lz4=lz4)
        if p.encoding == pb.ENCODING_F32:
            acc[:] = 0
        else:
            acc -= decode(p)
        return p

    def restore(self, start: int, p: "pb.Payload") -> None:
        """Gives back what a push sent when it was certainly not applied."""
        self.values[start : start + p.num_values] += decode(p)


class RowResiduals:
    """Error feedback for embedding rows: one residual per id; rows owing nothing take no
    memory. At most ``max_rows`` rows hold one: past it, the row pushed least recently gives
    its residual up (lost; counted in ``evicted``) for a new row's, never for a row of the same
    push (a push of more rows than that keeps the residuals of those it finds room for)."""

    def __init__(self, dim: int, max_rows: Optional[int] = None) -> None:
        self.dim = dim
        self.max_rows = max(1, max_rows) if max_rows is not None else None
        self.evicted = 0
        # In the order the rows were last pushed: the first is the least recently pushed (an
        # OrderedDict finds it in O(1) however many rows were dropped before it).
        self.rows: "collections.OrderedDict[int, F32Array]" = collections.OrderedDict()

    @staticmethod
    def rows_in(nbytes: int, dim: int) -> int:
        """How many rows of ``dim`` values fit in ``nbytes`` (the Rust SDK's measure: values,
        id, state and map entry)."""
        return nbytes // (dim * 4 + 8 + 1 + 24)

    def compress(self, ids: npt.NDArray[np.uint64], grads: F32Array, codec: Codec, *, min_values: int, lz4: bool) -> "pb.Payload":
        acc = np.array(grads, dtype=np.float32).reshape(len(ids), self.dim)
        for p_, id_ in enumerate(ids.tolist()):
            r = self.rows.pop(id_, None)
            if r is not None:
                acc[p_] += r
        p = encode(acc.reshape(-1), codec, min_values=min_values, lz4=lz4)
        if p.encoding != pb.ENCODING_F32:
            acc -= decode(p).reshape(acc.shape)
            self._add(ids, acc)
        return p

    def restore(self, ids: npt.NDArray[np.uint64], p: "pb.Payload") -> None:
        self._add(ids, decode(p).reshape(len(ids), self.dim))

    def _add(self, ids: npt.NDArray[np.uint64], rows: F32Array) -> None:
        this_push = set(ids.tolist())
        for id_, row in zip(ids.tolist(), rows):
            r = self.rows.pop(id_, None)
            r = row.copy() if r is None else r + row
            if not np.any(r != 0):
                continue
            if self.max_rows is not None and len(self.rows) >= self.max_rows:
                oldest = next(iter(self.rows))
                self.evicted += 1
                if oldest in this_push:
                    continue  # every row held is this push's: this one keeps nothing
                del self.rows[oldest]
            self.rows[id_] = r
