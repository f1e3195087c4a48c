"""MIG instances through NVML (on the fake NVML): the placement rules it enforces, reading and
changing a GPU's layout (``mig_device``), and the MIG manager carrying out the core's decisions:
success, an NVML error mid-reconfigure, busy instances, MIG mode mismatches at start-up, and the
start-up reconciliation with the store's live attempts."""

from __future__ import annotations

import pytest

from gpufence.control.gpus.board import GpuBoard
from gpufence.control.gpus.devices import DeviceMap
from gpufence.control.gpus.discovery import discover
from gpufence.control.gpus.mig_device import (
    MigApplyError,
    Placement,
    apply_layout,
    layout_of,
    read_instances,
)
from gpufence.control.gpus.mig_manager import Claim, MigManager
from gpufence.control.gpus.nvml import (
    NVML_ERROR_IN_USE,
    NVML_ERROR_INSUFFICIENT_RESOURCES,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    NvmlError,
)
from gpufence.control.metrics import Telemetry
from gpufence.model.decisions import Assignment, MigReconfigure, Reason
from gpufence.model.events import MigLayoutRead, MigReconfigured
from gpufence.model.mig import MigInstance, profiles_for
from gpufence.spec import cluster_from_dict
from gpufence.testing.fake_nvml import FakeMig, FakeNvml, FakeProc, Handle, hgx_h100

H100 = profiles_for("H100-80GB")


def _spec(n: int = 2, sharing: str = "mig", layout: tuple[str, ...] = ()) -> dict[str, object]:
    part: dict[str, object] = {"nodes": ["n"], "admits": ["batch"], "sharing": sharing}
    if sharing == "mig":
        part["mig"] = {"layout": list(layout), "dynamic": True, "reconfigure_delay_s": 30}
    return {
        "name": "t",
        "node_groups": [{"name": "n", "count": 1, "gpus_per_node": n, "gpu_type": "H100-80GB"}],
        "partitions": {"p": part},
    }


def _manager(nvml: FakeNvml, spec: dict[str, object]) -> tuple[MigManager, DeviceMap, Telemetry]:
    cluster = cluster_from_dict(spec, source="test")
    devices = DeviceMap(cluster, discover(nvml))
    tel = Telemetry()
    return MigManager(cluster, devices, nvml, telemetry=tel, threaded=False), devices, tel


def _decision(gpu: int, *layout: str) -> MigReconfigure:
    return MigReconfigure(gpu, layout, Reason.MIG_LAYOUT, 30.0)


def _mig_assignment(gpu: int, profile: str, start: int) -> Assignment:
    return Assignment(0, (gpu,), mig_profile=profile, mig_start=start)


# ---------------------------------------------------------------------- the fake's rules
def test_fake_nvml_creates_only_legal_placements() -> None:
    nvml = FakeNvml(hgx_h100(1, mig=1))
    h = nvml.nvmlDeviceGetHandleByIndex(0)

    def code(profile_id: int, start: int, size: int) -> int | None:
        try:
            nvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, profile_id, Placement(start, size))
        except NvmlError as exc:
            return exc.value
        return None

    assert code(9, 2, 4) == NVML_ERROR_INVALID_ARGUMENT  # 3g starts at 0 or 4 only
    assert code(9, 4, 3) == NVML_ERROR_INVALID_ARGUMENT  # 3g occupies 4 memory slices
    assert code(19, 7, 1) == NVML_ERROR_INVALID_ARGUMENT  # slice 7 is no 1g start
    assert code(9, 4, 4) is None
    assert code(14, 4, 2) == NVML_ERROR_INSUFFICIENT_RESOURCES  # overlaps 3g@4
    assert code(5, 0, 4) is None  # 4g@0 next to 3g@4
    assert code(19, 0, 1) == NVML_ERROR_INSUFFICIENT_RESOURCES  # the GPU is full
    assert nvml.gpus[0].layout() == ["3g.40gb@4", "4g.40gb@0"]
    off = FakeNvml(hgx_h100(1))
    with pytest.raises(NvmlError) as info:
        off.nvmlDeviceCreateGpuInstanceWithPlacement(Handle(0), 19, Placement(0, 1))
    assert info.value.value == NVML_ERROR_NOT_SUPPORTED  # MIG mode off


