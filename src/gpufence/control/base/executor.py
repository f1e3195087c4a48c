"""Executor interface: what the control plane asks of whatever runs job attempts.

An *attempt* is one try at running a job: a gang of members (one process tree per rank) that
starts together and ends together. The executor reports the end of every attempt it started or
adopted exactly once, through ``on_exit``; acknowledgements of a notice arrive through ``on_ack``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True, slots=True)
class GpuShare:
    """A fractional share of one GPU; enforced with MPS when ``mps_pipe_dir`` is set."""

    milli: int
    """Compute share in thousandths of the GPU (-> CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)."""
    mem_mib: int
    """GPU memory the share may pin (-> CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)."""
    mps_pipe_dir: str | None = None
    """The GPU's MPS control daemon pipe directory; None: MPS not running, not enforced."""


@dataclass(frozen=True, slots=True)
class Member:
    """One gang member (or one replica) of an attempt."""

    rank: int
    node: str
    """Node name; informational for the local executor, used for ``LOCAL_RANK``."""
    devices: tuple[str, ...]
    """``CUDA_VISIBLE_DEVICES`` entries (GPU indices or MIG UUIDs); ``()`` means CPU-only."""
    share: GpuShare | None = None
    """Set for a fractional share of a GPU (its MPS limits, ``memberenv.mps_env``)."""
    device_nodes: tuple[str, ...] = ()
    """Device nodes of those GPUs (``/dev/nvidiaN``, MIG capability devices): with containment
    the member may open these and none of the node's other GPU device nodes."""


@dataclass(frozen=True, slots=True)
class RunAs:
    """The Unix identity a job's processes run as (its tenant's ``run_as`` user)."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    """Supplementary groups."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-member resource limits the executor enforces (``None``: not limited)."""

    cpus: float | None = None
    """CPU cores (fractional allowed)."""
    mem_bytes: int | None = None
    """Host memory; over it the member is OOM-killed."""
    pids: int | None = None
    """Processes and threads."""
    log_bytes: int | None = None
    """Each of its logs (stdout, stderr) never grows past this (``logcap.py``)."""
    defaulted: frozenset[str] = frozenset()
    """Which of ``cpus``, ``mem_bytes`` the job did not ask for (its node's share: a default,
    which a cgroup without that controller leaves out instead of refusing the start)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """Everything an executor needs to start (or re-attach to) one attempt."""

    job_id: str
    attempt: int
    """1-based attempt number."""
    command: tuple[str, ...]
    """argv of the user command; run without a shell."""
    env: Mapping[str, str]
    """The job's own variables (its ``--env``, and the server variables ``job_env_inherit``
    names), added on top of the allow-listed part of the executor's environment
    (``memberenv.member_envs``; the rest of it never reaches a job)."""
    members: tuple[Member, ...]
    """Ranks must be exactly ``0 .. len(members) - 1``."""
    attempt_dir: Path
    """``DATA/jobs/<job>/attempt-<n>/``: pid/exit records, output, notice and ack files."""
    checkpoint_dir: Path
    """``DATA/jobs/<job>/checkpoints/``: shared by all attempts of the job."""
    cwd: Path | None = None
    run_as: RunAs | None = None
    """``None``: run as the control plane's own user."""
    limits: Limits = Limits()
    """Per member."""
    container: Path | None = None
    """The image the members run in (``containers.py``): a directory, or a ``.sif`` the
    executor unpacks first; None: the machine's own root."""
    image_cache: Path | None = None
    """Where a ``.sif`` image is unpacked (``sifcache``): the server's ``DATA/images``."""
    pty_grace_s: float | None = None
    """A pty job's (``run --pty``): its command runs on a terminal that a host serves (the
    launcher's child, ``base/ptyhost.py``), ending the session this long after its last client
    went away. ``None``: not a pty job."""


