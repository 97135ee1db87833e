"""A worker's membership of a job on the scheduler: join, clocks under the job's consistency
model (BSP, SSP, ASP), heartbeats in the background, leave. The same protocol as the Rust
workers' (``ps_client::scheduler::WorkerSession``), so Python and Rust workers can share a job.

>>> with psclient.Session("http://127.0.0.1:7000", "mnist", name="py-0") as s:   # doctest: +SKIP
...     ps = s.client()
...     clock = s.start()
...     while clock is not None:
...         ...  # pull, compute, push: every push of the clock acknowledged
...         clock = s.advance(examples=64)
"""
from __future__ import annotations

import threading
import time
from typing import Any, Optional

import grpc

from ._proto.ps.v1 import scheduler_pb2 as spb
from ._proto.ps.v1 import scheduler_pb2_grpc as spb_grpc
from .client import Client, Tls
from .errors import PsError, ServiceError, retry_unreachable

RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


class Session:
    """Joins job ``job`` on the scheduler at ``scheduler`` as a worker named ``name`` (again
    under ``worker_id`` when given) and keeps its lease alive until :meth:`leave`."""

    def __init__(
        self,
        scheduler: str,
        job: str,
        *,
        name: str = "python",
        worker_id: int = 0,
        token: Optional[str] = None,
        tls: Optional[Tls] = None,
        max_attempts: int = 40,
    ) -> None:
        self.scheduler, self.job, self.name = scheduler, job, name
        self._token, self._tls = token, tls
        target = scheduler.split("://", 1)[-1].rstrip("/")
        self._channel = grpc.secure_channel(target, tls.grpc_credentials()) if tls else grpc.insecure_channel(target)
        self._stub = spb_grpc.SchedulerStub(self._channel)
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        self._max_attempts = max_attempts
        r = self._join(worker_id)
        self.worker_id: int = r.worker_id
        self.spec: spb.JobSpec = r.spec
        self.assignment: spb.Assignment = r.assignment
        self.clock: int = r.clock
        self.map_epoch: int = r.shard_map.epoch
        self.stopped = False
        self._started = time.monotonic()
        self._stop = threading.Event()
        lease = max(r.lease_ms, 100) / 1000.0
        self._heartbeat = threading.Thread(target=self._beat, args=(lease,), daemon=True, name="psclient-heartbeat")
        self._heartbeat.start()

    def _rpc(self, method: str, req: Any) -> Any:
        return retry_unreachable(
            lambda: getattr(self._stub, method)(req, metadata=self._metadata),
            endpoint=self.scheduler,
            attempts=self._max_attempts,
            backoff=0.05,
            max_backoff=1.0,
            codes=RETRY_CODES,
        )

    def _join(self, worker_id: int) -> spb.JoinJobResponse:
        return self._rpc("JoinJob", spb.JoinJobRequest(job=self.job, worker_name=self.name, worker_id=worker_id))

    def _beat(self, lease: float) -> None:
        while not self._stop.wait(lease / 3):
            try:
                r = self._stub.WorkerHeartbeat(
                    spb.WorkerHeartbeatRequest(job=self.job, worker_id=self.worker_id),
                    metadata=self._metadata,
                    timeout=lease,
                )
                self.map_epoch = max(self.map_epoch, r.map_epoch)
            except grpc.RpcError:
                pass  # NOT_FOUND: the next clock report joins again; others: try again

    def client(self, **kwargs: Any) -> Client:
        """A client of the job's shards, routed by the scheduler's map, with the job's table
        codecs applied (``kwargs`` go to :class:`Client`)."""
        kwargs.setdefault("token", self._token)
        kwargs.setdefault("tls", self._tls)
        kwargs.setdefault("max_attempts", 200)
        kwargs.setdefault("max_backoff", 0.5)
        ps = Client(scheduler=self.scheduler, **kwargs)
        for t in self.spec.tables:
            ps.set_table_codec(t.spec.name, codec=t.codec or "f32", pull_codec=t.pull_codec or "f32")
        return ps

    def start(self) -> Optional[int]:
        """Waits until the first clock after joining may start; returns it (``None``: the job
        has ended)."""
        return self._report(None, 0, 0.0, 0.0)

    def advance(self, *, examples: int = 0, compute_seconds: Optional[float] = None, param_age_seconds: float = 0.0) -> Optional[int]:
        """Reports the current clock done (every push of it acknowledged) and waits until the
        consistency model lets the next one start; returns it (``None``: the job has ended; a
        worker that has finished the job's ``max_clocks`` waits here until every worker has, so
        that what it reads afterwards holds all their pushes)."""
        compute = time.monotonic() - self._started if compute_seconds is None else compute_seconds
        return self._report(self.clock, examples, compute, param_age_seconds)

    def _report(self, finished: Optional[int], examples: int, compute: float, age: float) -> Optional[int]:
        if self.stopped:
            return None
        req = spb.AdvanceClockRequest(
            job=self.job,
            worker_id=self.worker_id,
            examples=examples,
            compute_us=int(compute * 1e6),
            param_age_us=int(age * 1e6),
        )
        if finished is not None:
            req.finished = finished
        while True:
            try:
                r = self._rpc("AdvanceClock", req)
            except ServiceError as e:
                if e.code != grpc.StatusCode.NOT_FOUND or e.reason == "JOB_NOT_FOUND":
                    raise
                # The lease expired (or the scheduler lost it): take our place again.
                j = self._join(self.worker_id)
                self.clock = j.clock
                req.ClearField("finished")
                continue
            self.map_epoch = max(self.map_epoch, r.map_epoch)
            if r.HasField("assignment") and r.assignment.version:
                self.assignment = r.assignment
            if r.stop:
                self.stopped = True
                return None
            if r.ready:
                self.clock = r.clock
                self._started = time.monotonic()
                return self.clock
            req.examples = req.compute_us = req.param_age_us = 0

    def leave(self) -> None:
        """Leaves the job for good; its data shards go to the other workers at once."""
        self._stop.set()
        try:
            self._rpc("LeaveJob", spb.LeaveJobRequest(job=self.job, worker_id=self.worker_id))
        finally:
            self._channel.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._stop.is_set():
            try:
                self.leave()
            except PsError:
                pass
