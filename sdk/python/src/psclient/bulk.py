"""The client side of a shard's bulk stream: plain-f32 dense pushes and pulls (a push and the
pull of its chunks in one exchange too) over raw TCP (TLS when the client has it), without
HTTP/2 framing. Framing (``ShardInfoResponse.bulk_port``
in ``ps.proto``), integers little-endian::

    request: "PSB1" | method u32 | header_len u32 | body_len u64 | header | body
    answer:  "PSB1" | code u32   | header_len u32 | body_len u64 | header | body

A push's values are written from the caller's array (one vectored write); a pull's values are
read from the socket straight into the caller's array. A connection carries one call at a time
and is kept for the next one.
"""
from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
from typing import Any, List, Optional, Sequence, Tuple

import grpc

from .errors import ProtocolError, ServiceError, Unavailable, make_error

MAGIC = b"PSB1"
HEAD = struct.Struct("<4sIIQ")
PUSH_DENSE = 1
PULL_DENSE = 2
PUSH_PULL_DENSE = 4
MAX_IDLE = 32
# After a failed connect, calls go through gRPC for this long before the port is tried again.
RETRY_AFTER = 5.0
# The largest answer header this client reads.
MAX_HEADER = 64 << 20

_CODES = {c.value[0]: c for c in grpc.StatusCode}


class BrokenConnection(Unavailable):
    """The connection broke under a call: its fate is unknown (a push is retried under the same
    sequence number, so it is applied once)."""


class BulkPool:
    """The bulk connections to one shard."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: Optional[ssl.SSLContext],
        connect_timeout: float,
        timeout: Optional[float],
        endpoint: str,
        shard: int,
    ) -> None:
        self.host, self.port = host, port
        self.tls = tls
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.endpoint, self.shard = endpoint, shard
        self._idle: List[socket.socket] = []
        self._lock = threading.Lock()
        self._retry_at = 0.0
        # The shard answered a push-and-pull `unimplemented` (it is older than the method and
        # applied nothing): a push and a pull are sent instead.
        self.no_push_pull = False

    def _connect(self) -> Optional[socket.socket]:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            if time.monotonic() < self._retry_at:
                return None
        try:
            s = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                s = self.tls.wrap_socket(s, server_hostname=self.host)
            s.settimeout(self.timeout)
            return s
        except OSError:
            with self._lock:
                self._retry_at = time.monotonic() + RETRY_AFTER
            return None

    def _release(self, s: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(s)
                return
        s.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for s in idle:
            s.close()

    def call(
        self,
        method: int,
        header: bytes,
        body: Sequence[memoryview],
        into: Sequence[memoryview] = (),
    ) -> Optional[bytes]:
        """Sends one call and returns the answer's header (the response message), reading the
        answer's body into ``into`` (which must hold exactly its length). ``None`` when the
        bulk port cannot be reached now or the shard says the call belongs on gRPC: send it
        through gRPC. A refusal raises its typed error; a connection that breaks under the
        call raises :class:`BrokenConnection`."""
        answered = self.call_maybe_body(method, header, body, into, body_optional=False)
        return None if answered is None else answered[0]

    def call_maybe_body(
        self,
        method: int,
        header: bytes,
        body: Sequence[memoryview],
        into: Sequence[memoryview],
        *,
        body_optional: bool = True,
    ) -> Optional[Tuple[bytes, bool]]:
        """As :meth:`call`, for an answer whose body may be absent (``body_optional``): returns
        the header and whether the body was read into ``into``."""
        s = self._connect()
        if s is None:
            return None
        body_len = sum(m.nbytes for m in body)
        try:
            parts: List[Any] = [HEAD.pack(MAGIC, method, len(header), body_len), header, *body]
            if self.tls is None:
                _sendmsg_all(s, parts)
            else:
                for p in parts:
                    s.sendall(p)
            magic, code, header_len, answer_len = HEAD.unpack(_recv_exact(s, HEAD.size))
            if magic != MAGIC:
                raise ProtocolError(f"the bulk stream answered {magic!r}, not a bulk frame")
            if header_len > MAX_HEADER:
                raise ProtocolError(f"a bulk answer header of {header_len} bytes")
            answer = _recv_exact(s, header_len)
            if code != 0:
                details = _recv_exact(s, answer_len) if answer_len <= MAX_HEADER else b""
                self._release(s)
                err = make_error(
                    _CODES.get(code, grpc.StatusCode.UNKNOWN),
                    answer.decode("utf-8", "replace"),
                    details,
                    endpoint=self.endpoint,
                    shard=self.shard,
                )
                if err.reason == "NOT_ON_BULK_STREAM":
                    return None
                raise err
            want = sum(m.nbytes for m in into)
            read = not (body_optional and answer_len == 0)
            if read:
                if answer_len != want:
                    raise ProtocolError(f"the bulk answer holds {answer_len} bytes of values where {want} were asked")
                for m in into:
                    _recv_into_exact(s, m)
        except ServiceError:
            raise
        except (OSError, ProtocolError) as e:
            s.close()
            raise BrokenConnection(
                grpc.StatusCode.UNAVAILABLE, f"bulk stream: {e}", endpoint=self.endpoint, shard=self.shard
            ) from e
        self._release(s)
        return answer, read


def _sendmsg_all(s: socket.socket, parts: List[Any]) -> None:
    views = [v for v in (memoryview(p).cast("B") for p in parts) if len(v)]
    while views:
        sent = s.sendmsg(views[:512])
        while sent:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into_exact(s, memoryview(buf))
    return bytes(buf)


def _recv_into_exact(s: socket.socket, m: memoryview) -> None:
    m = m.cast("B")
    got = 0
    while got < len(m):
        r = s.recv_into(m[got:])
        if r == 0:
            raise ConnectionError("the shard closed the bulk connection")
        got += r


def host_port(endpoint: str) -> Tuple[str, int]:
    """``http://host:port`` (or ``https://``, or bare ``host:port``) as (host, port)."""
    rest = endpoint.split("://", 1)[-1].rstrip("/")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"endpoint `{endpoint}` is not host:port")
    return host.strip("[]"), int(port)
