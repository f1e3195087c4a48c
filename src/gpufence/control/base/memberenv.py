"""The environment of each gang member: a clean one, never the server's.

A job sees, in this order (later wins):

1. the executor's own environment, filtered by an allow-list (``DEFAULT_ENV_INHERIT``: PATH,
   HOME, USER, LANG, LC_*, TZ, TERM); nothing else of it, so no server token and no other
   secret of the server reaches a job;
2. with a ``run_as`` user: that user's HOME, USER and LOGNAME;
3. ``Launch.env``: the job's own ``--env`` plus the server variables the admin added with
   ``control.job_env_inherit`` (the reconciler puts them there, see ``launches.py``);
4. gpufence's own variables (GPU isolation, ranks, checkpoint and notice paths), which win;
   a fractional share under MPS also gets its GPU's MPS pipe directory and its limits
   (``mps_env``); and their ``SLURM_*`` twins (``slurmenv.py``: SLURM_PROCID, ...).

No ``GPUFENCE_*`` variable is ever inherited: the only ones a job sees are those of step 4.
Shared by the local and the Ray executors, so a job sees the same variables wherever it runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpufence.control.base.executor import GpuShare, Launch
from gpufence.control.base.runas import home_of
from gpufence.control.base.slurmenv import slurm_member_env

DEFAULT_ENV_INHERIT = ("PATH", "HOME", "USER", "LANG", "LC_*", "TZ", "TERM")
"""Names (``PREFIX*``: every name starting with PREFIX) a job inherits from its executor."""
OWN_PREFIX = "GPUFENCE_"


def name_matches(name: str, patterns: Iterable[str]) -> bool:
    for p in patterns:
        if p.endswith("*"):
            if name.startswith(p[:-1]):
                return True
        elif name == p:
            return True
    return False


def inherited_env(
    environ: Mapping[str, str], patterns: Iterable[str] = DEFAULT_ENV_INHERIT
) -> dict[str, str]:
    """The variables of ``environ`` the allow-list ``patterns`` lets through (never GPUFENCE_*)."""
    pats = tuple(patterns)
    return {
        k: v for k, v in environ.items() if name_matches(k, pats) and not k.startswith(OWN_PREFIX)
    }


def mps_env(share: GpuShare | None) -> dict[str, str]:
    """MPS client variables of a fractional share (empty when its GPU runs no MPS daemon).

    The share's compute is ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (its milli-GPU, rounded up to
    a whole percent, so a share never gets 0); its memory is the pinned-memory limit of device 0,
    the one GPU the client sees (CUDA_VISIBLE_DEVICES names it by UUID, as MPS wants when the
    daemon itself sees only that GPU).
    """
    if share is None or share.mps_pipe_dir is None:
        return {}
    percent = max(1, min(100, -(-share.milli // 10)))
    out = {
        "CUDA_MPS_PIPE_DIRECTORY": share.mps_pipe_dir,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent),
    }
    if share.mem_mib > 0:
        out["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={share.mem_mib}M"
    return out


def member_envs(
    launch: Launch,
    master_addr: str,
    master_port: int,
    inherit: Mapping[str, str] | None = None,
) -> dict[int, dict[str, str]]:
    """Per rank, the whole environment (see the module docstring); ``inherit`` is the executor's
    own environment (e.g. ``os.environ``), of which only the allow-listed names are kept."""
    adir = launch.attempt_dir.absolute()
    base = inherited_env(inherit or {})
    if launch.run_as is not None:
        base.update(
            {
                "HOME": home_of(launch.run_as),
                "USER": launch.run_as.user,
                "LOGNAME": launch.run_as.user,
            }
        )
    base.update(launch.env)
    base.update(
        {
            "GPUFENCE_JOB_ID": launch.job_id,
            "GPUFENCE_ATTEMPT": str(launch.attempt),
            "GPUFENCE_CHECKPOINT_DIR": str(launch.checkpoint_dir.absolute()),
            "GPUFENCE_NOTICE_FILE": str(adir / "notice"),
            "GPUFENCE_ACK_FILE": str(adir / "ack"),
            "WORLD_SIZE": str(len(launch.members)),
            "GPUFENCE_WORLD_SIZE": str(len(launch.members)),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
        }
    )
    members = sorted(launch.members, key=lambda m: m.rank)
    per_node: dict[str, int] = {}
    for m in members:
        per_node[m.node] = per_node.get(m.node, 0) + 1
    seen: dict[str, int] = {}
    out: dict[int, dict[str, str]] = {}
    for m in members:
        local = seen.get(m.node, 0)
        seen[m.node] = local + 1
        out[m.rank] = {
            **base,
            "CUDA_VISIBLE_DEVICES": ",".join(m.devices),  # "" = no GPU visible
            "RANK": str(m.rank),
            "GPUFENCE_RANK": str(m.rank),
            "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(per_node[m.node]),
            "GPUFENCE_NODE": m.node,
            **slurm_member_env(m.rank, local, len(per_node), m.devices),
            **mps_env(m.share),
        }
    return out
