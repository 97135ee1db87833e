"""Typed errors. A shard's or the scheduler's refusal carries a reason (a
``google.rpc.ErrorInfo`` in the ``grpc-status-details-bin`` trailer, domain ``ps.v1``); the
exception's class is chosen by the reason first, then by the status code, and it keeps both,
so callers can act on them (never on the message)."""
from __future__ import annotations

import time
from typing import Callable, Dict, Optional, Tuple, Type, TypeVar

import grpc

ERROR_DOMAIN = "ps.v1"

T = TypeVar("T")


class PsError(Exception):
    """Base of every error this package raises."""


class InvalidInput(PsError, ValueError):
    """The caller's input is wrong; nothing was sent."""


class ProtocolError(PsError):
    """A service answered something this client cannot read."""


class TopologyError(PsError):
    """The endpoint list (or the scheduler's map) does not describe the cluster."""


class ServiceError(PsError):
    """A shard or the scheduler refused a call (after any retries)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: Optional[str] = None,
        metadata: Optional[Dict[str, str]] = None,
        endpoint: str = "",
        shard: Optional[int] = None,
    ) -> None:
        where = f"shard {shard} ({endpoint})" if shard is not None else endpoint or "service"
        super().__init__(f"{where} answered {code.name}" + (f" [{reason}]" if reason else "") + f": {message}")
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = metadata or {}
        self.endpoint = endpoint
        self.shard = shard


class InvalidArgument(ServiceError):
    """INVALID_ARGUMENT: a bad field, an undecodable payload, a NaN, a wrong kind of table."""


class TableNotFound(ServiceError):
    """TABLE_NOT_FOUND."""


class AlreadyExists(ServiceError):
    """A table (or job, or checkpoint) exists with another spec."""


class StaleMap(ServiceError):
    """The shard map changed: the client fetches it again (when it has a scheduler)."""


class Unavailable(ServiceError):
    """The service could not be reached, or asked to be retried, for longer than the retries."""


class ResourceLimit(ServiceError):
    """RESOURCE_EXHAUSTED: the request, or what it would store, is over a limit."""


class AuthError(ServiceError):
    """UNAUTHENTICATED or PERMISSION_DENIED: no token, a wrong one, or one without the role."""


class NotFound(ServiceError):
    """NOT_FOUND for anything but a table (a job, a checkpoint, a worker)."""


class FailedPrecondition(ServiceError):
    """FAILED_PRECONDITION the client does not handle itself."""


_BY_REASON: Dict[str, Type[ServiceError]] = {
    "TABLE_NOT_FOUND": TableNotFound,
    "TABLE_SPEC_CONFLICT": AlreadyExists,
    "JOB_EXISTS": AlreadyExists,
    "CHECKPOINT_EXISTS": AlreadyExists,
    "STALE_MAP": StaleMap,
    "REQUEST_TOO_LARGE": ResourceLimit,
    "RESOURCE_LIMIT": ResourceLimit,
}

_BY_CODE: Dict[grpc.StatusCode, Type[ServiceError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceLimit,
    grpc.StatusCode.UNAUTHENTICATED: AuthError,
    grpc.StatusCode.PERMISSION_DENIED: AuthError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
}

# Reasons after which the same call may succeed when sent again (after a backoff).
RETRY_REASONS = frozenset(
    {"SHUTTING_DOWN", "READ_ONLY", "MAP_AHEAD", "NOT_REGISTERED", "SHARDS_UNAVAILABLE", "CALLER_LIMIT"}
)


def error_info(details: Optional[bytes]) -> tuple[Optional[str], Dict[str, str]]:
    """The reason and metadata of the ``ps.v1`` ErrorInfo in an encoded google.rpc.Status."""
    if not details:
        return None, {}
    from google.rpc import error_details_pb2, status_pb2

    status = status_pb2.Status()
    try:
        status.ParseFromString(details)
    except Exception:
        return None, {}
    for any_ in status.details:
        if any_.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            any_.Unpack(info)
            if info.domain == ERROR_DOMAIN:
                return info.reason, dict(info.metadata)
    return None, {}


def make_error(
    code: grpc.StatusCode,
    message: str,
    details: Optional[bytes],
    *,
    endpoint: str = "",
    shard: Optional[int] = None,
) -> ServiceError:
    """The typed error for a refusal."""
    reason, metadata = error_info(details)
    cls = _BY_REASON.get(reason or "") or _BY_CODE.get(code, ServiceError)
    return cls(code, message, reason=reason, metadata=metadata, endpoint=endpoint, shard=shard)


def from_rpc_error(e: grpc.RpcError, *, endpoint: str = "", shard: Optional[int] = None) -> ServiceError:
    """The typed error for a failed gRPC call."""
    details = None
    for key, value in (e.trailing_metadata() or ()):  # type: ignore[attr-defined]
        if key == "grpc-status-details-bin":
            details = value
    return make_error(e.code(), e.details() or "", details, endpoint=endpoint, shard=shard)  # type: ignore[attr-defined]


def retry_unreachable(
    call: Callable[[], T],
    *,
    endpoint: str,
    shard: Optional[int] = None,
    attempts: int,
    backoff: float,
    max_backoff: float,
    codes: Tuple[grpc.StatusCode, ...] = (grpc.StatusCode.UNAVAILABLE,),
) -> T:
    """``call()``, asked again with exponential backoff while it fails with one of ``codes``
    (the service cannot be reached), at most ``attempts`` times; any other refusal, or the
    last one, raises its typed error."""
    for attempt in range(max(attempts, 1)):
        try:
            return call()
        except grpc.RpcError as e:
            err = from_rpc_error(e, endpoint=endpoint, shard=shard)
            if err.code not in codes or attempt + 1 >= attempts:
                raise err from None
        time.sleep(backoff)
        backoff = min(backoff * 2, max_backoff)
    raise AssertionError("unreachable")
