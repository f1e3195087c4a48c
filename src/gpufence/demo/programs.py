"""The programs the demo and the hand-off benchmark run as real jobs.

``python -m gpufence.demo.programs KIND [options]``. Every job prints one JSON line when it
starts and one when it ends (``{"ev": "start"|"end", "t": unix time, "devices": ..., ...}``) to
its stdout, so that oversubscription and hand-off gaps are measured from the jobs' own logs, not
from what the scheduler believes. Only the standard library is imported: start-up time is part
of every hand-off.

Kinds:
* ``sleep S`` - hold the GPU for S seconds (the seed's 66-job case);
* ``train --steps N --step-s T`` - a training loop that checkpoints to ``GPUFENCE_CHECKPOINT_DIR``
  every ``--ckpt-every`` steps, resumes from the last checkpoint, and answers a preemption
  notice (SIGUSR1) by checkpointing at once and writing ``GPUFENCE_ACK_FILE``;
* ``serve [--seconds S] [--port P --rps R --work-ms W]`` - a serving replica: runs until stopped
  (SIGTERM) or S seconds. With ``--port`` it serves ``/infer`` (W ms of CPU work per request)
  and its own latency histogram ``demo_request_duration_seconds`` on ``/metrics`` at
  127.0.0.1:P, and sends itself R requests/s over loopback, timing each one: real latencies
  (queueing for a CPU included) that the control plane scrapes;
* ``notebook --busy-s S`` - works (CPU) for S seconds, then sits idle until reclaimed.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from types import FrameType


def _say(ev: str, **kw: object) -> None:
    line = {
        "ev": ev,
        "t": time.time(),
        "job": os.environ.get("GPUFENCE_JOB_ID", ""),
        "attempt": int(os.environ.get("GPUFENCE_ATTEMPT", "0")),
        "rank": int(os.environ.get("RANK", "0")),
        "devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        **kw,
    }
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


class _Stop(Exception):
    pass


def _on_term(_sig: int, _frame: FrameType | None) -> None:
    raise _Stop


_noticed: list[bool] = [False]  # set by the notice signal; a list so the handler can flip it


def _on_notice(_sig: int, _frame: FrameType | None) -> None:
    _noticed[0] = True


def _sleep(seconds: float) -> int:
    time.sleep(seconds)
    return 0


def _serve(seconds: float | None, opts: dict[str, str]) -> int:
    deadline = time.time() + seconds if seconds else None
    if "--port" in opts:
        return _serve_requests(deadline, opts)
    while deadline is None or time.time() < deadline:
        time.sleep(0.05 if deadline is None else max(0.0, min(0.05, deadline - time.time())))
    return 0


# seconds; Prometheus' default buckets, finer at the low end where the demo's requests fall
_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)


class _Histogram:
    """A Prometheus histogram by hand (the demo's programs import only the standard library)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = [0] * (len(_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, v: float) -> None:
        i = next((k for k, b in enumerate(_BUCKETS) if v <= b), len(_BUCKETS))
        with self.lock:
            self.counts[i] += 1
            self.total += v

    def text(self) -> str:
        name = "demo_request_duration_seconds"
        lines = [f"# HELP {name} Time to answer one /infer request", f"# TYPE {name} histogram"]
        with self.lock:
            cum = 0
            for b, c in zip((*_BUCKETS, float("inf")), self.counts, strict=True):
                cum += c
                le = "+Inf" if b == float("inf") else repr(b)
                lines.append(f'{name}_bucket{{le="{le}"}} {cum}')
            lines += [f"{name}_sum {self.total}", f"{name}_count {cum}"]
        return "\n".join(lines) + "\n"


def _busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1000.0
    x = 0
    while time.perf_counter() < end:
        x = (x * 31 + 7) % 1_000_003


def _serve_requests(deadline: float | None, opts: dict[str, str]) -> int:
    port, rps = int(opts["--port"]), float(opts.get("--rps", "20"))
    work_ms = float(opts.get("--work-ms", "2"))
    hist = _Histogram()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                body = hist.text().encode()
            elif self.path == "/infer":
                # the device's share of a request: a real replica's host thread waits on its
                # GPU (a fake one here), it does not spin a CPU -- spinning made the demo's p99
                # a measure of the host's other load, not of what the scheduler decides
                time.sleep(work_ms / 1000.0)
                body = b"ok"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:  # no access log on stderr
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{port}/infer"
    served = 0
    try:
        nxt = time.perf_counter()
        while deadline is None or time.time() < deadline:
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    resp.read()
                hist.observe(time.perf_counter() - t0)
                served += 1
            except OSError:
                pass
            nxt += 1.0 / rps
            time.sleep(max(0.0, nxt - time.perf_counter()))
    finally:
        _say("served", requests=served)
        server.shutdown()
    return 0


def _notebook(busy_s: float) -> int:
    end = time.time() + busy_s
    x = 0
    while time.time() < end:  # a user running cells: the process works
        x = (x * 31 + 7) % 1_000_003
    while True:  # then the session sits idle until it is reclaimed
        time.sleep(1.0)


def _ckpt_path() -> str:
    return os.path.join(os.environ.get("GPUFENCE_CHECKPOINT_DIR", "."), "step.json")


def _load_step() -> int:
    try:
        with open(_ckpt_path(), encoding="utf-8") as fh:
            return int(json.load(fh)["step"])
    except (OSError, ValueError, KeyError):
        return 0


def _save_step(step: int) -> None:
    path = _ckpt_path()
    tmp = path + f".tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"step": step, "t": time.time()}, fh)
    os.replace(tmp, path)


def _train(steps: int, step_s: float, ckpt_every: int) -> int:
    rank0 = os.environ.get("RANK", "0") == "0"
    step = _load_step()
    _say("resume", step=step)
    try:
        while step < steps:
            time.sleep(step_s)
            step += 1
            noticed = _noticed[0]
            if rank0 and (step % ckpt_every == 0 or noticed):
                _save_step(step)
            if noticed and rank0:
                ack = os.environ.get("GPUFENCE_ACK_FILE")
                if ack:
                    with open(ack, "w", encoding="utf-8") as fh:
                        fh.write(json.dumps({"step": step}))
                _say("checkpoint-ack", step=step)
            _noticed[0] = False
    except _Stop:
        if rank0:
            _save_step(step)
        _say("stopped", step=step)
        return 143
    return 0


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _on_term)
    # first thing: a notice that arrives during start-up must not kill us (SIGUSR1's default)
    signal.signal(signal.SIGUSR1, _on_notice)
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    kind, args = argv[0], argv[1:]
    opts = dict(zip(args[::2], args[1::2], strict=False))
    _say("start", kind=kind)
    code = 0
    try:
        if kind == "sleep":
            code = _sleep(float(args[0]) if args else 1.0)
        elif kind == "serve":
            code = _serve(float(opts["--seconds"]) if "--seconds" in opts else None, opts)
        elif kind == "notebook":
            code = _notebook(float(opts.get("--busy-s", "3")))
        elif kind == "train":
            code = _train(
                int(opts.get("--steps", "100")),
                float(opts.get("--step-s", "0.1")),
                int(opts.get("--ckpt-every", "10")),
            )
        else:
            print(f"unknown kind {kind!r} (sleep, serve, notebook, train)", file=sys.stderr)
            code = 2
    except _Stop:
        code = 0 if kind in ("serve", "notebook") else 143
    _say("end", code=code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