def test_fake_nvml_refuses_to_destroy_an_instance_in_use() -> None:
    nvml = FakeNvml(hgx_h100(1, mig=1))
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    apply_layout(nvml, h, H100, [MigInstance("3g.40gb", 0)])
    (gi,) = nvml.nvmlDeviceGetGpuInstances(h, 9)
    with pytest.raises(NvmlError) as info:
        nvml.nvmlGpuInstanceDestroy(gi)  # its compute instance is still there
    assert info.value.value == NVML_ERROR_IN_USE
    nvml.gpus[0].procs.append(FakeProc(4242, gpuInstanceId=1, computeInstanceId=0))
    (ci,) = nvml.nvmlGpuInstanceGetComputeInstances(gi, 2)
    with pytest.raises(NvmlError) as info:
        nvml.nvmlComputeInstanceDestroy(ci)
    assert info.value.value == NVML_ERROR_IN_USE


# ---------------------------------------------------------------------- mig_device
def test_apply_layout_creates_placements_and_keeps_what_stays() -> None:
    nvml = FakeNvml(hgx_h100(1, mig=1))
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    apply_layout(nvml, h, H100, [MigInstance("3g.40gb", 4), MigInstance("2g.20gb", 0)])
    first = read_instances(nvml, h, H100)
    assert layout_of(first) == ("2g.20gb@0", "3g.40gb@4")
    assert all(d.uuid and d.uuid.startswith("MIG-") for d in first)
    kept = next(d.uuid for d in first if d.profile == "3g.40gb")
    apply_layout(nvml, h, H100, [MigInstance("3g.40gb", 4), MigInstance("1g.10gb", 0)])
    now = read_instances(nvml, h, H100)
    assert layout_of(now) == ("1g.10gb@0", "3g.40gb@4")
    assert next(d.uuid for d in now if d.profile == "3g.40gb") == kept  # not re-created
    # largest first: the 4-slice instance was created before the 1-slice one
    creates = [c for c in nvml.calls if c == "nvmlDeviceCreateGpuInstanceWithPlacement"]
    assert len(creates) == 3


def test_apply_layout_never_destroys_a_busy_instance() -> None:
    nvml = FakeNvml(hgx_h100(1, mig=1))
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    apply_layout(nvml, h, H100, [MigInstance("3g.40gb", 0), MigInstance("3g.40gb", 4)])
    gi = next(d.gi_id for d in read_instances(nvml, h, H100) if d.start == 4)
    nvml.gpus[0].procs.append(FakeProc(777, gpuInstanceId=gi, computeInstanceId=0))
    nvml.calls.clear()
    with pytest.raises(MigApplyError, match=r"3g.40gb@4 is in use by pid 777: not destroyed"):
        apply_layout(nvml, h, H100, [MigInstance("7g.80gb", 0)])
    assert (
        "nvmlGpuInstanceDestroy" not in nvml.calls
        and "nvmlComputeInstanceDestroy" not in nvml.calls
    )
    assert nvml.gpus[0].layout() == ["3g.40gb@0", "3g.40gb@4"]


