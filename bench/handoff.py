"""GPU hand-off and API submission on the seed's 66-job case, through a real `gpufence up`.

Starts `gpufence up --fake-gpus 8` as its own process in a temporary data directory, then, over
HTTP on 127.0.0.1 only:

1. submits the 66-job case (66 one-GPU jobs: `sleep JOB_S`, default 2 s) and waits for all of
   them. From the launcher's records of every process (exec'd at, reaped at, devices; written
   by each job's parent, not by the scheduler) it measures the makespan (first exec -> last
   exit) against ideal = ceil(66 / 8) x job-s, the GPU hand-off gaps (a process reaped -> the
   next process exec'd on that GPU) and oversubscription (most processes on one GPU at once,
   minus one). The control plane's own share of each hand-off (exit seen -> next process
   spawned) comes from its /metrics histogram;
2. occupies the whole machine with one 8-GPU job, then submits `--submit-n` one-GPU jobs (which
   queue) from `--clients` concurrent clients and reports accepted submissions per second.

Containment is on, as in `gpufence up` by default (each job in its own cgroup, joined before
exec); `--no-containment` measures the same without it.

Prints, last: makespan_over_ideal=R handoff_p50_ms=A handoff_p99_ms=B submit_per_s=S
oversubscribed=N containment=MODE. Exits 1 when a target is missed (makespan within 2 %,
hand-off p50 <= 20 ms and p99 <= 100 ms, >= 300 submissions/s, 0 oversubscribed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpufence.control.base.containment_settings import ContainmentSettings
from gpufence.control.base.member_records import RECORDS_SUFFIX
from gpufence.control.containment.cgroup import ContainmentError
from gpufence.control.containment.members import Containment, member_cgroup_name
from gpufence.control.http.client import Client
from gpufence.demo import joblogs

JOB = [sys.executable, "-m", "gpufence.demo.programs"]
SLEEP = "sleep"  # coreutils: a job whose own start-up costs ~nothing, so the gaps are ours


def _start_server(data: Path, contain: bool) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "gpufence", "up", "--fake-gpus", "8", "--data", str(data)]
    cmd += ["--port", "0"]
    if not contain:
        cmd.append("--no-containment")
    log = open(data.parent / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (data / "server.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"server did not start; see {data.parent / 'server.log'}")
        time.sleep(0.05)
    return proc


def _wait_done(client: Client, ids: list[str], limit_s: float) -> None:
    end = time.monotonic() + limit_s
    want = set(ids)
    while time.monotonic() < end:
        jobs = client.jobs(limit=10_000)
        left = [j for j in jobs if j["id"] in want and j["state"] not in ("done", "failed")]
        if not left:
            failed = [j["id"] for j in jobs if j["id"] in want and j["state"] == "failed"]
            if failed:
                raise SystemExit(f"jobs failed: {failed[:5]}")
            return
        time.sleep(0.25)
    raise SystemExit("timed out waiting for the 66 jobs")


def _submit_many(client: Client, n: int, clients: int) -> float:
    body = {"command": [*JOB, "sleep", "1"], "gpus": 1}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda _i: client.submit(body), range(n)))
    dt = time.perf_counter() - t0
    bad = [r for r in results if r.get("state") == "rejected"]
    if bad:
        raise SystemExit(f"{len(bad)} submissions rejected: {bad[0]}")
    return n / dt


def _histogram_mean(client: Client, name: str) -> float:
    with urllib.request.urlopen(client.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    values = {}
    for line in text.splitlines():
        for part in ("_sum", "_count"):
            if line.startswith(name + part + " "):
                values[part] = float(line.split()[-1])
    return values["_sum"] / values["_count"] if values.get("_count") else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=66)
    ap.add_argument("--job-s", type=float, default=2.0)
    ap.add_argument("--submit-n", type=int, default=600)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    ap.add_argument(
        "--no-containment", action="store_true", help="run `gpufence up --no-containment`"
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpufence-handoff-"))
    data = tmp / "data"
    server = _start_server(data, contain=not args.no_containment)
    try:
        client = Client(data_dir=data)
        ids = [
            client.submit({"command": [SLEEP, str(args.job_s)], "gpus": 1})["id"]
            for _ in range(args.jobs)
        ]
        _wait_done(client, ids, limit_s=args.jobs * args.job_s + 120)
        runs = [r for r in joblogs.process_runs(data, node="local-0") if r.job in set(ids)]
        ctl = _histogram_mean(client, "gpufence_gpu_handoff_seconds")
        ideal = math.ceil(args.jobs / 8) * args.job_s
        span = joblogs.makespan(runs)
        gaps = joblogs.handoff_gaps(runs)
        over = joblogs.max_per_device(runs) - 1
        blocker = client.submit({"command": [*JOB, "serve"], "gpus": 8})["id"]
        rate = _submit_many(client, args.submit_n, args.clients)
        client.cancel(blocker)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
        _remove_cgroups(data)
    mode = _containment_mode(tmp / "server.log")
    p50 = joblogs.percentile(gaps, 50) * 1000
    p99 = joblogs.percentile(gaps, 99) * 1000
    ratio = span / ideal
    print(
        json.dumps(
            {
                "jobs": len(ids),
                "makespan_s": round(span, 3),
                "ideal_s": ideal,
                "handoffs": len(gaps),
                "handoff_max_ms": round(max(gaps, default=0) * 1000, 1),
                "control_plane_share_mean_ms": round(ctl * 1000, 2),
                "containment": mode,
                "data": str(data) if args.keep else None,
            }
        ),
        file=sys.stderr,
    )
    print(
        f"makespan_over_ideal={ratio:.4f} handoff_p50_ms={p50:.1f} handoff_p99_ms={p99:.1f} "
        f"submit_per_s={rate:.0f} oversubscribed={over} containment={mode.split()[0]}"
    )
    if not args.keep:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    ok = ratio <= 1.02 and p50 <= 20 and p99 <= 100 and rate >= 300 and over == 0
    return 0 if ok else 1


def _remove_cgroups(data: Path) -> None:
    """The server left its last jobs running (they would be adopted by the next `up` on this
    data dir, which the benchmark deletes): kill them and remove their cgroups."""
    try:
        contain = Containment.detect(ContainmentSettings(prestarted=0))
    except ContainmentError:
        return  # --no-containment on a machine without it: nothing to remove
    for records in data.glob(f"jobs/*/attempt-*{RECORDS_SUFFIX}"):
        adir = records.with_name(records.name.removesuffix(RECORDS_SUFFIX))
        attempt = int(adir.name.removeprefix("attempt-"))
        for pid_record in records.glob("rank-*.pid"):
            rank = int(pid_record.stem.removeprefix("rank-"))
            name = member_cgroup_name(adir.parent.name, attempt, adir, rank)
            cg = contain.driver.open(name)
            if cg is None:
                continue
            with contextlib.suppress(ContainmentError):
                cg.kill()
            for _ in range(200):
                if cg.empty():
                    break
                time.sleep(0.01)
            cg.remove()
    contain.sweep()


def _containment_mode(server_log: Path) -> str:
    """What the server said about containment: "cgroup v1 (...) under ..." or "off"."""
    try:
        text = server_log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown"
    for line in text.splitlines():
        if "containment: " in line:
            return line.split("containment: ", 1)[1].replace("cgroup ", "")
    return "off" if "CONTAINMENT IS OFF" in text else "unknown"


if __name__ == "__main__":
    sys.exit(main())