@dataclass(frozen=True, slots=True)
class AttemptExit:
    """How an attempt ended (reported once per attempt through ``on_exit``)."""

    job_id: str
    attempt: int
    succeeded: bool
    """Every member exited with code 0."""
    codes: tuple[int | None, ...]
    """Exit code per rank; negative = killed by that signal; None = unknown (no exit record)."""
    stopped: bool
    """The attempt ended after ``stop()`` was called for it."""
    oom: bool = False
    """A member was killed by the out-of-memory killer of its memory limit."""
    strays_killed: int = 0
    """Processes left behind after a member's main process exited, killed by the executor."""
    stop_reached: bool | None = None
    """Whether a stop signal reached any member before its command exited, as the launchers
    recorded it (False: it reached none of them); None where unknown (an older launcher's
    records, a member lost with its node). With every member at 0 and False, the attempt finished
    its work before the stop could end it, whatever ``stopped`` says."""
    ended_at: float | None = field(default=None, compare=False)
    """Unix time the last member's command ended, from the launchers' exit records; None where
    unknown (a member without a record, an executor that does not read them). What accounting
    charges up to: an exit found only after a restart did not run while the plane was down.
    (Not compared: two reports of one exit are equal whenever each was read.)"""


class LaunchError(RuntimeError):
    """An attempt could not be started; the message says why."""


ExitCallback = Callable[[AttemptExit], None]
AckCallback = Callable[[str, int], None]
NodeCallback = Callable[[str, bool], None]
"""``on_node(node_name, up)``: a node of the cluster went down (False) or came back (True)."""


class Executor(Protocol):
    """Runs job attempts. Callbacks may be called from an executor-owned thread."""

    def set_callbacks(self, on_exit: ExitCallback, on_ack: AckCallback) -> None:
        """Install the callbacks for attempt exits and notice acknowledgements."""
        ...

    def set_node_callback(self, on_node: NodeCallback) -> None:
        """Install the callback for node health changes (multi-node executors call it from their
        own thread; an executor of one machine never does)."""
        ...

    def start(self, launch: Launch) -> None:
        """Start every member of the attempt; raise ``LaunchError`` if that is impossible."""
        ...

    def notice(
        self, job_id: str, attempt: int, reason: str, deadline_unix: float, signal_job: bool = True
    ) -> None:
        """Tell a running attempt it must wrap up (checkpoint) before ``deadline_unix``: a notice
        file, plus the notice signal when ``signal_job`` (off for idle warnings: a process that
        never asked for checkpoint notices would die of SIGUSR1's default action)."""
        ...

    def stop(self, job_id: str, attempt: int, grace_s: float) -> None:
        """Ask the attempt to end (SIGTERM), force it after ``grace_s``; completion via on_exit."""
        ...

    def adopt(self, launch: Launch) -> bool:
        """Re-attach to an attempt started before a restart; True if a member is still alive."""
        ...

    def running(self) -> list[tuple[str, int]]:
        """``(job_id, attempt)`` of every attempt whose exit has not been reported yet."""
        ...

    def activity(self) -> dict[tuple[str, int], float]:
        """CPU utilisation (0..1 per member) of each running attempt since the last call."""
        ...

    def close(self, kill: bool = False) -> None:
        """Stop watching; with ``kill=True`` also kill every attempt still running."""
        ...


def notify(fn: Callable[..., object], *args: object) -> None:
    """Call an executor's event callback from its watcher thread: a failing callback is logged
    and must not kill the thread that reports every other attempt."""
    try:
        fn(*args)
    except Exception:
        logging.getLogger("gpufence.executor").exception("executor callback %r failed", fn)


def report(
    on_exit: ExitCallback,
    on_ack: AckCallback,
    acks: list[tuple[str, int]],
    exits: list[AttemptExit],
) -> None:
    """The tail of one watcher round, outside the lock: acks first (an ack and the exit of the
    same attempt in one round reach the reconciler in that order), then exits."""
    for job_id, attempt in acks:
        notify(on_ack, job_id, attempt)
    for ev in exits:
        notify(on_exit, ev)
