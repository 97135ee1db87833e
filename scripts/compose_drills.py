#!/usr/bin/env python3
"""The fault drills of scripts/compose-test.sh, through the real container engine.

Runs the compose cluster (docker-compose.yml) on the drill job (deploy/compose/drill.toml: a
counter in place of a model, so that a stored value counts the pushes applied to it) and, while
it trains, in order:

  shard-kill        SIGKILL a shard's container, start it again: the job pauses and resumes
  scheduler-restart stop the scheduler (SIGTERM), start it again: the job goes on
  worker-partition  `docker network disconnect` a worker: its lease expires, its data goes to
                    the other worker, the job goes on; connected again, it rejoins
  restart-all       `docker-compose stop`, then `start`: every container down at once, then up
                    again (a power cut); the job resumes at the clock where it stopped

then lets the job finish and compares what the workers saw acknowledged (one line per reported
clock in the run directory's steps-<worker>.jsonl) with what the shards store. Each drill's
figures (time to notice, the longest stretch without a clock, time to recover) and the totals
go to a JSON report. The caller (compose-test.sh) starts the cluster's images, sets the
project, ports and job through the environment, bounds the time and tears everything down.

Exit status 0 when every drill passed, 1 otherwise (the reason is printed).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PSCTL = ROOT / "target" / "release" / "psctl"
JOB = os.environ.get("PS_JOB", "drill")
TABLE = f"{JOB}/count"
SCHEDULER = f"http://127.0.0.1:{os.environ.get('PS_SCHEDULER_PORT', '7000')}"
PROMETHEUS = f"http://127.0.0.1:{os.environ.get('PS_PROMETHEUS_PORT', '9090')}"
DASHBOARD = ROOT / "deploy" / "grafana" / "parameter-server.json"
PROJECT = os.environ["COMPOSE_PROJECT_NAME"]
REPORT = Path(os.environ.get("COMPOSE_TEST_REPORT", ROOT / "target/compose-test/report.json"))
# Clocks of training between two drills.
SPACING = int(os.environ.get("DRILL_SPACING", "300"))
T0 = time.monotonic()


class DrillFailed(Exception):
    pass


def now():
    return time.monotonic() - T0


def log(msg):
    print(f"drills [{now():6.1f} s] {msg}", flush=True)


def compose(*args, capture=False):
    r = subprocess.run(
        ["docker-compose", *args],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE if capture else None,
        check=False,
    )
    if r.returncode != 0:
        raise DrillFailed(f"docker-compose {' '.join(args)} exited with {r.returncode}")
    return r.stdout or ""


def docker(*args):
    r = subprocess.run(["docker", *args], text=True, capture_output=True, check=False)
    if r.returncode != 0:
        raise DrillFailed(f"docker {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def container(service):
    cid = compose("ps", "-q", service, capture=True).strip()
    if not cid:
        raise DrillFailed(f"service {service} has no container")
    return cid


class Watch:
    """Polls the job's status through the scheduler's published port and keeps the history of
    (time, state, min_clock), from which each drill's longest stretch without a clock is read."""

    def __init__(self):
        self.history = []
        self.last = None

    def poll(self):
        try:
            r = subprocess.run(
                [str(PSCTL), "--scheduler", SCHEDULER, "--json", "status", JOB],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None
        if r.returncode != 0:
            return None
        s = json.loads(r.stdout)
        self.history.append((now(), s["state"], s["min_clock"]))
        self.last = s
        return s

    def until(self, what, pred, timeout):
        """Polls until `pred(status)` holds; returns (time, status)."""
        deadline = now() + timeout
        while now() < deadline:
            s = self.poll()
            if s is not None:
                if s["state"] in ("failed", "canceled"):
                    raise DrillFailed(f"the job is {s['state']}: {s['message']}")
                if pred(s):
                    return now(), s
            time.sleep(0.2)
        raise DrillFailed(f"not within {timeout} s: {what}; last status: {json.dumps(self.last)}")

    def stall(self, start, end):
        """The longest time between two clock advances seen in [start, end] (from `start` to
        the first advance when there is none before it)."""
        changes = [start]
        prev = None
        for t, _, c in self.history:
            if prev is not None and c != prev and start <= t <= end:
                changes.append(t)
            prev = c
        changes.append(end)
        return max(b - a for a, b in zip(changes, changes[1:]))

    def paused(self, start, end):
        """Time the job spent in state paused within [start, end], as polled."""
        total, prev = 0.0, None
        for t, state, _ in self.history:
            if prev is not None and start <= prev[0] and t <= end and prev[1] == "paused":
                total += t - prev[0]
            prev = (t, state)
        return total


def live(s, name):
    return [w for w in s["workers"] if w["name"] == name and w["live"]]


def running_past(clock):
    return lambda s: s["state"] == "running" and s["min_clock"] > clock


def shard_kill(w):
    cid = container("shard-1")
    _, s = w.until("training", lambda s: s["state"] == "running" and s["min_clock"] >= SPACING, 240)
    t_fault = now()
    docker("kill", "--signal", "KILL", cid)
    clock = w.poll()["min_clock"]
    log(f"shard-kill: SIGKILL shard-1 at clock {clock}")
    t_paused, s = w.until("the job pauses", lambda s: s["state"] == "paused", 60)
    log(f"shard-kill: job paused after {t_paused - t_fault:.1f} s: {s['message']}")
    at_pause = s["min_clock"]
    t_start = now()
    docker("start", cid)
    t_back, s = w.until("the job resumes", running_past(at_pause), 120)
    log(f"shard-kill: resumed at clock {s['min_clock']}, {t_back - t_start:.1f} s after the start")
    return {
        "clock": clock,
        "clocks_after_kill": at_pause - clock,
        "noticed_s": round(t_paused - t_fault, 2),
        "paused_s": round(w.paused(t_fault, t_back), 2),
        "longest_without_a_clock_s": round(w.stall(t_fault, t_back), 2),
        "recovered_after_start_s": round(t_back - t_start, 2),
    }


def scheduler_restart(w, after):
    cid = container("scheduler")
    _, s = w.until("training", running_past(after + SPACING), 240)
    clock = s["min_clock"]
    t_fault = now()
    log(f"scheduler-restart: stop the scheduler at clock {clock}")
    docker("stop", "--time", "30", cid)
    t_stopped = now()
    time.sleep(3)
    t_start = now()
    docker("start", cid)
    t_back, s = w.until("the job goes on", running_past(clock), 120)
    log(f"scheduler-restart: clock {s['min_clock']}, {t_back - t_start:.1f} s after the start")
    return {
        "clock": clock,
        "stop_s": round(t_stopped - t_fault, 2),
        "down_s": round(t_start - t_fault, 2),
        "longest_without_a_clock_s": round(w.stall(t_fault, t_back), 2),
        "recovered_after_start_s": round(t_back - t_start, 2),
    }


def worker_partition(w, after):
    _, s = w.until(
        "training with both workers",
        lambda s: running_past(after + SPACING)(s) and live(s, "worker-1") and live(s, "worker-0"),
        240,
    )
    clock = s["min_clock"]
    gone = live(s, "worker-1")[0]
    data = sorted(x for v in s["workers"] if v["live"] for x in v["data_shards"])
    network = f"{PROJECT}_default"
    cid = container("worker-1")
    t_fault = now()
    log(f"worker-partition: disconnect worker-1 (id {gone['id']}, data {gone['data_shards']}) "
        f"at clock {clock}")
    docker("network", "disconnect", network, cid)

    def taken_over(s):
        alive = [v for v in s["workers"] if v["live"]]
        return (
            not any(v["id"] == gone["id"] for v in alive)
            and sorted(x for v in alive for x in v["data_shards"]) == data
            and running_past(clock)(s)
        )

    t_over, s = w.until("the lease expires and the data moves", taken_over, 60)
    heir = [v for v in s["workers"] if v["live"]]
    log(f"worker-partition: lease expired, {[v['name'] for v in heir]} hold data {data}, "
        f"{t_over - t_fault:.1f} s after the disconnect")
    alone = s["min_clock"]
    _, s = w.until("the job goes on without it", running_past(alone + 100), 120)
    t_heal = now()
    docker("network", "connect", "--alias", "worker-1", network, cid)
    t_back, s = w.until("worker-1 rejoins", lambda s: bool(live(s, "worker-1")), 120)
    log(f"worker-partition: worker-1 rejoined {t_back - t_heal:.1f} s after the reconnect")
    return {
        "clock": clock,
        "data_shards_moved": gone["data_shards"],
        "lease_expired_and_data_moved_s": round(t_over - t_fault, 2),
        "longest_without_a_clock_s": round(w.stall(t_fault, t_over), 2),
        "clocks_without_it": s["min_clock"] - alone,
        "rejoined_after_reconnect_s": round(t_back - t_heal, 2),
    }


def restart_all(w, after):
    _, s = w.until("training", running_past(after + SPACING), 240)
    clock = s["min_clock"]
    t_fault = now()
    log(f"restart-all: stop every container at clock {clock}")
    compose("stop", "-t", "30")
    t_stopped = now()
    if w.poll() is not None:
        raise DrillFailed("the scheduler still answers with every container stopped")
    t_start = now()
    compose("start")
    t_back, s = w.until("the job resumes", running_past(clock), 180)
    # The job's clock as the restarted scheduler first reports it (clocks moved on while the
    # containers were stopping, so it may be past `clock`; a job restarted from 0 would not).
    first = min(c for t, _, c in w.history if t >= t_start)
    log(f"restart-all: first clock seen after the start {first}; running again "
        f"{t_back - t_start:.1f} s after the start")
    if first < clock:
        raise DrillFailed(f"after the restart the job was at clock {first}, before {clock}")
    return {
        "clock": clock,
        "first_clock_after": first,
        "stop_s": round(t_stopped - t_fault, 2),
        "longest_without_a_clock_s": round(w.stall(t_fault, t_back), 2),
        "recovered_after_start_s": round(t_back - t_start, 2),
    }


def prom(path, **params):
    """One call to Prometheus's HTTP API; its `data`."""
    url = f"{PROMETHEUS}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise DrillFailed(f"Prometheus refused {url}: {body}")
    return body["data"]


def dashboard():
    """Every query of every panel of the Grafana dashboard returns data from the cluster's
    Prometheus while the job trains, and every alerting rule is loaded and evaluates."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queries = [(p["title"], t["expr"]) for p in panels for t in p["targets"]]
    t0 = now()
    missing = queries
    while True:
        missing = [(title, e) for title, e in missing
                   if not prom("/api/v1/query", query=e)["result"]]
        if not missing or now() - t0 > 120:
            break
        time.sleep(5)
    if missing:
        raise DrillFailed(
            "dashboard queries without data after 120 s: "
            + "; ".join(f"{title}: {e}" for title, e in missing))
    rules = [r for g in prom("/api/v1/rules")["groups"] for r in g["rules"]]
    bad = [r["name"] for r in rules if r.get("health") != "ok"]
    if len(rules) < 6 or bad:
        raise DrillFailed(f"alerting rules: {len(rules)} loaded, failing: {bad}")
    firing = sorted({r["name"] for r in rules if r.get("state") == "firing"})
    took = round(now() - t0, 1)
    log(f"dashboard: {len(queries)} queries of {len(panels)} panels return data "
        f"(after {took} s); {len(rules)} alerting rules loaded, firing: {firing or 'none'}")
    return {"panels": len(panels), "queries": len(queries), "seconds": took,
            "rules": len(rules), "firing": firing}


def acknowledged():
    """Clocks each worker reported (each after its push was acknowledged), from the runs
    volume's steps files."""
    with tempfile.TemporaryDirectory() as d:
        docker("cp", f"{container('worker-0')}:/data/run", d)
        counts = {}
        for f in sorted(Path(d, "run").glob("steps-*.jsonl")):
            lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
            counts[f.stem.removeprefix("steps-")] = len(lines)
        return counts


def main():
    w = Watch()
    report = {"job": JOB, "table": TABLE}
    t_up = now()
    compose("up", "-d", "--quiet-pull")
    _, s = w.until("the first clock", lambda s: s["min_clock"] >= 1, 300)
    report["first_clock_s"] = round(now() - t_up, 2)
    log(f"cluster up, first clock after {report['first_clock_s']} s")
    report["dashboard"] = dashboard()
    drills = {}
    drills["shard-kill"] = shard_kill(w)
    drills["scheduler-restart"] = scheduler_restart(w, drills["shard-kill"]["clock"])
    drills["worker-partition"] = worker_partition(w, drills["scheduler-restart"]["clock"])
    drills["restart-all"] = restart_all(w, drills["worker-partition"]["clock"])
    report["drills"] = drills
    t_end, s = w.until("the job succeeds", lambda s: s["state"] == "succeeded", 600)
    report["clocks"] = s["min_clock"]
    report["wall_s"] = round(t_end - t_up, 2)
    log(f"job succeeded at clock {s['min_clock']}")
    # The evaluating worker writes the run's last files, then every worker leaves.
    for svc in ("worker-0", "worker-1"):
        docker("wait", container(svc))
    acked = acknowledged()
    out = compose(
        "exec", "-T", "scheduler",
        "psctl", "--scheduler", "http://127.0.0.1:7000", "--json", "pull", TABLE,
        capture=True,
    )
    stored = json.loads(out)
    total = sum(acked.values())
    # A push can be applied without its clock being reported: one per worker whose run was cut
    # (the partitioned worker, and both workers in the restart).
    cut = 3
    report["acknowledged"] = {"per_worker": acked, "total": total}
    report["stored"] = {k: stored[k] for k in ("len", "min", "max", "mean")}
    report["applied_beyond_acknowledged"] = stored["max"] - total
    log(f"acknowledged pushes {acked} = {total}; stored values min {stored['min']} "
        f"max {stored['max']} over {stored['len']} values")
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    if total < report["clocks"]:
        raise DrillFailed(f"{total} acknowledged pushes for {report['clocks']} clocks")
    if stored["min"] < total:
        raise DrillFailed(
            f"acknowledged pushes lost: a value counts {stored['min']} applied pushes, the "
            f"workers saw {total} acknowledged"
        )
    if stored["max"] > total + cut:
        raise DrillFailed(
            f"a value counts {stored['max']} applied pushes, more than the {total} acknowledged "
            f"and {cut} cut short: a push was applied twice"
        )
    log(f"every drill passed; report in {REPORT}")


if __name__ == "__main__":
    try:
        main()
    except DrillFailed as e:
        log(f"FAILED: {e}")
        sys.exit(1)
