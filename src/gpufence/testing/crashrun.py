"""Fault injection: run a mixed workload through ``gpufence up`` while crashing it, then check
the history from the jobs' own logs.

One *run* = one data directory, one workload, a *plan* of crashes. The controller starts
``gpufence up`` (a real subprocess on 127.0.0.1) with ``$GPUFENCE_FAILPOINTS`` naming the next
crash point (``control/failpoints.py``), or kills it with SIGKILL after a random delay; when it
dies it starts the next one. A submitter thread sends the workload throughout, each job with its
own Idempotency-Key, retrying across the restarts. After the plan, a clean server runs until
every job has ended. The checks then read the attempt directories (the programs' start/end
lines, the launchers' records) and the store:

* ``lost``: acknowledged jobs that are not ``done`` exactly once (a completed attempt in their
  logs and ``done`` in the store);
* ``double_runs``: an attempt (or a rank of it) started twice, or a job completed twice;
* ``overlaps``: two processes on one GPU at the same instant;
* ``disagreements``: the store says otherwise than the logs (state, attempt, exit codes).

The workload: 1-, 2- and 4-GPU training jobs, 2-replica gangs, interactive jobs, and a
checkpointing training job that a serving surge preempts (fenced partitions, incident
preemption), all the ``gpufence.demo.programs`` so their logs carry start/end lines.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufence.control.base.failpoints import POINTS
from gpufence.control.base.member_records import exit_file
from gpufence.control.containment.cgroup import ContainmentError
from gpufence.control.containment.members import Containment
from gpufence.control.executors.leftovers import kill_cgroup, live_member_pids, recorded_ranks
from gpufence.control.gpus.discovery import fake_gpus, node_spec
from gpufence.control.http.client import Client, ClientError
from gpufence.control.recovery.live_scan import attempt_dirs, member_cgroups
from gpufence.control.store import database as st

JOB = [sys.executable, "-m", "gpufence.demo.programs"]
RANDOM = "random"
MAX_ATTEMPTS = 30


def crash_config(gpus: int = 8) -> dict[str, Any]:
    """8 fake GPUs: serving 0-1 (incident preemption from training), training 2-5,
    interactive 6-7."""
    spec = copy.deepcopy(node_spec(fake_gpus(gpus)))
    group = spec["node_groups"][0]["name"]
    spec["name"] = "crash-run"
    spec["partitions"] = {
        "serving": {
            "gpus": [f"{group}:0-1"],
            "admits": ["serving"],
            "sharing": "exclusive",
            "backfill": False,
            "preemption": {
                "mode": "incident-only",
                "from": ["training"],
                "budget": 100,
                "window_s": 3600,
                "min_runtime_s": 0,
                "grace_s": 5,
            },
        },
        "training": {"gpus": [f"{group}:2-5"], "admits": ["training"], "sharing": "exclusive"},
        "interactive": {"gpus": [f"{group}:6-7"], "admits": ["interactive"]},
    }
    spec.pop("queues", None)
    spec["control"] = {"stop_grace_s": 3}
    return spec


def workload(rnd: random.Random, scale: int = 1) -> list[dict[str, Any]]:
    """The mixed jobs of one run, in submission order."""

    def prog(*args: str, **fields: Any) -> dict[str, Any]:
        return {"command": [*JOB, *args], "max_attempts": MAX_ATTEMPTS, **fields}

    def short() -> str:
        return f"{rnd.uniform(0.3, 0.9):.2f}"

    jobs: list[dict[str, Any]] = []
    for _ in range(scale):
        jobs += [prog("sleep", short(), gpus=1) for _ in range(6)]
        jobs += [prog("sleep", short(), gpus=2) for _ in range(2)]
        jobs.append(prog("sleep", short(), gpus=4))
        jobs += [prog("sleep", short(), gpus=1, replicas=2) for _ in range(2)]
        jobs += [prog("sleep", short(), gpus=1, **{"class": "interactive"}) for _ in range(2)]
        jobs.append(
            prog(
                "train",
                "--steps",
                "30",
                "--step-s",
                "0.05",
                "--ckpt-every",
                "5",
                gpus=4,
                checkpointable=True,
            )
        )
        jobs += [prog("serve", "--seconds", "1.0", **{"class": "serving"}) for _ in range(3)]
    return jobs


HITS = {
    "executor.between-spawns": (1, 1),  # a gang spawn: a few per run
    "reconciler.after-spawn": (1, 3),
    "reconciler.after-exit-commit": (1, 3),
    "reconciler.after-inbox-commit": (1, 3),
}
"""Which hit of a point a crash is at: 1..N, N small for points reached rarely."""


def plan(rnd: random.Random, crashes: int) -> list[tuple[str, float]]:
    """``crashes`` crash specs: every named point in turn at a random hit (``HITS``, else 1..8),
    every third one a kill at a random moment instead (``("random", delay_s)``). The launcher's
    point crashes launchers, not the server: its server is killed at a random moment too."""
    names = sorted(POINTS)
    out: list[tuple[str, float]] = []
    for i in range(crashes):
        name = names[(i - i // 3) % len(names)]
        if i % 3 == 2:
            out.append((RANDOM, rnd.uniform(0.0, 2.0)))
        elif name.startswith("launcher."):
            out.append((name, rnd.uniform(0.5, 2.0)))
        else:
            lo, hi = HITS.get(name, (1, 8))
            out.append((name, float(rnd.randint(lo, hi))))
    return out


@dataclass
class Report:
    jobs: int = 0
    crash_points: int = 0
    failpoint_crashes: int = 0
    random_kills: int = 0
    lost: list[str] = field(default_factory=list)
    double_runs: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.double_runs or self.overlaps or self.disagreements)

    def add(self, other: Report) -> None:
        self.jobs += other.jobs
        self.crash_points += other.crash_points
        self.failpoint_crashes += other.failpoint_crashes
        self.random_kills += other.random_kills
        self.lost += other.lost
        self.double_runs += other.double_runs
        self.overlaps += other.overlaps
        self.disagreements += other.disagreements

    def line(self) -> str:
        return (
            f"crash_points={self.crash_points} jobs={self.jobs} lost={len(self.lost)} "
            f"double_runs={len(self.double_runs)} overlaps={len(self.overlaps)} "
            f"disagreements={len(self.disagreements)}"
        )


class Server:
    """One ``gpufence up`` process on the run's data directory."""

    def __init__(self, data: Path, config: Path, failpoint: str | None) -> None:
        env = dict(os.environ)
        env.pop("GPUFENCE_FAILPOINTS", None)
        if failpoint:
            env["GPUFENCE_FAILPOINTS"] = failpoint
        self.log = data.parent / f"server-{time.monotonic_ns()}.log"
        cmd = [sys.executable, "-m", "gpufence", "up", "--fake-gpus", "8", "--config"]
        cmd += [str(config), "--data", str(data), "--port", "0", "--log-level", "warning"]
        cmd += ["--no-context"]  # a test run must not touch the user's client config
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_serving(self, data: Path, limit_s: float = 30.0) -> bool:
        """Until it listens (``server.json`` names it); False if it died or took too long."""
        end = time.monotonic() + limit_s
        while self.alive() and time.monotonic() < end:
            try:
                if json.loads((data / "server.json").read_text())["pid"] == self.proc.pid:
                    return True
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.02)
        return False

    def kill(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


class Submitter(threading.Thread):
    """Sends the workload, one job every ``gap_s``, each with its own key, until acknowledged."""

    def __init__(self, data: Path, jobs: list[dict[str, Any]], gap_s: float) -> None:
        super().__init__(name="crashrun-submitter", daemon=True)
        self.data, self.jobs, self.gap_s = data, jobs, gap_s
        self.acked: list[str] = []
        self.stop_flag = threading.Event()
        self.refused: str | None = None
        """A submit the server refused for good (a 500, a 422): the run has failed."""

    def run(self) -> None:
        try:
            self._submit_all()
        except ClientError as exc:
            self.refused = str(exc)

    def _submit_all(self) -> None:
        for req in self.jobs:
            key = str(uuid.uuid4())
            while not self.stop_flag.is_set():
                if not (self.data / "admin.token").exists():  # the first server is starting
                    time.sleep(0.1)
                    continue
                try:
                    self.acked.append(
                        Client(data_dir=self.data).submit(req, key, patience_s=0)["id"]
                    )
                    break
                except ClientError as exc:
                    if not exc.retry:
                        raise
                    time.sleep(0.1)
            time.sleep(self.gap_s)


def _failpoint(name: str, arg: float) -> str | None:
    """The server's failpoint setting for one crash spec (None: a kill at a random moment)."""
    if name == RANDOM:
        return None
    if name.startswith("launcher."):
        return f"{name}=crash"
    return f"{name}=crash@{int(arg)}"


def _crash(server: Server, data: Path, rnd: random.Random, name: str, arg: float) -> bool:
    """Let ``server`` run into its crash, then kill it; whether its failpoint fired."""
    if name == RANDOM or name.startswith("launcher."):
        # a kill -9 at a random moment of its work (or of its start-up)
        if rnd.random() < 0.75:
            server.wait_serving(data)
        time.sleep(arg)
        fired = False
    else:
        # the window opens once it serves (or died on the way): under load its start-up
        # (imports, recovery) alone takes seconds
        server.wait_serving(data)
        end = time.monotonic() + 6.0
        while server.alive() and time.monotonic() < end:
            time.sleep(0.02)
        fired = not server.alive()
    server.kill()
    return fired


def run_once(root: Path, seed: int, crashes: int, scale: int = 1, timeout_s: float = 240) -> Report:
    """One run in ``root`` (created): ``crashes`` crashes, then everything to the end."""
    rnd = random.Random(seed)
    data = root / "data"
    data.mkdir(parents=True)
    config = root / "cluster.yaml"
    config.write_text(yaml.safe_dump(crash_config()), encoding="utf-8")
    report = Report()
    sub = Submitter(data, workload(rnd, scale), gap_s=0.15)
    deadline = time.monotonic() + timeout_s
    started = False
    for name, arg in plan(rnd, crashes):
        if started and not sub.is_alive() and _all_ended(data, sub):
            break  # nothing left to crash into
        server = Server(data, config, _failpoint(name, arg))
        if not started:
            sub.start()
            started = True
        fired = _crash(server, data, rnd, name, arg)
        report.crash_points += 1
        report.failpoint_crashes += fired
        report.random_kills += not fired
        if time.monotonic() > deadline:
            break
    server = Server(data, config, None)
    try:
        sub.join(max(1.0, deadline - time.monotonic()))
        _wait_all_ended(data, sub, deadline)
    finally:
        sub.stop_flag.set()
        server.stop()
        kill_leftovers(data)
    check(data, sub.acked, report)
    if sub.refused is not None:
        report.lost.append(f"a submit was refused, the rest never sent: {sub.refused}")
    return report


def kill_leftovers(data: Path, only: str | None = None) -> None:
    """Jobs outlive their server by design; a run that ran out of time must not leave any
    (nor their cgroups, when the server ran with containment). ``only``: that job's alone."""
    try:
        containment: Containment | None = Containment.detect()
    except ContainmentError:
        containment = None
    for jdir in data.glob(f"jobs/{only or 'j*'}"):
        for attempt, adir in attempt_dirs(jdir):
            ranks = max(recorded_ranks(adir), default=0) + 1
            for cg in member_cgroups(containment, jdir.name, attempt, adir, ranks):
                if cg is not None:
                    kill_cgroup(cg, 5.0)
            for pid in live_member_pids(adir):  # a launcher (its group) or a dead one's leftover
                for kill in (os.killpg, os.kill):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        kill(pid, signal.SIGKILL)
    if containment is not None:
        containment.release()


def _all_ended(data: Path, sub: Submitter) -> bool:
    """Every acknowledged job has ended (read from the store file: no server needed)."""
    try:
        with st.Reader(data / st.DB_NAME) as r:
            rows = r.jobs(limit=10**9)
    except (st.StoreUnavailable, OSError):
        return False
    ended = {row.id for row in rows if row.state in st.TERMINAL}
    return len(sub.acked) == len(sub.jobs) and set(sub.acked) <= ended


def _wait_all_ended(data: Path, sub: Submitter, deadline: float) -> None:
    while time.monotonic() < deadline:
        if not sub.is_alive() and _all_ended(data, sub):
            return
        time.sleep(0.2)


# ---------------------------------------------------------------------- checks
def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _exit_end(path: Path) -> float | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("ended_unix")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None


@dataclass
class _RankLogs:
    """What the ranks' own logs say happened, independent of the store."""

    # how many times each (job, attempt, rank) logged a start: more than once is a double run
    starts: dict[tuple[str, int, int], int] = field(default_factory=lambda: defaultdict(int))
    # ranks of each (job, attempt) that ended with code 0
    ok_ranks: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    # (device, start, end, who): when each rank held each of its GPUs
    spans: list[tuple[str, float, float, str]] = field(default_factory=list)


def _rank_end(
    out: Path, end: dict[str, Any] | None, attempts: list[st.AttemptRow], attempt: int, rank: int
) -> float:
    """When a rank stopped holding its GPUs: its log's end, else its exit file, else the
    store's end of the attempt, else never (it may still run)."""
    if end is not None:
        return float(end["t"])
    t_end = _exit_end(exit_file(out.parent, rank))
    if t_end is not None:
        return t_end
    ended = next((a.ended_at for a in attempts if a.attempt == attempt), None)
    return ended if ended is not None else float("inf")


def _read_rank_logs(data: Path, attempts: dict[str, list[st.AttemptRow]]) -> _RankLogs:
    logs = _RankLogs()
    for out in sorted(data.glob("jobs/*/attempt-*/rank-*.out")):
        lines = _lines(out)
        start = next((x for x in lines if x.get("ev") == "start"), None)
        if start is None:
            continue
        jid, attempt = out.parent.parent.name, int(out.parent.name.split("-")[1])
        rank = int(out.name.split("-")[1].split(".")[0])
        logs.starts[(jid, attempt, rank)] += sum(1 for x in lines if x.get("ev") == "start")
        end = next((x for x in lines if x.get("ev") == "end"), None)
        if end is not None and end.get("code") == 0:
            logs.ok_ranks[(jid, attempt)] += 1
        t_end = _rank_end(out, end, attempts.get(jid, []), attempt, rank)
        for dev in str(start.get("devices", "")).split(","):
            if dev:
                logs.spans.append((dev, float(start["t"]), t_end, f"{jid}/{attempt}/r{rank}"))
    return logs


def _completed(logs: _RankLogs, rows: dict[str, st.JobRow]) -> dict[str, list[int]]:
    """Each job's completed attempts: every rank of the gang ended with code 0 (a rank that
    finished while its gang was only partly spawned did not complete the job)."""
    completed: dict[str, list[int]] = defaultdict(list)
    for (jid, attempt), n in sorted(logs.ok_ranks.items()):
        row = rows.get(jid)
        if row is not None and n >= int(row.spec.get("replicas", 1)):
            completed[jid].append(attempt)
    return completed


def _check_double_runs(logs: _RankLogs, completed: dict[str, list[int]], report: Report) -> None:
    for key, n in logs.starts.items():
        if n > 1:
            report.double_runs.append(f"{key[0]} attempt {key[1]} rank {key[2]} started {n}x")
    for jid, done in completed.items():
        if len(done) > 1:
            report.double_runs.append(f"{jid} completed {len(done)}x (attempts {done})")


def _check_store_agrees(
    acked: list[str],
    rows: dict[str, st.JobRow],
    attempts: dict[str, list[st.AttemptRow]],
    completed: dict[str, list[int]],
    report: Report,
) -> None:
    """Every acknowledged job is done in the store and in the logs, on the same attempt with
    exit codes 0; and nothing is done in the store that the logs never completed."""
    for jid in acked:
        row = rows.get(jid)
        done = completed.get(jid, [])
        if row is None or row.state != st.DONE or not done:
            state = row.state if row else "missing"
            report.lost.append(f"{jid}: {state}, completed attempts {done}")
            continue
        if row.attempt != done[-1]:
            report.disagreements.append(f"{jid}: store attempt {row.attempt}, logs {done}")
        att = next((a for a in attempts[jid] if a.attempt == row.attempt), None)
        if att is None or not att.exit_codes or any(c != 0 for c in att.exit_codes):
            report.disagreements.append(f"{jid}: store exit codes {att and att.exit_codes}")
    for jid, row in rows.items():
        if row.state == st.DONE and jid not in completed:
            report.disagreements.append(f"{jid}: done in the store, no completed run in logs")


def _check_overlaps(spans: list[tuple[str, float, float, str]], report: Report) -> None:
    """No GPU ran two ranks at once: per device, each start is after every earlier end."""
    by_dev: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for dev, t0, t1, who in spans:
        by_dev[dev].append((t0, t1, who))
    for dev, items in by_dev.items():
        items.sort()
        reach, holder = -float("inf"), ""
        for t0, t1, who in items:
            if t0 < reach:
                report.overlaps.append(f"GPU {dev}: {who} started at {t0:.3f}, {holder} ran on")
            if t1 > reach:
                reach, holder = t1, who


def check(data: Path, acked: list[str], report: Report) -> None:
    report.jobs = len(acked)
    with st.Reader(data / st.DB_NAME) as r:
        rows = {row.id: row for row in r.jobs(limit=10**9)}
        attempts = {jid: r.attempts(jid) for jid in rows}
    logs = _read_rank_logs(data, attempts)
    completed = _completed(logs, rows)
    _check_double_runs(logs, completed, report)
    _check_store_agrees(acked, rows, attempts, completed, report)
    _check_overlaps(logs.spans, report)