# ---------------------------------------------------------------------- the MIG manager
def test_a_decision_creates_the_instances_and_jobs_get_their_uuids() -> None:
    nvml = FakeNvml(hgx_h100(2, mig=2))
    mgr, devices, tel = _manager(nvml, _spec())
    mgr.reconfigure(_decision(1, "1g.10gb@6", "2g.20gb@4"), now=100.0)
    assert mgr.next_due() == 100.0  # real GPUs: at once, not after ready_after_s
    assert mgr.ready(100.0) == [MigReconfigured(1)]
    assert nvml.gpus[1].layout() == ["1g.10gb@6", "2g.20gb@4"]
    assert nvml.gpus[0].layout() == []
    made = {m.start: m.uuid for m in nvml.gpus[1].migs}
    assert devices.devices(_mig_assignment(1, "2g.20gb", 4)) == (made[4],)
    assert devices.devices(_mig_assignment(1, "1g.10gb", 6)) == (made[6],)
    assert b'gpufence_mig_reconfigures_total{result="ok"} 1.0' in tel.render()


def test_an_nvml_error_mid_reconfigure_reports_what_the_gpu_has() -> None:
    nvml = FakeNvml(hgx_h100(1, mig=1))
    mgr, devices, tel = _manager(nvml, _spec(1))
    # the second instance's compute instance fails: 3g@4 is made, 1g@0 is a bare GI
    nvml.fail_next("nvmlGpuInstanceCreateComputeInstance", 999, after=1)
    mgr.reconfigure(_decision(0, "3g.40gb@4", "1g.10gb@0"), now=10.0)
    (ev,) = mgr.ready(10.0)
    assert isinstance(ev, MigLayoutRead)
    assert ev.gpu == 0 and ev.usable and ev.layout == ("3g.40gb@4",)
    assert ev.failed.startswith("creating the compute instance of 1g.10gb@0: NVML error 999")
    made = next(m.uuid for m in nvml.gpus[0].migs)
    assert devices.devices(_mig_assignment(0, "3g.40gb", 4)) == (made,)
    assert mgr.board.gpu(0)["mig_failures"] == 1
    assert "1g.10gb@0" in mgr.board.gpu(0)["mig_error"]
    assert b'gpufence_mig_reconfigures_total{result="failed"} 1.0' in tel.render()
    # the next try on that GPU waits out a backoff, then succeeds (the bare GI is replaced)
    mgr.reconfigure(_decision(0, "3g.40gb@4", "1g.10gb@0"), now=11.0)
    assert mgr.next_due() == 15.0
    assert mgr.ready(14.0) == []
    assert mgr.ready(15.0) == [MigReconfigured(0)]
    assert nvml.gpus[0].layout() == ["1g.10gb@0", "3g.40gb@4"]
    assert "mig_error" not in mgr.board.gpu(0)


def test_a_destroy_failure_is_reported_not_retried_blindly() -> None:
    nvml = FakeNvml(hgx_h100(1, mig=1))
    mgr, _devices, _tel = _manager(nvml, _spec(1))
    mgr.reconfigure(_decision(0, "7g.80gb@0"), now=0.0)
    assert mgr.ready(0.0) == [MigReconfigured(0)]
    nvml.fail_next("nvmlGpuInstanceDestroy", NVML_ERROR_IN_USE)
    mgr.reconfigure(_decision(0, "3g.40gb@0", "3g.40gb@4"), now=1.0)
    (ev,) = mgr.ready(1.0)
    assert isinstance(ev, MigLayoutRead)
    assert ev.failed == "destroying GPU instance 7g.80gb@0: NVML error 19 (NVML error 19)"
    assert ev.layout == ()  # its compute instance went first: the GI is bare, so unusable
    assert nvml.gpus[0].layout() == ["7g.80gb@0"]


def test_fake_gpus_wait_out_the_decision_delay() -> None:
    cluster = cluster_from_dict(_spec(), source="test")
    from gpufence.control.gpus.discovery import fake_gpus

    mgr = MigManager(cluster, DeviceMap(cluster, fake_gpus(2)), None, threaded=False)
    mgr.reconfigure(_decision(0, "7g.80gb@0"), now=100.0)
    assert mgr.next_due() == 130.0
    assert mgr.ready(129.0) == []
    assert mgr.ready(130.0) == [MigReconfigured(0)]


