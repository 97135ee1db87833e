"""The Python client of the parameter-server cluster: :class:`Client`.

It behaves as the Rust SDK's ``PsClient`` does. It connects to every shard (from a list or
from the scheduler's shard map) and checks that the list matches the cluster. It routes with
the partitioner the shards enforce. Requests fan out to the shards concurrently, in bounded
sizes. Every push carries this client's id and a sequence number that all its retries reuse,
so a shard applies it exactly once.
"""
from __future__ import annotations

import dataclasses
import functools
import random
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc
import numpy as np
import numpy.typing as npt

from . import codec as cd
from ._proto.ps.v1 import ps_pb2 as pb
from ._proto.ps.v1 import ps_pb2_grpc as pb_grpc
from ._proto.ps.v1 import scheduler_pb2 as spb
from ._proto.ps.v1 import scheduler_pb2_grpc as spb_grpc
from .bulk import PULL_DENSE, PUSH_DENSE, PUSH_PULL_DENSE, BulkPool, host_port
from .errors import (
    RETRY_REASONS,
    InvalidInput,
    ProtocolError,
    PsError,
    ServiceError,
    TopologyError,
    from_rpc_error,
    retry_unreachable,
)
from .partition import Partitioner, table_hash

T = TypeVar("T")
ArrayLike = npt.ArrayLike
F32Array = npt.NDArray[np.float32]

# Most bytes a gRPC message may take, each way (the shards' own limit is lower: ShardInfo).
MAX_MESSAGE = 1 << 30
_PULL_ENCODINGS = {
    "f32": pb.ENCODING_F32,
    "fp16": pb.ENCODING_F16,
    "f16": pb.ENCODING_F16,
    "bf16": pb.ENCODING_BF16,
    "int8": pb.ENCODING_INT8,
    "int4": pb.ENCODING_INT4,
}


@dataclasses.dataclass(frozen=True)
class Tls:
    """TLS for every connection: the CA the servers' certificates must chain to (PEM file),
    and for mutual TLS this client's certificate and key."""

    ca: str
    cert: Optional[str] = None
    key: Optional[str] = None

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        read = lambda p: open(p, "rb").read() if p else None  # noqa: E731
        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca)
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    endpoint: str
    shard_index: int
    num_shards: int
    virtual_nodes: int
    durable: bool
    max_request_bytes: int
    server_version: str
    bulk_port: int
    cache_budget_bytes: int


@dataclasses.dataclass
class PushSummary:
    """What the shards said of one push, summed over its requests."""

    requests: int = 0
    duplicates: int = 0
    applied_values: int = 0
    skipped_non_finite: int = 0
    wire_bytes: int = 0
    raw_bytes: int = 0
    # Rows (ids) a sparse push sent: a sparse codec's push leaves out the rows it has no entry
    # for. 0 for dense pushes.
    rows: int = 0

    def _add(self, r: pb.PushResponse, payload_bytes: int, values: int) -> None:
        self.requests += 1
        self.duplicates += int(r.duplicate)
        self.applied_values += r.applied_values
        self.skipped_non_finite += r.skipped_non_finite
        self.wire_bytes += payload_bytes
        self.raw_bytes += 4 * values


