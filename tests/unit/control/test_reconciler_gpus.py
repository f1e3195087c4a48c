"""The reconciler with real-GPU paths on the fake NVML, one cycle at a time (``ReconcilerRig``):

* a dynamic MIG job waits while the MIG manager creates its instance through NVML, then starts
  with that very MIG UUID in CUDA_VISIBLE_DEVICES;
* an NVML error mid-reconfigure becomes a ``MigLayoutRead`` event: the core takes the layout the
  GPU really has, the job is placed again (a second re-partition after the backoff), the failure
  is in the decision log, on /metrics and on ``nodes``;
* a fractional share on a GPU with an MPS daemon gets the GPU's UUID and its MPS limits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufence.control.gpus.discovery import discover
from gpufence.control.metrics import Telemetry
from gpufence.control.observe import views
from gpufence.testing.fake_nvml import FakeNvml, hgx_h100
from gpufence.testing.reconciler_rig import ReconcilerRig


def mig_spec(gpus: int = 1) -> dict[str, Any]:
    return {
        "name": "box",
        "node_groups": [
            {"name": "box", "count": 1, "gpus_per_node": gpus, "gpu_type": "H100-80GB"}
        ],
        "partitions": {
            "m": {
                "nodes": ["box"],
                "admits": ["batch", "training"],
                "sharing": "mig",
                "mig": {"layout": [], "dynamic": True, "reconfigure_delay_s": 30},
            }
        },
    }


def _rig(tmp_path: Path, nvml: FakeNvml, spec: dict[str, Any]) -> ReconcilerRig:
    rig = ReconcilerRig.make(tmp_path, spec, discovery=discover(nvml), nvml=nvml)
    rig.rec.boot(rig.rec.mig.startup(), [])  # what ControlPlane.start does before recovery
    rig.cycle()
    return rig


def _telemetry(rig: ReconcilerRig) -> Telemetry:
    return rig.rec.telemetry


def test_a_dynamic_mig_job_runs_on_the_instance_nvml_created(tmp_path: Path) -> None:
    nvml = FakeNvml(hgx_h100(1, mig=1))
    rig = _rig(tmp_path, nvml, mig_spec())
    jid = rig.submit(command=["train"], mig="3g.40gb").job_id
    assert rig.job(jid).state == "pending"
    assert rig.ex.launches == []
    assert nvml.gpus[0].layout() == []  # decided, carried out by the next cycle
    rig.cycle()
    # the core's layout: the 3g where a 4g stays placeable, the rest cut into 1g
    assert nvml.gpus[0].layout() == [*(f"1g.10gb@{s}" for s in range(4)), "3g.40gb@4"]
    (launch,) = rig.ex.launches
    (uuid,) = [m.uuid for m in nvml.gpus[0].migs if m.slices == 3]
    assert launch.members[0].devices == (uuid,)
    assert rig.attempt(jid, 1).devices == [[uuid]]  # type: ignore[union-attr]
    assert "mig-failed" not in [e["kind"] for e in _log(rig)]


def _log(rig: ReconcilerRig) -> list[dict[str, Any]]:
    with rig.store.reader() as r:
        return r.events()


def test_an_nvml_error_mid_reconfigure_is_handled_by_the_core(tmp_path: Path) -> None:
    nvml = FakeNvml(hgx_h100(1, mig=1))
    rig = _rig(tmp_path, nvml, mig_spec())
    nvml.fail_next("nvmlGpuInstanceCreateComputeInstance", 999)
    jid = rig.submit(command=["train"], mig="2g.20gb").job_id
    rig.cycle()  # the re-partition fails: the GPU has a bare GI, no usable instance
    assert rig.ex.launches == []
    kinds = [e["kind"] for e in _log(rig)]
    assert kinds.count("mig-reconfigure") == 2  # decided, failed, decided again at once
    failed = next(e for e in _log(rig) if e["kind"] == "mig-failed")
    assert "creating the compute instance of 2g.20gb@" in failed["message"]
    why = rig.rec.scheduler.why_pending(jid)
    assert why is not None and str(why.reason) == "mig-reconfiguring"
    metrics = _telemetry(rig).render()
    assert b'gpufence_mig_reconfigures_total{result="failed"} 1.0' in metrics
    (node,) = views.nodes(rig.rec)
    gpu = node["gpus"][0]
    assert gpu["mig_failures"] == 1 and "NVML error 999" in gpu["mig_error"]
    # the retry waits out the backoff, then the job runs on what was created
    rig.cycle()
    assert rig.ex.launches == []
    rig.advance(5.0)
    rig.cycle()
    (launch,) = rig.ex.launches
    assert launch.members[0].devices == tuple(m.uuid for m in nvml.gpus[0].migs if m.slices == 2)
    assert rig.job(jid).state == "running"
    assert b'gpufence_mig_reconfigures_total{result="ok"} 1.0' in _telemetry(rig).render()


def test_a_refused_gpu_is_in_the_log_and_on_nodes(tmp_path: Path) -> None:
    gpus = hgx_h100(2, mig=2)
    gpus[1].mig_mode = (0, 0)
    nvml = FakeNvml(gpus)
    rig = _rig(tmp_path, nvml, mig_spec(2))
    refused = [e for e in _log(rig) if e["kind"] == "gpu-refused"]
    assert [e["message"].split(":")[0] for e in refused] == ["GPU 1"]
    gpu = views.nodes(rig.rec)[0]["gpus"][1]
    assert gpu["state"] == "refused" and "MIG mode is off" in gpu["refused"]
    jid = rig.submit(command=["x"], mig="7g.80gb").job_id
    rig.submit(command=["y"], mig="7g.80gb")
    rig.cycle()
    assert [launch.job_id for launch in rig.ex.launches] == [jid]  # only GPU 0 is used


def frac_spec() -> dict[str, Any]:
    return {
        "name": "box",
        "node_groups": [{"name": "box", "count": 1, "gpus_per_node": 1, "gpu_type": "H100-80GB"}],
        "partitions": {"f": {"nodes": ["box"], "admits": ["batch"], "sharing": "fractional"}},
    }


def test_a_share_on_an_mps_gpu_gets_its_uuid_and_limits(tmp_path: Path) -> None:
    nvml = FakeNvml(hgx_h100(1))
    rig = ReconcilerRig.make(tmp_path, frac_spec(), discovery=discover(nvml), nvml=nvml)
    rig.rec.devices.set_mps(0, "/data/mps/gpu-0/pipe")
    rig.submit(command=["x"], **{"class": "batch"}, gpu_fraction=0.25, gpu_mem_gib=10)
    rig.submit(command=["y"], **{"class": "batch"}, gpu_fraction=0.5)
    a, b = rig.ex.launches
    assert a.members[0].devices == (f"GPU-{nvml.gpus[0].bus}",)
    assert a.members[0].share is not None
    assert (a.members[0].share.milli, a.members[0].share.mem_mib) == (250, 10240)
    assert a.members[0].share.mps_pipe_dir == "/data/mps/gpu-0/pipe"
    # no --gpu-mem: capped at its fraction of the GPU's memory
    assert b.members[0].share is not None and b.members[0].share.mem_mib == 81559 // 2
    rig.rec.devices.set_mps(0, None)  # the daemon is gone: index, no MPS
    rig.submit(command=["z"], **{"class": "batch"}, gpu_fraction=0.1)
    c = rig.ex.launches[-1]
    assert c.members[0].devices == ("0",)
    assert c.members[0].share is not None and c.members[0].share.mps_pipe_dir is None
