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
* ``serve [--seconds S]`` - a serving replica: runs until stopped (SIGTERM) or S seconds;
* ``notebook --busy-s S`` - works (CPU) for S seconds, then sits idle until reclaimed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
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


def _serve(seconds: float | None) -> int:
    deadline = time.time() + seconds if seconds else None
    while deadline is None or time.time() < deadline:
        time.sleep(0.05 if deadline is None else max(0.0, min(0.05, deadline - time.time())))
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
            code = _serve(float(opts["--seconds"]) if "--seconds" in opts else None)
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