class _Seqs:
    """Sequence numbers: each push takes the next and keeps it for all its retries; the
    oldest one still in flight is the floor the client promises never to retry below."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self._in_flight: set[int] = set()

    def begin(self) -> Tuple[int, int]:
        with self._lock:
            self._next += 1
            self._in_flight.add(self._next)
            return self._next, min(self._in_flight)

    def end(self, seq: int) -> None:
        with self._lock:
            self._in_flight.discard(seq)


@dataclasses.dataclass
class _TableState:
    spec: pb.TableSpec
    codec: cd.Codec
    pull: str
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    residual: Optional[cd.Residual] = None
    rows: Optional[cd.RowResiduals] = None
    # Delta pulls: this client's replica of the table and the shard's version of each chunk.
    replica: Optional[F32Array] = None
    versions: Dict[int, int] = dataclasses.field(default_factory=dict)
    replica_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def hash(self) -> int:
        """The hash the ring places the table by: its own name's, or for a sparse table placed
        with another (``SparseSpec.placed_with``), that name's."""
        if self.spec.WhichOneof("kind") == "sparse" and self.spec.sparse.placed_with:
            return table_hash(self.spec.sparse.placed_with)
        return table_hash(self.spec.name)

    def dense(self) -> Tuple[int, int, int]:
        """(values, chunk_elems, chunks) of a dense table."""
        if self.spec.WhichOneof("kind") != "dense":
            raise InvalidInput(f"table `{self.spec.name}` is sparse, not dense")
        n = int(np.prod(self.spec.dense.shape, dtype=np.uint64)) if len(self.spec.dense.shape) else 1
        ce = self.spec.dense.chunk_elems or 262_144
        return n, ce, -(-n // ce)

    def dim(self) -> int:
        if self.spec.WhichOneof("kind") != "sparse":
            raise InvalidInput(f"table `{self.spec.name}` is dense, not sparse")
        return int(self.spec.sparse.dim)


class _Shard:
    def __init__(self, client: "Client", index: int, endpoint: str) -> None:
        self.index, self.endpoint = index, endpoint
        target = endpoint.split("://", 1)[-1].rstrip("/")
        opts = [
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.keepalive_time_ms", 10_000),
        ]
        if client._tls is not None:
            self.channel = grpc.secure_channel(target, client._tls.grpc_credentials(), options=opts)
        else:
            self.channel = grpc.insecure_channel(target, options=opts)
        self.stub = pb_grpc.ParameterServerStub(self.channel)
        self.bulk: Optional[BulkPool] = None

    def close(self) -> None:
        if self.bulk is not None:
            self.bulk.close()
        self.channel.close()


class Client:
    """A connection to every shard of a cluster; safe to share between threads.

    Give the shards' endpoints in shard-index order (``["http://127.0.0.1:7070", ...]``), or
    the scheduler's (``scheduler="http://127.0.0.1:7000"``): the client then routes with the
    scheduler's shard map and fetches it again when a shard says the map changed.

    ``codec`` is how pushes travel unless :meth:`set_table_codec` says otherwise (``f32``,
    ``fp16``, ``bf16``, ``int8``, ``int4``, ``topk:0.01``: lossy codecs keep what they drop for the next
    push); ``pull_codec`` how pulls come (``f32``, ``fp16``, ``bf16``, ``int8``, ``int4``, and for dense
    tables ``delta-topk:R``).
    """

    def __init__(
        self,
        endpoints: Optional[Sequence[str]] = None,
        *,
        scheduler: Optional[str] = None,
        client_id: Optional[int] = None,
        token: Optional[str] = None,
        tls: Optional[Tls] = None,
        codec: str = "f32",
        pull_codec: str = "f32",
        max_request_bytes: int = 4 << 20,
        max_in_flight: int = 16,
        max_attempts: int = 10,
        initial_backoff: float = 0.05,
        max_backoff: float = 2.0,
        connect_timeout: float = 5.0,
        timeout: Optional[float] = None,
        bulk: bool = True,
        min_values: int = cd.DEFAULT_MIN_VALUES,
        lz4: bool = True,
        row_residual_mib: int = 256,
    ) -> None:
        if (endpoints is None) == (scheduler is None):
            raise InvalidInput("give the shards' endpoints or the scheduler's, not both or neither")
        self._codec = cd.Codec.parse(codec)
        self._pull = _check_pull(pull_codec)
        self._tls = tls
        self._metadata: List[Tuple[str, str]] = [("authorization", f"Bearer {token}")] if token else []
        self._token = token
        self.client_id = client_id if client_id is not None else random.getrandbits(64) or 1
        self.max_request_bytes = max_request_bytes
        self.max_in_flight = max(1, max_in_flight)
        self.max_attempts = max(1, max_attempts)
        self.initial_backoff, self.max_backoff = initial_backoff, max_backoff
        self.connect_timeout, self.timeout = connect_timeout, timeout
        self.min_values, self.lz4 = min_values, lz4
        self.row_residual_bytes = max(1, row_residual_mib) << 20
        self._use_bulk = bulk
        self._seqs = _Seqs()
        self._tables: Dict[str, _TableState] = {}
        self._tables_lock = threading.Lock()
        self._map_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=self.max_in_flight, thread_name_prefix="psclient")
        self._scheduler_endpoint = scheduler
        self._scheduler: Optional[spb_grpc.SchedulerStub] = None
        self._scheduler_channel: Optional[grpc.Channel] = None
        self.map_epoch = 0
        self._shards: List[_Shard] = []
        if scheduler is not None:
            target = scheduler.split("://", 1)[-1].rstrip("/")
            self._scheduler_channel = (
                grpc.secure_channel(target, tls.grpc_credentials()) if tls else grpc.insecure_channel(target)
            )
            self._scheduler = spb_grpc.SchedulerStub(self._scheduler_channel)
            epoch, endpoints = self._fetch_map()
            self.map_epoch = epoch
        assert endpoints is not None
        if not endpoints:
            raise InvalidInput("no shard endpoints given")
        self._connect(list(endpoints))

    # --- connection and routing -----------------------------------------------------------

    def _connect(self, endpoints: List[str]) -> None:
        shards = [_Shard(self, i, ep) for i, ep in enumerate(endpoints)]
        old, self._shards = self._shards, shards
        for s in old:
            s.close()
        # Asked in this thread, not the pool's: a reconnect runs while pool threads wait for
        # the map lock.
        infos = [self._shard_info(s) for s in shards]
        n = len(endpoints)
        for i, (ep, info) in enumerate(zip(endpoints, infos)):
            if info.shard_index != i or info.num_shards != n:
                raise TopologyError(
                    f"{ep} is shard {info.shard_index} of {info.num_shards}, but it is listed as "
                    f"shard {i} of {n}; list the shards in index order, all of them"
                )
            if info.virtual_nodes != infos[0].virtual_nodes:
                raise TopologyError(f"{ep} uses {info.virtual_nodes} virtual nodes but shard 0 uses {infos[0].virtual_nodes}")
        self.shards = [
            ShardInfo(
                endpoint=ep,
                shard_index=i.shard_index,
                num_shards=i.num_shards,
                virtual_nodes=i.virtual_nodes,
                durable=i.durable,
                max_request_bytes=i.max_request_bytes,
                server_version=i.server_version,
                bulk_port=i.bulk_port,
                cache_budget_bytes=i.cache_budget_bytes,
            )
            for ep, i in zip(endpoints, infos)
        ]
        self.partitioner = Partitioner(n, infos[0].virtual_nodes)
        limit = min(i.max_request_bytes for i in infos)
        self.max_request_bytes = max(min(self.max_request_bytes, limit - (64 << 10)), 4096)
        ctx = self._tls.ssl_context() if self._tls else None
        for shard, si in zip(shards, self.shards):
            if self._use_bulk and si.bulk_port:
                host, _ = host_port(si.endpoint)
                shard.bulk = BulkPool(
                    host,
                    si.bulk_port,
                    tls=ctx,
                    connect_timeout=self.connect_timeout,
                    timeout=self.timeout,
                    endpoint=si.endpoint,
                    shard=si.shard_index,
                )

    def _shard_info(self, s: _Shard) -> pb.ShardInfoResponse:
        """A shard's ShardInfo, retried while it cannot be reached (within the attempts)."""
        return retry_unreachable(
            lambda: s.stub.ShardInfo(pb.ShardInfoRequest(), metadata=self._metadata, timeout=self.timeout or self.connect_timeout),
            endpoint=s.endpoint,
            shard=s.index,
            attempts=self.max_attempts,
            backoff=self.initial_backoff,
            max_backoff=self.max_backoff,
        )

    def _opts(self) -> Dict[str, Any]:
        return {"metadata": self._metadata, "timeout": self.timeout}

    def _fetch_map(self) -> Tuple[int, List[str]]:
        """The scheduler's shard map, once every shard is registered (waits up to the
        connect timeout for that)."""
        assert self._scheduler is not None
        deadline = time.monotonic() + max(self.connect_timeout, 1.0)
        while True:
            try:
                m = self._scheduler.GetShardMap(spb.GetShardMapRequest(), **self._opts())
            except grpc.RpcError as e:
                err = from_rpc_error(e, endpoint=self._scheduler_endpoint or "")
                if err.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise err from None
            else:
                if m.complete and all(m.endpoints):
                    return m.epoch, list(m.endpoints)
                if time.monotonic() > deadline:
                    missing = sum(1 for e in m.endpoints if not e)
                    raise TopologyError(
                        f"the scheduler's map (epoch {m.epoch}) lacks {missing} of {m.num_shards} shards"
                    )
            time.sleep(0.1)

    def _refresh_map(self, seen_epoch: int) -> None:
        """Fetches the map again after a shard refused epoch ``seen_epoch``; reconnects when
        the shards moved."""
        if self._scheduler is None:
            return
        with self._map_lock:
            if self.map_epoch != seen_epoch:
                return  # another thread already did
            epoch, endpoints = self._fetch_map()
            if endpoints != [s.endpoint for s in self._shards]:
                self._connect(endpoints)
            self.map_epoch = epoch

    def _call(self, shard: int, fn: Callable[[_Shard, int], T]) -> T:
        """Calls ``fn(shard, map_epoch)`` with retries: a shard that cannot be reached or asks
        to be retried is asked again after a backoff; a stale map is fetched again first."""
        backoff = self.initial_backoff
        for attempt in range(self.max_attempts):
            epoch = self.map_epoch
            s = self._shards[shard]
            try:
                return fn(s, epoch)
            except grpc.RpcError as e:
                err: ServiceError = from_rpc_error(e, endpoint=s.endpoint, shard=shard)
            except ServiceError as e:  # the bulk stream's
                err = e
            stale = err.reason == "STALE_MAP"
            transient = err.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED) or (
                err.reason in RETRY_REASONS
            )
            if not (stale or transient) or attempt + 1 == self.max_attempts:
                raise err
            if not stale:
                time.sleep(backoff * (0.5 + random.random() / 2))
                backoff = min(backoff * 2, self.max_backoff)
            try:
                self._refresh_map(epoch)
            except PsError:
                pass  # the scheduler is down too: retry with the map at hand
        raise AssertionError("unreachable")

    def _fan(self, calls: Sequence[Callable[[], T]]) -> List[Union[T, BaseException]]:
        """Runs the calls concurrently (at most ``max_in_flight`` at once) and returns each
        one's result or exception, in order: every call ends before this returns."""
        if len(calls) == 1:
            try:
                return [calls[0]()]
            except PsError as e:
                return [e]
        futures = [self._pool.submit(c) for c in calls]
        out: List[Union[T, BaseException]] = []
        for f in futures:
            exc = f.exception()
            out.append(exc if exc is not None else f.result())
        return out

    def _all(self, fn: Callable[[_Shard, int], T]) -> List[T]:
        """``fn`` on every shard; the first error is raised after all of them answered."""
        results = self._fan([functools.partial(self._call, i, fn) for i in range(len(self._shards))])
        return _first_error(results)

    # --- tables ---------------------------------------------------------------------------

    def create_table(self, spec: pb.TableSpec) -> pb.TableSpec:
        """Creates a table on every shard (idempotent: the same spec again is fine; another
        spec under the same name raises :class:`~psclient.errors.AlreadyExists`). Returns the
        spec as stored, defaults filled in."""
        answers = self._all(lambda s, e: s.stub.CreateTable(pb.CreateTableRequest(spec=spec), **self._opts()))
        stored = answers[0].spec
        with self._tables_lock:
            # A table made again under another spec (after a drop elsewhere) starts afresh; the
            # same spec keeps this client's codecs and residuals for it.
            st = self._tables.get(stored.name)
            if st is not None and st.spec != stored:
                del self._tables[stored.name]
        return stored

    def describe_table(self, name: str) -> pb.DescribeTableResponse:
        """The table's spec and shard 0's stats of it."""
        return self._call(0, lambda s, e: s.stub.DescribeTable(pb.DescribeTableRequest(name=name), **self._opts()))

    def list_tables(self) -> List[pb.TableSpec]:
        return list(self._call(0, lambda s, e: s.stub.ListTables(pb.ListTablesRequest(), **self._opts())).tables)

    def drop_table(self, name: str) -> None:
        """Drops a table and everything stored of it, on every shard."""
        self._all(lambda s, e: s.stub.DropTable(pb.DropTableRequest(name=name), **self._opts()))
        with self._tables_lock:
            self._tables.pop(name, None)

    def set_table_codec(self, name: str, codec: Optional[str] = None, pull_codec: Optional[str] = None) -> None:
        """How table ``name``'s pushes (and pulls) travel from now on. Changing the push codec
        drops what the old one still owed."""
        state = self._state(name)
        with state.lock:
            if codec is not None:
                new = cd.Codec.parse(codec)
                if new != state.codec:
                    state.codec, state.residual, state.rows = new, None, None
            if pull_codec is not None:
                state.pull = _check_pull(pull_codec)

    def _state(self, name: str) -> _TableState:
        with self._tables_lock:
            st = self._tables.get(name)
        if st is not None:
            return st
        spec = self.describe_table(name).spec
        with self._tables_lock:
            return self._tables.setdefault(name, _TableState(spec=spec, codec=self._codec, pull=self._pull))

    # --- dense ----------------------------------------------------------------------------

    def _plan(self, st: _TableState, chunks: Sequence[int], bytes_per_value: float) -> List[Tuple[int, List[int]]]:
        """Chunks grouped by owner into requests of at most ``max_request_bytes``."""
        n, ce, _ = st.dense()
        max_values = max(int(self.max_request_bytes / max(bytes_per_value, 0.01)), 1)
        per_shard: Dict[int, List[List[int]]] = {}
        fill: Dict[int, int] = {}
        h = st.hash
        for c in chunks:
            length = min(ce, n - c * ce)
            s = self.partitioner.shard_for_chunk(h, c)
            if s not in per_shard or fill[s] + length > max_values:
                per_shard.setdefault(s, []).append([])
                fill[s] = 0
            per_shard[s][-1].append(c)
            fill[s] += length
        return [(s, req) for s in sorted(per_shard) for req in per_shard[s]]

    def push_dense(self, name: str, grad: ArrayLike) -> PushSummary:
        """Pushes a gradient for the whole dense tensor ``name`` (any shape with the table's
        number of values), under the table's codec."""
        return self._push_dense(name, grad, None)[0]

    def push_pull_dense(self, name: str, grad: ArrayLike, out: F32Array) -> PushSummary:
        """Pushes a gradient for the whole dense tensor ``name`` and pulls the tensor into
        ``out`` (as :meth:`pull_dense_into`), as a training step's push and pull. When the push
        goes as plain f32 over the bulk stream and the table pulls f32, each request's chunks
        come back in its own exchange, once the shard has acknowledged the push: one exchange
        per request instead of a push and a pull. Chunks that did not (another codec, gRPC, a
        shard older than the method) are pulled after the push.

        Each chunk pulled holds this push (and whatever else the shard applied before), as
        after :meth:`push_dense` then :meth:`pull_dense_into`; chunks are not pulled at one
        instant across shards. On an error, some requests may have been pushed and some
        chunks pulled: ``out`` is then partly written."""
        st = self._state(name)
        flat = _dense_out(st, out)
        if st.pull != "f32":
            summary = self.push_dense(name, grad)
            self.pull_dense_into(name, out)
            return summary
        summary, pulled = self._push_dense(name, grad, flat)
        rest = [c for c in range(st.dense()[2]) if c not in pulled]
        if rest:
            self._pull_dense_chunks(st, rest, pb.ENCODING_F32, flat)
        return summary

    def _push_dense(self, name: str, grad: ArrayLike, pull_into: Optional[F32Array]) -> Tuple[PushSummary, set[int]]:
        """Pushes as :meth:`push_dense` and, where ``pull_into`` is given, reads each request's
        chunks into it in the push's exchange when it can; returns the chunks it read."""
        st = self._state(name)
        n, ce, nchunks = st.dense()
        g = np.ascontiguousarray(grad, dtype=np.float32).reshape(-1)
        if g.size != n:
            raise InvalidInput(
                f"table `{name}` holds {n} values (shape {list(st.spec.dense.shape)}); the gradient has {g.size}"
            )
        with st.lock:
            codec = st.codec
            plan = self._plan(st, range(nchunks), codec.max_bytes_per_value())
            lossy = not codec.lossless
            if lossy:
                if st.residual is None:
                    st.residual = cd.Residual(n)
                st.residual.values += g
            requests: List[Tuple[int, List[Tuple[int, int, Optional[pb.Payload]]]]] = []
            for shard, chunks in plan:
                slices = []
                for c in chunks:
                    lo, hi = c * ce, min((c + 1) * ce, n)
                    if lossy:
                        assert st.residual is not None
                        p: Optional[pb.Payload] = st.residual.take(
                            lo, hi, codec, min_values=self.min_values, lz4=self.lz4
                        )
                    else:
                        p = None  # plain f32 from the caller's array
                    slices.append((c, lo, p))
                requests.append((shard, slices))

        def send(shard: int, slices: List[Tuple[int, int, Optional[pb.Payload]]]) -> Tuple[pb.PushResponse, bool]:
            seq, floor = self._seqs.begin()
            try:
                return self._call(
                    shard, lambda s, epoch: self._push_dense_once(s, st, g, slices, seq, floor, epoch, pull_into)
                )
            finally:
                self._seqs.end(seq)

        results = self._fan([functools.partial(send, *r) for r in requests])
        summary = PushSummary()
        pulled: set[int] = set()
        first: Optional[BaseException] = None
        for (shard, slices), answered in zip(requests, results):
            if isinstance(answered, BaseException):
                first = first or answered
                if lossy and _not_applied(answered):
                    with st.lock:
                        for _, lo, p in slices:
                            if st.residual is not None and p is not None:
                                st.residual.restore(lo, p)
                continue
            push, read = answered
            if read:
                pulled.update(c for c, _, _ in slices)
            wire = sum(len(p.data) if p is not None else 4 * _len(st, c) for c, _, p in slices)
            summary._add(push, wire, sum(_len(st, c) for c, _, _ in slices))
        if first is not None:
            raise first
        return summary, pulled

    def _push_dense_once(
        self,
        s: _Shard,
        st: _TableState,
        g: F32Array,
        slices: List[Tuple[int, int, Optional[pb.Payload]]],
        seq: int,
        floor: int,
        epoch: int,
        pull_into: Optional[F32Array] = None,
    ) -> Tuple[pb.PushResponse, bool]:
        """One attempt at a push request; with ``pull_into``, the push and the pull of its
        chunks in one exchange where it can. Returns the answer and whether the chunks were
        read into ``pull_into``."""
        push_id = pb.PushId(client_id=self.client_id, seq=seq, min_unacked_seq=floor)
        plain = all(p is None for _, _, p in slices)
        if plain and s.bulk is not None:
            header = pb.PushDenseRequest(
                table=st.spec.name,
                push_id=push_id,
                map_epoch=epoch,
                slices=[
                    pb.DenseSlice(chunk=c, values=pb.Payload(encoding=pb.ENCODING_F32, num_values=_len(st, c)))
                    for c, _, _ in slices
                ],
                authorization=f"Bearer {self._token}" if self._token else "",
            )
            encoded = header.SerializeToString()
            body = [g[lo : lo + _len(st, c)].data for c, lo, _ in slices]
            if pull_into is not None and not s.bulk.no_push_pull:
                into = [pull_into[lo : lo + _len(st, c)].data for c, lo, _ in slices]
                try:
                    fused = s.bulk.call_maybe_body(PUSH_PULL_DENSE, encoded, body, into)
                except ServiceError as e:
                    if e.code != grpc.StatusCode.UNIMPLEMENTED:
                        raise
                    # A shard older than the method applied nothing: push, then pull.
                    s.bulk.no_push_pull = True
                    fused = None
                if fused is not None:
                    return _push_pulled(fused, [c for c, _, _ in slices])
            answer = s.bulk.call(PUSH_DENSE, encoded, body)
            if answer is not None:
                return pb.PushResponse.FromString(answer), False
        req = pb.PushDenseRequest(
            table=st.spec.name,
            push_id=push_id,
            map_epoch=epoch,
            slices=[
                pb.DenseSlice(
                    chunk=c,
                    values=p
                    if p is not None
                    else pb.Payload(encoding=pb.ENCODING_F32, num_values=_len(st, c), data=cd.f32_bytes(g[lo : lo + _len(st, c)])),
                )
                for c, lo, p in slices
            ],
        )
        return s.stub.PushDense(req, **self._opts()), False

    def pull_dense(self, name: str, *, exact: bool = False) -> F32Array:
        """Pulls the whole dense tensor ``name`` (flat f32; reshape to the table's shape as
        needed), under the table's pull codec (``exact``: f32 whatever it is)."""
        out = np.empty(self._state(name).dense()[0], dtype=np.float32)
        self.pull_dense_into(name, out, exact=exact)
        return out

    def pull_dense_into(self, name: str, out: F32Array, *, exact: bool = False) -> None:
        """Pulls the whole dense tensor ``name`` into ``out``: a contiguous float32 array of
        exactly its values. A caller that keeps one array from step to step spares each pull
        the fresh pages of a new one."""
        st = self._state(name)
        out = _dense_out(st, out)
        pull = "f32" if exact else st.pull
        if pull.startswith("delta-topk:"):
            out[:] = self._pull_dense_delta(st, float(pull.split(":")[1]))
            return
        self._pull_dense_chunks(st, range(st.dense()[2]), _PULL_ENCODINGS[pull], out)

    def _pull_dense_chunks(self, st: _TableState, chunks: Sequence[int], accept: pb.Encoding, out: F32Array) -> None:
        """Pulls ``chunks`` (in ascending order) under ``accept`` into their places in ``out``,
        the flat tensor."""
        _, ce, _ = st.dense()
        plan = self._plan(st, chunks, 4.0 if accept == pb.ENCODING_F32 else 2.0)

        def one(shard: int, chunks: List[int]) -> None:
            def attempt(s: _Shard, epoch: int) -> None:
                req = pb.PullDenseRequest(table=st.spec.name, chunks=chunks, accept=accept, map_epoch=epoch)
                if accept == pb.ENCODING_F32 and s.bulk is not None:
                    if self._token:
                        req.authorization = f"Bearer {self._token}"
                    into = [out[c * ce : c * ce + _len(st, c)].data for c in chunks]
                    if s.bulk.call(PULL_DENSE, req.SerializeToString(), [], into) is not None:
                        return
                    req.authorization = ""
                resp = s.stub.PullDense(req, **self._opts())
                if len(resp.slices) != len(chunks):
                    raise ProtocolError(f"{len(resp.slices)} slices answered for {len(chunks)} chunks")
                for c, sl in zip(chunks, resp.slices):
                    if sl.chunk != c:
                        raise ProtocolError(f"chunk {sl.chunk} answered where chunk {c} was asked")
                    cd.decode(sl.values, out[c * ce : c * ce + _len(st, c)])

            self._call(shard, attempt)

        _first_error(self._fan([functools.partial(one, *r) for r in plan]))

    def _pull_dense_delta(self, st: _TableState, ratio: float) -> F32Array:
        """Each chunk as the top ``ratio`` of its change since this client's last pull, added
        to the client's replica (the shard keeps the matching one); a chunk the shard holds no
        replica for comes whole."""
        n, ce, nchunks = st.dense()
        with st.replica_lock:
            if st.replica is None or len(st.replica) != n:
                st.replica = np.zeros(n, dtype=np.float32)
                st.versions.clear()
            replica = st.replica

            def one(shard: int, chunks: List[int]) -> pb.PullDenseResponse:
                delta = pb.DeltaPull(client_id=self.client_id, ratio=ratio, versions=[st.versions.get(c, 0) for c in chunks])
                return self._call(
                    shard,
                    lambda s, epoch: s.stub.PullDense(
                        pb.PullDenseRequest(table=st.spec.name, chunks=chunks, accept=pb.ENCODING_F32, map_epoch=epoch, delta=delta),
                        **self._opts(),
                    ),
                )

            plan = self._plan(st, range(nchunks), 4.0)
            answers: List[pb.PullDenseResponse] = _first_error(self._fan([functools.partial(one, *r) for r in plan]))
            for resp in answers:
                if not (len(resp.is_delta) == len(resp.versions) == len(resp.slices)):
                    raise ProtocolError("a delta pull answered without a version per slice")
                for sl, is_delta, version in zip(resp.slices, resp.is_delta, resp.versions):
                    if sl.chunk >= nchunks:
                        raise ProtocolError(f"chunk {sl.chunk} answered out of range")
                    dst = replica[sl.chunk * ce : sl.chunk * ce + _len(st, sl.chunk)]
                    if is_delta:
                        dst += cd.decode(sl.values, np.empty(len(dst), dtype=np.float32))
                    else:
                        cd.decode(sl.values, dst)
                    if version:
                        st.versions[sl.chunk] = version
                    else:
                        st.versions.pop(sl.chunk, None)
            return replica.copy()

    # --- sparse ---------------------------------------------------------------------------

    def _group(self, st: _TableState, ids: npt.NDArray[np.uint64], bytes_per_value: float) -> List[Tuple[int, npt.NDArray[np.int64]]]:
        """Positions of ``ids`` grouped by owner, in requests of bounded size."""
        dim = st.dim()
        owners = self.partitioner.shards_for_ids(st.hash, ids)
        per_request = max(int(self.max_request_bytes / (dim * max(bytes_per_value, 0.01) + 8.0)), 1)
        out = []
        for s in range(len(self._shards)):
            pos = np.flatnonzero(owners == s)
            for i in range(0, len(pos), per_request):
                out.append((s, pos[i : i + per_request]))
        return out

    def push_sparse(self, name: str, ids: ArrayLike, grads: ArrayLike) -> PushSummary:
        """Pushes gradients for rows ``ids`` of sparse table ``name``: ``grads`` holds
        ``len(ids) x dim`` values. Duplicate ids are summed by the shard."""
        st = self._state(name)
        dim = st.dim()
        ids_ = _ids(ids)
        g = np.ascontiguousarray(grads, dtype=np.float32).reshape(-1)
        if g.size != len(ids_) * dim:
            raise InvalidInput(f"{len(ids_)} ids of dim {dim} need {len(ids_) * dim} gradient values; got {g.size}")
        rows = g.reshape(len(ids_), dim)
        # The requests are parts of one push: each takes the codec the whole push would, however
        # its ids split over the shards (as the Rust SDK's Encoder::for_parts_of).
        part_min = 0 if g.size >= self.min_values else g.size + 1
        with st.lock:
            codec = st.codec
            requests = []
            for shard, pos in self._group(st, ids_, codec.max_bytes_per_value()):
                rid, values = ids_[pos], rows[pos]
                if not codec.keeps_row_residual:
                    p = cd.encode(values.reshape(-1), codec, min_values=part_min, lz4=self.lz4)
                else:
                    if st.rows is None:
                        st.rows = cd.RowResiduals(dim, cd.RowResiduals.rows_in(self.row_residual_bytes, dim))
                    p = st.rows.compress(rid, values.reshape(-1), codec, min_values=part_min, lz4=self.lz4)
                requests.append((shard, rid, p))
        # What goes on the wire: a sparse codec's request carries only the rows it has an entry
        # for, and their ids (the rest of each row is in the residual, or was zero).
        sent = []
        for i, (shard, rid, p) in enumerate(requests):
            carried = cd.rows_carried(p, dim)
            if carried is None:
                sent.append((i, shard, rid, p))
            elif len(carried[0]):
                sent.append((i, shard, rid[carried[0]], carried[1]))

        def send(shard: int, rid: npt.NDArray[np.uint64], p: pb.Payload) -> pb.PushResponse:
            wire = _wire_ids(rid)
            seq, floor = self._seqs.begin()
            try:
                return self._call(
                    shard,
                    lambda s, epoch: s.stub.PushSparse(
                        pb.PushSparseRequest(
                            table=st.spec.name,
                            push_id=pb.PushId(client_id=self.client_id, seq=seq, min_unacked_seq=floor),
                            map_epoch=epoch,
                            values=p,
                            ids=wire[0],
                            fixed_ids=wire[1],
                        ),
                        **self._opts(),
                    ),
                )
            finally:
                self._seqs.end(seq)

        results = self._fan([functools.partial(send, shard, rid, p) for _, shard, rid, p in sent])
        summary = PushSummary()
        first: Optional[BaseException] = None
        for (i, _, sent_ids, p), r in zip(sent, results):
            _, rid, full = requests[i]
            if isinstance(r, BaseException):
                first = first or r
                if codec.keeps_row_residual and _not_applied(r) and st.rows is not None:
                    with st.lock:
                        st.rows.restore(rid, full)
                continue
            summary._add(r, len(p.data), full.num_values)
            summary.rows += len(sent_ids)
        if first is not None:
            raise first
        return summary

    def pull_sparse(self, name: str, ids: ArrayLike, *, exact: bool = False) -> F32Array:
        """Pulls rows ``ids`` of sparse table ``name``: an array of ``len(ids) x dim``; rows
        never pushed read as the table's initializer."""
        st = self._state(name)
        dim = st.dim()
        ids_ = _ids(ids)
        # Rows have no delta form: a table pulling dense tables in delta top-k pulls rows in fp16.
        accept = _PULL_ENCODINGS.get("f32" if exact else st.pull, pb.ENCODING_F16)
        out = np.empty((len(ids_), dim), dtype=np.float32)

        def one(shard: int, pos: npt.NDArray[np.int64]) -> None:
            wire = _wire_ids(ids_[pos])
            resp = self._call(
                shard,
                lambda s, epoch: s.stub.PullSparse(
                    pb.PullSparseRequest(table=st.spec.name, accept=accept, map_epoch=epoch, ids=wire[0], fixed_ids=wire[1]),
                    **self._opts(),
                ),
            )
            if resp.values.num_values != len(pos) * dim:
                raise ProtocolError(f"asked for {len(pos)} rows of dim {dim}, got {resp.values.num_values} values")
            out[pos] = cd.decode(resp.values).reshape(len(pos), dim)

        _first_error(self._fan([functools.partial(one, *r) for r in self._group(st, ids_, 4.0)]))
        return out

    # --- checkpoints and stats ------------------------------------------------------------

    def checkpoint(self, name: str = "") -> List[pb.CheckpointResponse]:
        """Takes a checkpoint on every shard (not coordinated with training: the scheduler's
        ``CheckpointJob`` is, for a job)."""
        return self._all(lambda s, e: s.stub.Checkpoint(pb.CheckpointRequest(name=name), **self._opts()))

    def stats(self) -> List[pb.GetStatsResponse]:
        """Every shard's counters and per-table stats."""
        return self._all(lambda s, e: s.stub.GetStats(pb.GetStatsRequest(), **self._opts()))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for s in self._shards:
            s.close()
        if self._scheduler_channel is not None:
            self._scheduler_channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _len(st: _TableState, c: int) -> int:
    n, ce, _ = st.dense()
    return min(ce, n - c * ce)


