"""Durable submissions under load: 8 concurrent HTTP clients submitting 1-GPU jobs.

Starts ``gpufence up --fake-gpus 8`` as its own process in a temporary data directory on the
real disk (the store commits every acknowledged submit with ``synchronous=FULL``: what is
measured includes the fsyncs), occupies every GPU with one 8-GPU job so that the submissions
queue, then, over HTTP on 127.0.0.1 only:

1. ``--clients`` threads (default 8), each on one keep-alive connection, POST ``--jobs`` 1-GPU
   jobs in all (default 10,000), each with its own ``Idempotency-Key``; a submit counts once its
   201 arrived (the job is durable then). Reported: submits per second over the whole run and
   the p50/p99 latency of one submit;
2. with all of them queued, ``--lists`` ``GET /v1/jobs?state=pending&limit=1000`` calls (a
   page of 1,000 jobs with their pending reasons) at random pages (``after=``), from
   ``--list-clients`` clients (default 1): their p99 latency;
3. every acknowledged id is in the store (read back through the API): ``lost`` = those that
   are not.

Targets: >= 1,000 submits/s, submit p99 <= 50 ms, list p99 <= 100 ms, lost = 0 (exit 1 if
missed). Prints, last: ``submits_per_s=... submit_p99_ms=... list_p99_ms=... lost=0``. The
figures depend on the machine: run it alone, and note the load (``uptime``) it ran under.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from gpufence.control.http.client import Client
from gpufence.demo.joblogs import percentile


class Conn:
    """One keep-alive HTTP/1.1 connection of one client thread."""

    def __init__(self, url: str, token: str) -> None:
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.auth = f"Bearer {token}"
        self.c = http.client.HTTPConnection(self.host, self.port, timeout=60)

    def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Any:
        status, data = self.raw(method, path, body, headers)
        return status, json.loads(data) if data else None

    def raw(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """Status and body bytes: the latency measured ends when the whole answer arrived."""
        hdrs = {"Authorization": self.auth, **headers}
        if body is not None:
            hdrs["Content-Type"] = "application/json"
        try:
            self.c.request(method, path, body=body, headers=hdrs)
            resp = self.c.getresponse()
        except (http.client.HTTPException, OSError):
            self.c.close()
            self.c = http.client.HTTPConnection(self.host, self.port, timeout=60)
            self.c.request(method, path, body=body, headers=hdrs)
            resp = self.c.getresponse()
        return resp.status, resp.read()


def _up(data: Path) -> tuple[subprocess.Popen[bytes], Client]:
    cmd = [sys.executable, "-m", "gpufence", "up", "--fake-gpus", "8", "--data", str(data)]
    cmd += ["--port", "0", "--log-level", "warning"]
    log = (data.parent / "server.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    end = time.monotonic() + 60
    while not (data / "server.json").exists():
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"server did not start: {(data.parent / 'server.log').read_text()}")
        time.sleep(0.05)
    return proc, Client(data_dir=data)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--lists", type=int, default=200)
    ap.add_argument(
        "--list-clients",
        type=int,
        default=1,
        help="clients listing at once (1: the latency of a list call itself)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufence-submit-", dir=os.getcwd()) as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        proc, client = _up(data)
        try:
            return run(client, args)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def run(client: Client, args: argparse.Namespace) -> int:
    blocker = client.submit({"command": ["sleep", "3600"], "gpus": 8})["id"]
    try:
        while client.job(blocker)["state"] != "running":
            time.sleep(0.05)
        return measure(client, args)
    finally:  # jobs outlive their server by design: leave nothing running behind
        client.cancel(blocker)
        while client.job(blocker)["state"] not in ("cancelled", "failed", "done"):
            time.sleep(0.05)


def measure(client: Client, args: argparse.Namespace) -> int:
    token = client.token()
    body = json.dumps({"command": ["true"], "gpus": 1, "cwd": "/"}).encode()
    latencies: list[list[float]] = [[] for _ in range(args.clients)]
    acked: list[list[str]] = [[] for _ in range(args.clients)]
    errors: list[str] = []
    per = [args.jobs // args.clients + (i < args.jobs % args.clients) for i in range(args.clients)]
    start = threading.Barrier(args.clients + 1)

    def submitter(i: int) -> None:
        conn = Conn(client.url, token)
        start.wait()
        for _ in range(per[i]):
            t0 = time.perf_counter()
            status, out = conn.request(
                "POST", "/v1/jobs", body, {"Idempotency-Key": str(uuid.uuid4())}
            )
            latencies[i].append(time.perf_counter() - t0)
            if status != 201:
                errors.append(f"{status}: {out}")
                continue
            acked[i].append(out["id"])

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ids = [j for a in acked for j in a]
    submit_lat = [x for lat in latencies for x in lat]
    rate = len(ids) / wall
    print(
        f"submitted {len(ids)} in {wall:.2f} s from {args.clients} clients; "
        f"p50 {percentile(submit_lat, 50) * 1000:.1f} ms, errors {len(errors)}",
        file=sys.stderr,
    )
    for e in errors[:5]:
        print(f"  {e}", file=sys.stderr)

    # 2. lists with everything queued
    seqs = sorted(int(j[1:]) for j in ids)
    list_lat: list[list[float]] = [[] for _ in range(args.list_clients)]

    def lister(i: int) -> None:
        conn = Conn(client.url, token)
        rnd = random.Random(i)
        for _ in range(args.lists // args.list_clients):
            after = rnd.choice(seqs[: max(1, len(seqs) - 1000)]) if seqs else 0
            t = time.perf_counter()
            status, raw = conn.raw(
                "GET", f"/v1/jobs?state=pending&limit=1000&after={after}", None, {}
            )
            list_lat[i].append(time.perf_counter() - t)
            if status != 200 or len(json.loads(raw)["jobs"]) == 0:
                errors.append(f"list {status}")

    threads = [threading.Thread(target=lister, args=(i,)) for i in range(args.list_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lists = [x for lat in list_lat for x in lat]

    # 3. every acknowledged job is in the store
    stored: set[str] = set()
    after = 0
    while True:
        page = client.jobs(limit=10_000, after=after)
        if not page:
            break
        stored |= {j["id"] for j in page}
        after = page[-1]["seq"]
    lost = len(set(ids) - stored)
    submit_p99 = percentile(submit_lat, 99) * 1000
    list_p99 = percentile(lists, 99) * 1000
    print(
        f"list p50 {percentile(lists, 50) * 1000:.1f} ms over {len(lists)} calls", file=sys.stderr
    )
    print(
        f"submits_per_s={rate:.0f} submit_p99_ms={submit_p99:.1f} list_p99_ms={list_p99:.1f} "
        f"lost={lost}"
    )
    ok = rate >= 1000 and submit_p99 <= 50 and list_p99 <= 100 and lost == 0 and not errors
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
