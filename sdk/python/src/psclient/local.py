"""Local clusters from the project's release binaries (``ps-server``, ``scheduler``,
``worker``, ``psctl``), for examples and tests: every service binds a port on 127.0.0.1 it
picks itself and announces it in a ready file."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional, Sequence

from .errors import PsError


def bin_dirs() -> List[pathlib.Path]:
    """Where the binaries are looked for: ``PS_BIN_DIR`` alone when it is set; else the
    ``target/release`` of the checkout this file is in (an editable install), then the current
    directory's (an installed package run from the repository root)."""
    env = os.environ.get("PS_BIN_DIR")
    if env:
        return [pathlib.Path(env)]
    checkout = pathlib.Path(__file__).resolve().parents[4] / "target" / "release"
    return [checkout, pathlib.Path.cwd() / "target" / "release"]


def binary(name: str) -> str:
    """The path of the project binary ``name``: in :func:`bin_dirs`, else on ``PATH`` (unless
    ``PS_BIN_DIR`` is set)."""
    dirs = bin_dirs()
    for d in dirs:
        if (d / name).exists():
            return str(d / name)
    pinned = bool(os.environ.get("PS_BIN_DIR"))
    on_path = None if pinned else shutil.which(name)
    if on_path:
        return on_path
    looked = ", ".join(str(d) for d in dirs) + ("" if pinned else " or on PATH")
    raise PsError(f"{name} is not in {looked}: build the workspace (cargo build --release --workspace --bins) or set PS_BIN_DIR")


class Service:
    """A child service, its log (and ready file) in ``logs``."""

    def __init__(self, name: str, bin: str, args: Sequence[str], logs: pathlib.Path, *, ready: bool = True, timeout: float = 60.0) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.name, self.logs = name, logs
        self.ready_file = logs / f"{name}.ready"
        self.ready_file.unlink(missing_ok=True)
        self._log = open(logs / f"{name}.log", "ab")
        cmd = [binary(bin), *args] + (["--ready-file", str(self.ready_file)] if ready else [])
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self.info: Dict[str, object] = self._wait_ready(timeout) if ready else {}

    def _wait_ready(self, timeout: float) -> Dict[str, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PsError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            try:
                info = json.loads(self.ready_file.read_text())
                if info.get("pid") == self.proc.pid:
                    return info
            except (FileNotFoundError, json.JSONDecodeError):
                pass
            time.sleep(0.05)
        raise PsError(f"{self.name} was not ready within {timeout}s: {self.tail()}")

    @property
    def grpc(self) -> str:
        """``host:port`` of its gRPC address."""
        return str(self.info["grpc"])

    @property
    def url(self) -> str:
        return f"http://{self.grpc}"

    def tail(self, chars: int = 3000) -> str:
        return (self.logs / f"{self.name}.log").read_text(errors="replace")[-chars:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class LocalCluster:
    """``shards`` shards (durable unless ``in_memory``, their data under ``dir``), with a
    scheduler when ``scheduler`` is set (the shards then register with it).

    ``dense_log_mib`` sizes each durable shard's push log, which the shard reserves on disk
    when it starts (the server's default is 1 GiB; small clusters for tests and examples need
    far less)."""

    def __init__(
        self,
        dir: pathlib.Path,
        shards: int,
        *,
        scheduler: bool = False,
        in_memory: bool = False,
        dense_log_mib: Optional[int] = 64,
        extra: Sequence[str] = (),
    ) -> None:
        self.dir = pathlib.Path(dir)
        self.logs = self.dir / "logs"
        self.services: List[Service] = []
        self.scheduler: Optional[Service] = None
        self.extra = list(extra)
        self.in_memory = in_memory
        if dense_log_mib is not None and not in_memory:
            self.dir.mkdir(parents=True, exist_ok=True)
            config = self.dir / "shard.toml"
            config.write_text(f"[rocksdb]\ndense_log_mib = {int(dense_log_mib)}\n")
            self.extra += ["--config", str(config)]
        try:
            if scheduler:
                self.scheduler = Service("scheduler", "scheduler", ["--data-dir", str(self.dir / "scheduler"), "--listen", "127.0.0.1:0"], self.logs)
                self.services.append(self.scheduler)
            self.shards = [self.start_shard(i, shards) for i in range(shards)]
        except BaseException:
            self.stop()
            raise

    def start_shard(self, i: int, n: int, *, listen: str = "127.0.0.1:0") -> Service:
        args = ["--listen", listen, "--shard-index", str(i), "--num-shards", str(n), *self.extra]
        args += ["--in-memory"] if self.in_memory else ["--data-dir", str(self.dir / f"shard-{i}")]
        if self.scheduler is not None:
            args += ["--scheduler", self.scheduler.url]
        s = Service(f"shard-{i}", "ps-server", args, self.logs)
        self.services.append(s)
        return s

    @property
    def endpoints(self) -> List[str]:
        return [s.url for s in self.shards]

    @property
    def scheduler_url(self) -> Optional[str]:
        return self.scheduler.url if self.scheduler else None

    def psctl(self, *args: str) -> str:
        """Runs ``psctl`` against the scheduler; its output (raises with it on failure)."""
        assert self.scheduler is not None, "psctl needs the scheduler"
        out = subprocess.run([binary("psctl"), "--scheduler", self.scheduler.url, *args], capture_output=True, text=True)
        if out.returncode != 0:
            raise PsError(f"psctl {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout

    def worker(self, job: str, name: str, *args: str) -> Service:
        """Starts a Rust worker of job ``job``."""
        assert self.scheduler is not None, "workers need the scheduler"
        s = Service(name, "worker", ["--scheduler", self.scheduler.url, "--job", job, "--name", name, *args], self.logs, ready=False)
        self.services.append(s)
        return s

    def stop(self) -> None:
        for s in reversed(self.services):
            s.stop()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