def _dense_out(st: _TableState, out: F32Array) -> F32Array:
    """``out`` as the flat tensor a pull writes into, or :class:`InvalidInput` when it is not a
    contiguous float32 array of exactly the table's values."""
    n = st.dense()[0]
    if not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.flags.c_contiguous and out.size == n):
        raise InvalidInput(f"table `{st.spec.name}` holds {n} values: pull into a contiguous float32 array of that size")
    return out.reshape(-1)


def _push_pulled(answered: Tuple[bytes, bool], chunks: List[int]) -> Tuple[pb.PushResponse, bool]:
    """A push-and-pull's answer (its header, and whether its body was read) as the push's
    answer and whether the chunks were read; checks that the pull is what was asked."""
    header, read = answered
    resp = pb.PushPullDenseResponse.FromString(header)
    if not resp.HasField("push"):
        raise ProtocolError("a push-and-pull answer without its push")
    if not resp.HasField("pull"):
        if read:
            raise ProtocolError("a push-and-pull answer with values but no pull")
        return resp.push, False
    if not read:
        raise ProtocolError("a push-and-pull answer with a pull but no values")
    got = [sl.chunk for sl in resp.pull.slices]
    if got != chunks:
        raise ProtocolError(f"chunks {got} answered where chunks {chunks} were asked")
    return resp.push, True


