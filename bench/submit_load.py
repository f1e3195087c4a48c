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

Also printed (stderr): the CPU per submit of the server and of the clients, the figure that
does not follow the load of a shared machine.

Targets: >= 1,000 submits/s, submit p99 <= 50 ms, list p99 <= 100 ms, lost = 0 (exit 1 if
missed). Prints, last: ``submits_per_s=... submit_p99_ms=... list_p99_ms=... lost=0``. The
figures depend on the machine: run it alone, and note the load (``uptime``) it ran under.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import random
import signal
import socket
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


class LeanConn:
    """A light HTTP/1.1 client for the submits: one keep-alive socket, the request written in
    one ``send``, the answer read by its ``Content-Length``. http.client costs ~0.5 ms of CPU
    per request, which on a 2-core machine takes a good part of the cores from the server it
    measures (``--client http.client`` measures with it)."""

    def __init__(self, url: str, token: str) -> None:
        u = urllib.parse.urlsplit(url)
        self.addr = (u.hostname or "127.0.0.1", u.port or 80)
        self.head = (
            f"POST /v1/jobs HTTP/1.1\r\nHost: {u.netloc}\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\n"
        ).encode()
        self.sock = self._connect()
        self.buf = b""

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.addr, timeout=60)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def submit(self, body: bytes, key: str) -> tuple[int, bytes]:
        req = b"%sIdempotency-Key: %s\r\nContent-Length: %d\r\n\r\n%s" % (
            self.head,
            key.encode(),
            len(body),
            body,
        )
        try:
            return self._exchange(req)
        except OSError:  # the same key again: a retry cannot make a second job
            self.sock.close()
            self.sock, self.buf = self._connect(), b""
            return self._exchange(req)

    def _exchange(self, req: bytes) -> tuple[int, bytes]:
        self.sock.sendall(req)
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._more()
        head, self.buf = self.buf[:end].decode("latin-1"), self.buf[end + 4 :]
        lines = head.split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
        size = fields.get("content-length")
        if size is None:
            raise OSError(f"answer {status} without Content-Length")
        n = int(size)
        while len(self.buf) < n:
            self._more()
        body, self.buf = self.buf[:n], self.buf[n:]
        if fields.get("connection", "").lower() == "close":
            self.sock.close()
            self.sock, self.buf = self._connect(), b""
        return status, body

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise OSError("connection closed by the server")
        self.buf += data


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
    ap.add_argument(
        "--client",
        choices=("lean", "http.client"),
        default="lean",
        help="the submitting clients' HTTP code: a light one (default; see LeanConn) or the "
        "standard library's http.client (costs the 2 cores more CPU)",
    )
    ap.add_argument(
        "--threads",
        action="store_true",
        help="the clients as threads of this process (sharing one GIL: their CPU is "
        "serialized) rather than a process each",
    )
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
            return run(client, args, proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


Result = tuple[list[float], list[str], list[str], float]  # latencies, ids, errors, CPU s


def submitter(url: str, token: str, body: bytes, n: int, start: Any, lean_client: bool) -> Result:
    """One client: ``n`` submits on one keep-alive connection, each with its own key."""
    lean = LeanConn(url, token) if lean_client else None
    conn = Conn(url, token)
    latencies: list[float] = []
    acked: list[str] = []
    errors: list[str] = []
    start.wait()
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        key = str(uuid.uuid4())
        if lean is not None:
            status, raw = lean.submit(body, key)
            out = json.loads(raw)
        else:
            status, out = conn.request("POST", "/v1/jobs", body, {"Idempotency-Key": key})
        latencies.append(time.perf_counter() - t0)
        if status != 201:
            errors.append(f"{status}: {out}")
            continue
        acked.append(out["id"])
    return latencies, acked, errors, time.process_time() - cpu0


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process ``pid`` used so far (Linux: /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(client: Client, args: argparse.Namespace, server_pid: int) -> int:
    blocker = client.submit({"command": ["sleep", "3600"], "gpus": 8})["id"]
    try:
        while client.job(blocker)["state"] != "running":
            time.sleep(0.05)
        return measure(client, args, server_pid)
    finally:  # jobs outlive their server by design: leave nothing running behind
        client.cancel(blocker)
        while client.job(blocker)["state"] not in ("cancelled", "failed", "done"):
            time.sleep(0.05)


def measure(client: Client, args: argparse.Namespace, server_pid: int) -> int:
    token = client.token()
    body = json.dumps({"command": ["true"], "gpus": 1, "cwd": "/"}).encode()
    lean = args.client == "lean"
    per = [args.jobs // args.clients + (i < args.jobs % args.clients) for i in range(args.clients)]
    if args.threads:  # one process: the clients share one GIL (their own CPU is serialized)
        results: list[Result] = [([], [], [], 0.0) for _ in range(args.clients)]
        start: Any = threading.Barrier(args.clients + 1)

        def one(i: int) -> None:
            results[i] = submitter(client.url, token, body, per[i], start, lean)

        workers = [threading.Thread(target=one, args=(i,)) for i in range(args.clients)]
        for w in workers:
            w.start()
        start.wait()
        t0, server0, cpu0 = time.perf_counter(), cpu_s(server_pid), time.process_time()
        for w in workers:
            w.join()
        # process_time is the whole process's: each thread's own figure counts all of them
        results = [(*r[:3], 0.0) for r in results]
        results[0] = (*results[0][:3], time.process_time() - cpu0)
    else:  # a process per client, as separate clients are (each on one connection)
        ctx = mp.get_context("fork")  # inherits the barrier and the queue
        start = ctx.Barrier(args.clients + 1)
        out: Any = ctx.SimpleQueue()

        def proc(n: int) -> None:
            out.put(submitter(client.url, token, body, n, start, lean))

        procs = [ctx.Process(target=proc, args=(per[i],)) for i in range(args.clients)]
        for p in procs:
            p.start()
        start.wait()
        t0, server0 = time.perf_counter(), cpu_s(server_pid)
        results = [out.get() for _ in procs]
        for p in procs:
            p.join()
    wall = time.perf_counter() - t0
    server_cpu = cpu_s(server_pid) - server0
    client_cpu = sum(r[3] for r in results)
    latencies = [r[0] for r in results]
    acked = [r[1] for r in results]
    errors = [e for r in results for e in r[2]]
    ids = [j for a in acked for j in a]
    submit_lat = [x for lat in latencies for x in lat]
    rate = len(ids) / wall
    print(
        f"submitted {len(ids)} in {wall:.2f} s from {args.clients} clients; "
        f"p50 {percentile(submit_lat, 50) * 1000:.1f} ms, errors {len(errors)}",
        file=sys.stderr,
    )
    # on a shared machine the rate follows the CPU left over: the CPU each submit costs is the
    # figure that does not (the rate this machine could reach = its cores / the sum of both)
    n = max(1, len(ids))
    print(
        f"CPU per submit: server {server_cpu / n * 1000:.2f} ms, "
        f"client {client_cpu / n * 1000:.2f} ms; load {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores",
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
