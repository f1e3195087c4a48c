"""The control plane on a real local multi-node Ray cluster (``ray.cluster_utils.Cluster``).

Three Ray nodes x 4 fake GPUs (``num_gpus=4``, a ``rack:<name>`` custom resource each) plus a
GPU-less head, all on 127.0.0.1, shared by every test of this module. Driven through
``ControlPlane`` with the ``RayExecutor`` (real SQLite, real processes):

* a 2-node gang runs on the nodes and GPU indices the scheduler chose (each job writes its Ray
  node id, CUDA_VISIBLE_DEVICES and RANK), and no GPU is used twice (launcher records);
* a control-plane restart adopts a running job through the detached node agents;
* removing a Ray node requeues the gang that ran there (attempt 2) while a job on another node
  keeps running; the gang's attempt 2 then runs on the surviving nodes;
* a node agent with containment runs its member in its own cgroup, with its GPU's device node
  only, and kills (and counts) what it left behind.

Skipped only when ``ray`` cannot be imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufence.testing.waiting import until

# loopback only: read by Ray at import time; without it Ray advertises the outward address
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'gpufence[ray]')")

from containment_helpers import alive, clear, make_driver, mknod, unique  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, control_config  # noqa: E402
from gpufence.control.base.containment_settings import ContainmentSettings  # noqa: E402
from gpufence.control.base.jobspec import SubmitRequest  # noqa: E402
from gpufence.control.base.member_records import exit_file, pid_file  # noqa: E402
from gpufence.control.executors.ray.local_cluster import LocalNode, local_ray_cluster  # noqa: E402
from gpufence.control.executors.ray.nodes import auto_names, cluster_spec, nodes_now  # noqa: E402
from gpufence.control.executors.ray.ray_executor import RayExecutor  # noqa: E402
from gpufence.control.gpus.records import Discovery  # noqa: E402
from gpufence.control.plane import ControlPlane  # noqa: E402
from gpufence.control.store import database as st  # noqa: E402
from gpufence.demo import joblogs  # noqa: E402

pytestmark = pytest.mark.slow  # a local multi-node Ray cluster per module

RACKS = ("rack-a", "rack-b", "rack-c")
# prints what the job saw, then sleeps argv[1] seconds
JOB = (
    "import json,os,sys,time;"
    "keys=['GPUFENCE_RAY_NODE_ID','GPUFENCE_NODE','CUDA_VISIBLE_DEVICES','RANK','WORLD_SIZE',"
    "'LOCAL_RANK','MASTER_ADDR','MASTER_PORT'];"
    "print(json.dumps({k: os.environ.get(k) for k in keys}),flush=True);"
    "time.sleep(float(sys.argv[1]))"
)


def _req(seconds: float, **fields: Any) -> SubmitRequest:
    return SubmitRequest.model_validate(
        {"command": [sys.executable, "-c", JOB, str(seconds)], **fields}
    )


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    nodes = [LocalNode(gpus=4, resources={f"rack:{rack}": 1}) for rack in RACKS]
    with local_ray_cluster(nodes) as cluster:
        yield cluster


@pytest.fixture
def make_plane(
    ray_cluster: Cluster, tmp_path: Path
) -> Iterator[Callable[[], tuple[ControlPlane, RayExecutor]]]:
    made: list[ControlPlane] = []

    def make() -> tuple[ControlPlane, RayExecutor]:
        nodes = nodes_now()
        spec = cluster_spec(nodes)
        assert sorted(g["rack"] for g in spec["node_groups"]) == sorted(RACKS)
        executor = RayExecutor(auto_names(nodes), health_poll_s=0.2, lost_hold_s=10.0)
        cfg = control_config({"stop_grace_s": 2}, tmp_path)
        discovery = Discovery(gpus=(), fake=True, driver=None, source="test Ray cluster")
        plane = ControlPlane(
            cluster_from_spec_dict(spec), cfg, discovery, tmp_path / "data", executor=executor
        )
        plane.start()
        made.append(plane)
        return plane, executor

    yield make
    for p in made:
        with contextlib.suppress(Exception):
            p.close(kill_jobs=True)
    _kill_leftovers(tmp_path / "data")


def _kill_leftovers(data: Path) -> None:
    """Members whose node was removed may outlive it on this one machine: end them by pid."""
    for pf in data.glob("jobs/*/attempt-*.records/rank-*.pid"):
        if _exited(pf.with_suffix(".exit")):
            continue
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.killpg(int(json.loads(pf.read_text())["pid"]), signal.SIGKILL)


def _job(p: ControlPlane, jid: str) -> st.JobRow:
    row = p.job(jid, ADMIN)
    assert row is not None
    return row


def _state(p: ControlPlane, jid: str) -> str:
    return _job(p, jid).state


def _members(p: ControlPlane, jid: str, attempt: int) -> list[tuple[str, list[str]]]:
    """(node name, devices) per rank of an attempt, as the store recorded the bind."""
    names = [n.name for n in p.cluster.nodes]
    att = next(a for a in p.attempts(jid) if a.attempt == attempt)
    return [
        (names[int(a["node"])], list(devs))
        for a, devs in zip(att.assignments, att.devices, strict=True)
    ]


def _seen(p: ControlPlane, jid: str, attempt: int, rank: int) -> dict[str, str]:
    text = p.log_path(jid, attempt, rank).read_text()
    return dict(json.loads(text.splitlines()[0]))


def _alive(adir: Path, rank: int) -> bool:
    try:
        pid = int(json.loads(pid_file(adir, rank).read_text())["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError):
        return False
    return not _exited(exit_file(adir, rank))


def _exited(record: Path) -> bool:
    """The launcher wrote how the member ended (the record reserved at spawn says null)."""
    try:
        return json.loads(record.read_text()).get("code") is not None
    except (OSError, ValueError):
        return False


def test_gang_runs_where_the_scheduler_placed_it(
    make_plane: Callable[[], tuple[ControlPlane, RayExecutor]],
) -> None:
    p, ex = make_plane()
    gang = p.submit(_req(0.5, gpus=4, replicas=2), ADMIN).job_id  # two whole nodes
    small = [p.submit(_req(0.3, gpus=2), ADMIN).job_id for _ in range(6)]  # queue behind it
    jobs = [gang, *small]
    until(lambda: all(_state(p, j) == st.DONE for j in jobs), 60, "all jobs done")
    ids = ex.node_ids()
    gang_nodes = set()
    for jid in jobs:
        members = _members(p, jid, 1)
        for rank, (node, devices) in enumerate(members):
            seen = _seen(p, jid, 1, rank)
            assert seen["GPUFENCE_RAY_NODE_ID"] == ids[node]  # Ray ran it where we said
            assert seen["CUDA_VISIBLE_DEVICES"] == ",".join(devices)
            assert seen["RANK"] == str(rank)
            assert seen["WORLD_SIZE"] == str(len(members))
            assert seen["LOCAL_RANK"] == "0"
            assert seen["MASTER_ADDR"] == "127.0.0.1"
            if jid == gang:
                gang_nodes.add(ids[node])
    assert len(gang_nodes) == 2
    assert _seen(p, gang, 1, 0)["MASTER_PORT"] == _seen(p, gang, 1, 1)["MASTER_PORT"]
    # no GPU held by two processes at once, from the launcher's exec / exit records
    runs = [
        joblogs.Run(
            r.job, r.attempt, r.rank, r.device, _members(p, r.job, 1)[r.rank][0], r.start, r.end
        )
        for r in joblogs.process_runs(p.data_dir)
    ]
    assert len(runs) == 8 + 6 * 2
    assert joblogs.max_per_device(runs) == 1


def test_restart_adopts_a_running_job(
    make_plane: Callable[[], tuple[ControlPlane, RayExecutor]],
) -> None:
    p, _ex = make_plane()
    jid = p.submit(_req(3.0, gpus=1), ADMIN).job_id
    until(lambda: p.log_path(jid, 1).exists() and p.log_path(jid, 1).read_text(), 20, "running")
    p.close(kill_jobs=False)  # the job keeps running under its node agent
    q, _ex2 = make_plane()
    assert q.recovered["adopted"] == 1
    until(lambda: _state(q, jid) == st.DONE, 20, "the adopted job to finish")
    assert [a.attempt for a in q.attempts(jid)] == [1]
    assert _job(q, jid).exit_code == 0


def test_node_loss_requeues_the_gang_there(
    ray_cluster: Cluster, make_plane: Callable[[], tuple[ControlPlane, RayExecutor]]
) -> None:
    p, ex = make_plane()
    gang = p.submit(_req(60, gpus=4, replicas=2), ADMIN).job_id
    other = p.submit(_req(60, gpus=4), ADMIN).job_id
    until(lambda: _state(p, gang) == _state(p, other) == st.RUNNING, 30, "both running")
    ids = ex.node_ids()
    gang_nodes = [node for node, _ in _members(p, gang, 1)]
    other_node = _members(p, other, 1)[0][0]
    assert other_node not in gang_nodes
    victim = next(n for n in ray_cluster.worker_nodes if n.node_id == ids[gang_nodes[1]])
    ray_cluster.remove_node(victim)
    until(lambda: _job(p, gang).attempt == 2, 30, "the gang requeued as attempt 2")
    kinds = [(e["kind"], e["reason"]) for e in p.events(ADMIN, job_id=gang)]
    assert ("stop", "node-failure") in kinds
    assert any(k == "requeue" for k, _ in kinds)
    first = next(a for a in p.attempts(gang) if a.attempt == 1)
    assert first.exit_codes is not None and None in first.exit_codes
    assert _state(p, gang) == st.PENDING  # 8 GPUs needed; the surviving free node has 4
    # the job on the other node never noticed; the gang's survivor (rank 0) was stopped, and
    # rank 1, whose "node" was removed (Ray kills the agent, not the launcher's own session, on
    # this one machine), fenced itself off when its agent died: attempt 1 cannot run on
    assert _state(p, other) == st.RUNNING
    assert _alive(p.log_path(other, 1).parent, 0)
    assert not _alive(p.log_path(gang, 1).parent, 0)
    until(lambda: not _alive(p.log_path(gang, 1).parent, 1), 10, "the lost member fenced off")
    # once the other job is gone, attempt 2 runs on the two surviving nodes
    p.cancel(other, ADMIN)
    until(lambda: _state(p, gang) == st.RUNNING, 30, "attempt 2 running")
    again = {node for node, _ in _members(p, gang, 2)}
    assert gang_nodes[1] not in again and len(again) == 2
    until(lambda: p.log_path(gang, 2, 1).exists() and p.log_path(gang, 2, 1).read_text(), 20, "")
    assert _seen(p, gang, 2, 1)["GPUFENCE_RAY_NODE_ID"] in {ids[n] for n in again}


# the checkpoint handshake through the Ray executor: notice (file + signal) -> the job acks by
# creating its ack file -> stop (SIGTERM to the group) -> the exit is reported as stopped
ACKER = (
    "import os,signal,sys,time;"
    "signal.signal(signal.SIGUSR1, lambda *a: open(os.environ['GPUFENCE_ACK_FILE'],'w').close());"
    "print('ready',flush=True);"
    "time.sleep(60)"
)


def test_notice_ack_and_stop_through_the_ray_executor(ray_cluster: Cluster, tmp_path: Path) -> None:
    from gpufence.control.base.executor import AttemptExit, Launch, Member

    names = auto_names(nodes_now())
    node = sorted(names)[0]
    ex = RayExecutor(names, health_poll_s=0.2)
    exits: list[AttemptExit] = []
    acks: list[tuple[str, int]] = []
    ex.set_callbacks(exits.append, lambda j, a: acks.append((j, a)))
    adir = tmp_path / "jobs" / "h1" / "attempt-1"
    launch = Launch(
        job_id="h1",
        attempt=1,
        command=(sys.executable, "-c", ACKER),
        env={},
        members=(Member(0, node, ("1",)),),
        attempt_dir=adir,
        checkpoint_dir=tmp_path / "jobs" / "h1" / "checkpoints",
    )
    try:
        ex.start(launch)
        out = adir / "rank-0.out"
        until(lambda: out.exists() and "ready" in out.read_text(), 30, "the job's handler")
        ex.notice("h1", 1, "incident-preemption", time.time() + 30)
        until(lambda: acks == [("h1", 1)], 15, "the checkpoint ack")
        assert (adir / "notice").exists()
        ex.stop("h1", 1, grace_s=5.0)
        until(lambda: len(exits) == 1, 20, "the stopped attempt's exit")
        assert exits[0].stopped and not exits[0].succeeded
        assert exits[0].codes == (-signal.SIGTERM,)
        assert exits[0].stop_reached is True  # its launcher's record, sent back by the agent
    finally:
        ex.close(kill=True)


def test_activity_tells_a_busy_member_from_an_idle_one(
    ray_cluster: Cluster, tmp_path: Path
) -> None:
    from gpufence.control.base.executor import Launch, Member

    names = auto_names(nodes_now())
    node = sorted(names)[1]
    ex = RayExecutor(names, health_poll_s=0.2)
    ex.set_callbacks(lambda _e: None, lambda _j, _a: None)
    programs = {
        "busy": "import time\nend=time.time()+60\nwhile time.time()<end: pass",
        "idle": "import time; time.sleep(60)",
    }
    try:
        for i, (jid, code) in enumerate(programs.items()):
            adir = tmp_path / "jobs" / jid / "attempt-1"
            ex.start(
                Launch(
                    job_id=jid,
                    attempt=1,
                    command=(sys.executable, "-c", code),
                    env={},
                    members=(Member(0, node, (str(i),)),),
                    attempt_dir=adir,
                    checkpoint_dir=tmp_path / "jobs" / jid / "checkpoints",
                )
            )
        time.sleep(1.0)  # both processes are up
        assert ex.activity() == {}  # the first sample only sets each attempt's baseline
        time.sleep(1.5)
        sample = ex.activity()
        # a spinning process has a core when the machine is quiet, but on a loaded 2-core
        # machine it gets a share; what matters is that it reads above any idle threshold
        # (0.05 by default) while the sleeper reads below it
        assert sample[("busy", 1)] > 0.1, sample
        assert sample[("idle", 1)] < 0.05, sample
    finally:
        ex.close(kill=True)


# containment through the node agents: the job escapes (setsid) and opens two fake GPUs' nodes
CONTAINED = (
    "import errno,json,os,subprocess,sys;"
    "d=subprocess.Popen(['sleep','300'],start_new_session=True);"
    "out={};\n"
    "for i,p in enumerate(sys.argv[1:]):\n"
    "    try:\n"
    "        os.close(os.open(p, os.O_RDONLY)); out[str(i)]='ok'\n"
    "    except OSError as e:\n"
    "        out[str(i)]=errno.errorcode[e.errno]\n"
    "cg=[l.split(':',2)[2].strip() for l in open('/proc/self/cgroup') if ':freezer:' in l];"
    "print(json.dumps({'opens':out,'cgroup':cg[0] if cg else '','daemon':d.pid}),flush=True)"
)


def test_the_node_agent_contains_its_members(ray_cluster: Cluster, tmp_path: Path) -> None:
    from gpufence.control.base.executor import AttemptExit, Launch, Member

    parent = unique("/gpufence-ray")
    driver = make_driver("v1", parent)  # skips where this machine has no v1 hierarchies
    nodes = [mknod(tmp_path / f"gpu{i}", 1, n) for i, n in enumerate((7, 8, 9, 11))]
    settings = ContainmentSettings(
        cgroup_parent=parent, fake_gpu_devices=str(tmp_path / "gpu{index}"), prestarted=0
    )
    names = auto_names(nodes_now())
    ex = RayExecutor(names, health_poll_s=0.2, containment=settings)
    exits: list[AttemptExit] = []
    ex.set_callbacks(exits.append, lambda _j, _a: None)
    adir = tmp_path / "jobs" / "c1" / "attempt-1"
    launch = Launch(
        job_id="c1",
        attempt=1,
        command=(sys.executable, "-c", CONTAINED, str(nodes[2]), str(nodes[1])),
        env={},
        members=(Member(0, sorted(names)[0], ("2",)),),
        attempt_dir=adir,
        checkpoint_dir=tmp_path / "jobs" / "c1" / "checkpoints",
    )
    try:
        ex.start(launch)
        until(lambda: len(exits) == 1, 30, "the contained job's exit")
        seen = json.loads((adir / "rank-0.out").read_text())
        assert seen["opens"] == {"0": "ok", "1": "EPERM"}  # its own GPU 2, not GPU 1
        assert seen["cgroup"].startswith(parent + "/c1.a1.r0.")
        assert exits[0].succeeded and exits[0].strays_killed == 1
        assert not alive(seen["daemon"])
    finally:
        ex.close(kill=True)
        clear(driver)