def _ids(ids: ArrayLike) -> npt.NDArray[np.uint64]:
    a = np.asarray(ids)
    if a.dtype.kind == "i" and a.size and int(a.min()) < 0:
        raise InvalidInput("ids are unsigned 64-bit integers; got a negative one")
    if a.dtype.kind not in "iu" and a.size:
        raise InvalidInput(f"ids must be integers, not {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.uint64).reshape(-1)


def _wire_ids(ids: npt.NDArray[np.uint64]) -> Tuple[List[int], List[int]]:
    """A sparse request's ids as the Rust SDK sends them, ``(ids, fixed_ids)``: as 8-byte words
    where that is shorter than their varints (hashed ids take about 9.5 bytes), else as varints."""
    varints = len(ids) + sum(int(np.count_nonzero(ids >= np.uint64(1 << (7 * k)))) for k in range(1, 10))
    return ([], ids.tolist()) if varints > 8 * len(ids) else (ids.tolist(), [])


def _check_pull(text: str) -> str:
    """A pull codec's text form: f32, fp16, bf16, int8, int4 or delta-topk:R (dense tables)."""
    if text.startswith("delta-topk:"):
        try:
            ratio = float(text.split(":", 1)[1])
        except ValueError:
            raise InvalidInput(f"`{text}`: the ratio is not a number") from None
        if not 0.0 < ratio <= 1.0:
            raise InvalidInput(f"`{text}`: the ratio must be in (0, 1]")
        return f"delta-topk:{ratio}"
    if text not in _PULL_ENCODINGS:
        raise InvalidInput(f"pull codec `{text}`: f32, fp16, bf16, int8, int4 or delta-topk:R")
    return "fp16" if text == "f16" else text


def _not_applied(e: BaseException) -> bool:
    """Whether a failed push was certainly not applied: the shard refused it."""
    if isinstance(e, ServiceError):
        return e.code not in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.UNKNOWN,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.CANCELLED,
        )
    return True


def _first_error(results: Sequence[Union[T, BaseException]]) -> List[T]:
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return list(results)  # type: ignore[arg-type]
