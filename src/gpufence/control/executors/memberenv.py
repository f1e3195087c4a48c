"""The environment of each gang member: what gpufence sets on top of the user's variables.

Shared by the local and the Ray executors, so a job sees the same variables wherever it runs.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufence.control.executors.interface import Launch


def member_envs(
    launch: Launch,
    master_addr: str,
    master_port: int,
    inherit: Mapping[str, str] | None = None,
) -> dict[int, dict[str, str]]:
    """Per rank: ``inherit`` (e.g. the executor's own environment), then the user's env, then
    gpufence's variables, which win: a user value must not break GPU isolation or ranks."""
    adir = launch.attempt_dir.absolute()
    base = dict(inherit or {})
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
        }
    return out