def test_the_worker_thread_wakes_the_reconciler() -> None:
    import threading

    nvml = FakeNvml(hgx_h100(1, mig=1))
    cluster = cluster_from_dict(_spec(1), source="test")
    mgr = MigManager(cluster, DeviceMap(cluster, discover(nvml)), nvml)
    woke = threading.Event()
    mgr.set_wake(woke.set)
    mgr.reconfigure(_decision(0, "7g.80gb@0"), now=0.0)
    assert mgr.ready(0.0) == []  # handed to the worker
    assert woke.wait(5.0)
    assert mgr.ready(0.1) == [MigReconfigured(0)]
    mgr.close()


# ---------------------------------------------------------------------- start-up
@pytest.mark.parametrize(
    ("sharing", "mode", "words"),
    [
        ("mig", (0, 0), "MIG mode is off; enable it (nvidia-smi -i 0 -mig 1"),
        ("exclusive", (1, 1), "MIG mode is on, so the GPU cannot be handed out whole"),
        ("mig", (1, 0), "a MIG mode change to off waits for a GPU reset"),
        ("fractional", (0, 1), "a MIG mode change to on waits for a GPU reset"),
    ],
)
def test_a_gpu_whose_mig_mode_does_not_match_is_refused(
    sharing: str, mode: tuple[int, int], words: str
) -> None:
    gpus = hgx_h100(2)
    gpus[0].mig_mode = mode
    gpus[1].mig_mode = (1, 1) if sharing == "mig" else (0, 0)
    nvml = FakeNvml(gpus)
    mgr, _devices, _tel = _manager(nvml, _spec(2, sharing))
    events = mgr.startup()
    assert events[0] == MigLayoutRead(0, (), usable=False)
    assert words in mgr.board.gpu(0)["refused"]
    assert "refused" not in mgr.board.gpu(1)
    assert all(isinstance(e, MigLayoutRead) and e.gpu == 1 and e.usable for e in events[1:])
    assert "nvmlDeviceSetMigMode" not in nvml.calls  # never changed, not even tried


def test_startup_reads_the_instances_each_gpu_has() -> None:
    nvml = FakeNvml(hgx_h100(2, mig=2))
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    apply_layout(nvml, h, H100, [MigInstance("4g.40gb", 0), MigInstance("2g.20gb", 4)])
    mgr, devices, _tel = _manager(nvml, _spec(2, layout=("7g.80gb",)))
    assert mgr.startup() == [
        MigLayoutRead(0, ()),
        MigLayoutRead(1, ("4g.40gb@0", "2g.20gb@4")),
    ]
    uuid = next(m.uuid for m in nvml.gpus[1].migs if m.start == 4)
    assert devices.devices(_mig_assignment(1, "2g.20gb", 4)) == (uuid,)


def test_startup_keeps_a_live_attempts_instance_and_refuses_a_drifted_gpu() -> None:
    gpus = hgx_h100(1, mig=1)
    gpus[0].migs = [FakeMig("MIG-live", 1, 9, 4, 4, 3, 40448)]
    nvml = FakeNvml(gpus)
    mgr, _devices, _tel = _manager(nvml, _spec(1))
    ok = Claim(0, "3g.40gb", 4, "MIG-live", "j1", 1)
    assert mgr.startup([ok]) == [MigLayoutRead(0, ("3g.40gb@4",))]
    gone = Claim(0, "3g.40gb", 0, "MIG-gone", "j2", 1)
    assert mgr.startup([ok, gone]) == [MigLayoutRead(0, ("3g.40gb@4", "3g.40gb@0"), usable=False)]
    assert "job j2 attempt 1 runs on MIG 3g.40gb@0 (MIG-gone)" in mgr.board.gpu(0)["refused"]


def test_board_is_shared_with_the_views() -> None:
    board = GpuBoard()
    board.set(3, refused="x")
    board.set(3, refused=None, mps="running")
    assert board.gpu(3) == {"mps": "running"}
