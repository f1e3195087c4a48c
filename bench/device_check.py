"""Device check: gpufence's real-GPU paths on this machine's NVIDIA GPU, in a few minutes.

With an NVIDIA GPU (NVML answers) it

1. checks discovery: model, memory, UUID, MIG mode and NVLink of every GPU;
2. runs a real job through ``gpufence up`` (a subprocess, HTTP on 127.0.0.1) on one whole GPU:
   the job (``cuda_probe.py``: ctypes on ``libcuda.so.1``) must see exactly one device, the one
   gpufence gave it (by UUID), and allocate 256 MiB;
3. while it runs, reads that GPU's utilisation and process list through NVML (the job's pid must
   be there), starts a foreign process on the GPU outside gpufence and waits for ``nodes`` to
   report it (the job's own process must not be reported);
4. runs two fractional shares (0.25 GPU, 2 GiB each) at once under MPS through ``gpufence up``:
   each sees the MPS variables, its first allocation (256 MiB) succeeds and the one beyond its
   limit (4 GiB more) fails.

It never changes MIG mode or any other device setting (a GPU in MIG mode is used as it is and
the whole-GPU and MPS checks skip it). Needs: this package installed (``pip install -e .``,
which brings nvidia-ml-py) and the NVIDIA driver (``libcuda.so.1``, ``nvidia-cuda-mps-control``
for step 4); no CUDA toolkit and no cuda-python.

Without a GPU it says so and runs a self-check of the same code paths on the fake NVML
(``gpufence.testing.fake_nvml``) with a fake ``nvidia-cuda-mps-control``: discovery, real job
processes through a control plane (in this process, not ``gpufence up``, since the fake NVML
lives in memory), the MPS environment of two shares, a dynamic MIG instance created for a job,
process lists and utilisation, and a real foreign process detected and killed. Memory-limit
enforcement itself needs a GPU and is not claimed there.

Prints one line of figures last; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufence.control.gpus.discovery import Discovery, DiscoveryError, discover, node_spec
from gpufence.control.http.client import Client

PROBE = str(Path(__file__).with_name("cuda_probe.py"))
MIB = 1 << 20


class Report:
    """Checks as they pass or fail, and the figures of the last line."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.figures: dict[str, Any] = {}

    def check(self, ok: bool, what: str, detail: str = "") -> bool:
        print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}", flush=True)
        if not ok:
            self.failures.append(what)
        return ok

    def note(self, text: str) -> None:
        print(f"     {text}", flush=True)


def _until(cond: Callable[[], Any], limit_s: float, poll_s: float = 0.2) -> Any:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(poll_s)
    return None


def _probe_cmd(*allocs: int, hold_s: float = 0.0) -> list[str]:
    cmd = [sys.executable, PROBE]
    for a in allocs:
        cmd += ["--alloc-mib", str(a)]
    return [*cmd, "--hold-s", str(hold_s)]


def _probe_out(data: Path, job_id: str) -> dict[str, Any] | None:
    path = data / "jobs" / job_id / "attempt-1" / "rank-0.out"
    try:
        line = path.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    out: dict[str, Any] = json.loads(line)
    return out


def check_discovery(rep: Report, d: Discovery) -> None:
    rep.check(bool(d.gpus), "discovery", d.source)
    for g in d.gpus:
        rep.check(
            bool(g.uuid.startswith("GPU-") and g.memory_mib > 0 and g.model),
            f"GPU {g.index}",
            f"{g.model}, {g.memory_mib / 1024:.1f} GiB, {g.uuid}, type {g.gpu_type or '?'}, "
            f"MIG {'on' if g.mig_enabled else 'off'} ({len(g.mig_devices)} instances), NVLink "
            + (f"peers {list(g.nvlink_peers)}" if g.nvlink_reported else "not reported"),
        )
    first = d.gpus[0] if d.gpus else None
    rep.figures.update(
        gpus=len(d.gpus),
        model=(first.model.replace(" ", "_") if first else "-"),
        mem_gib=round(first.memory_mib / 1024, 1) if first else 0,
        mig=sum(g.mig_enabled for g in d.gpus),
        nvlink_peers=len(first.nvlink_peers) if first else 0,
    )


# ---------------------------------------------------------------------- with a GPU
class Server:
    """``gpufence up`` on a config, in its own data dir, as its own process."""

    def __init__(self, root: Path, name: str, spec: dict[str, Any]) -> None:
        self.data = root / name
        self.data.mkdir(parents=True)
        config = root / f"{name}.yaml"
        config.write_text(json.dumps(spec))  # JSON is YAML
        self.log = root / f"{name}.log"
        cmd = [sys.executable, "-m", "gpufence", "up", "--config", str(config)]
        cmd += ["--data", str(self.data), "--port", "0"]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        if not _until(lambda: (self.data / "server.json").exists() or self.proc.poll(), 60):
            raise RuntimeError(f"gpufence up did not start; see {self.log}")
        if self.proc.poll() is not None:
            raise RuntimeError(f"gpufence up exited: {self.log.read_text()[-2000:]}")
        self.client = Client(data_dir=self.data)

    def wait_state(self, job_id: str, states: tuple[str, ...], limit_s: float) -> str:
        _until(lambda: self.client.job(job_id)["state"] in states, limit_s)
        return str(self.client.job(job_id)["state"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def _control() -> dict[str, Any]:
    return {"gpu_sample_interval_s": 1, "foreign_gpu_processes": "report", "stop_grace_s": 2}


def _nvml_processes(index: int) -> tuple[list[int], float | None]:
    from gpufence.control.gpus.nvml import PynvmlApi, maybe

    api = PynvmlApi()
    api.nvmlInit()
    try:
        h = api.nvmlDeviceGetHandleByIndex(index)
        pids = [int(p.pid) for p in api.nvmlDeviceGetComputeRunningProcesses(h)]
        util = maybe(api.nvmlDeviceGetUtilizationRates, h)
        return pids, None if util is None else util.gpu / 100
    finally:
        api.nvmlShutdown()


def check_whole_gpu(rep: Report, d: Discovery, root: Path) -> None:
    plain = [g for g in d.gpus if not g.mig_enabled]
    if not plain:
        rep.note(
            "every GPU is in MIG mode: the whole-GPU checks are skipped (MIG mode is not ours)"
        )
        return
    spec = node_spec(d)
    spec["control"] = _control()
    srv = Server(root, "whole", spec)
    foreign: subprocess.Popen[bytes] | None = None
    try:
        t0 = time.monotonic()
        jid = srv.client.submit({"command": _probe_cmd(256, hold_s=25), "gpus": 1})["id"]
        out = _until(lambda: _probe_out(srv.data, jid), 60)
        if not rep.check(out is not None, "whole-GPU job started", f"job {jid}"):
            rep.note((srv.data / "jobs" / jid / "attempt-1" / "rank-0.err").read_text()[-500:])
            return
        rep.figures["job_start_s"] = round(time.monotonic() - t0, 2)
        visible = out["env"].get("CUDA_VISIBLE_DEVICES", "")
        want = next((g.uuid for g in d.gpus if str(g.index) == visible), None)
        rep.check(out.get("cuda") is True, "CUDA in the job", out.get("error", ""))
        rep.check(
            out.get("devices") == 1 and out.get("uuid") == want,
            "the job sees exactly its GPU",
            f"CUDA_VISIBLE_DEVICES={visible}, {out.get('devices')} device(s), {out.get('uuid')}",
        )
        alloc = out.get("allocs", [{}])[0]
        rep.check(bool(alloc.get("ok")), "256 MiB allocated in the job", str(alloc))
        index = int(visible)
        pids, util = _nvml_processes(index)
        rep.check(out["pid"] in pids, "NVML lists the job's process", f"pids {pids}")
        rep.check(True, "NVML utilisation read", f"{util}")
        rep.figures.update(procs_seen=len(pids), util=util if util is not None else "-")
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": want or visible}
        t1 = time.monotonic()
        foreign = subprocess.Popen(_probe_cmd(64, hold_s=60), env=env, stdout=subprocess.DEVNULL)

        def reported() -> list[dict[str, Any]]:
            gpu = srv.client.nodes()[0]["gpus"][index]
            return list(gpu.get("foreign", []))

        seen = _until(lambda: [f for f in reported() if f["pid"] == foreign.pid], 30)
        rep.check(bool(seen), "a foreign process is reported on nodes", str(seen))
        rep.figures["foreign_detect_s"] = round(time.monotonic() - t1, 2) if seen else "-"
        mine = [f for f in reported() if f["pid"] == out["pid"]]
        rep.check(not mine, "the job's own process is not reported foreign", str(mine))
        metrics = srv.client.metrics()
        rep.check(
            "gpufence_foreign_gpu_process_incidents_total" in metrics,
            "the incident is counted on /metrics",
        )
        state = srv.wait_state(jid, ("done", "failed"), 60)
        rep.check(state == "done", "the whole-GPU job ended well", state)
    finally:
        if foreign is not None:
            foreign.kill()
            foreign.wait()
        srv.stop()


def check_mps(rep: Report, d: Discovery, root: Path) -> None:
    plain = [g for g in d.gpus if not g.mig_enabled]
    if not plain:
        rep.note("every GPU is in MIG mode: the MPS checks are skipped")
        return
    if not rep.check(
        shutil.which("nvidia-cuda-mps-control") is not None,
        "MPS available",
        "nvidia-cuda-mps-control on PATH",
    ):
        return
    spec = node_spec(d)
    group = spec["node_groups"][0]["name"]
    admits = ["serving", "training", "interactive", "batch"]
    gpu = plain[0].index
    spec["partitions"] = {
        "frac": {"gpus": [f"{group}:{gpu}"], "admits": admits, "sharing": "fractional"}
    }
    others = [g.index for g in d.gpus if g.index != gpu]
    if others:
        spec["partitions"]["rest"] = {
            "gpus": [f"{group}:{i}" for i in others],
            "admits": admits,
            "sharing": "exclusive",
        }
    spec.pop("queues", None)
    spec["control"] = _control()
    srv = Server(root, "mps", spec)
    try:
        (part,) = [p for p in srv.client.partitions() if p["name"] == "frac"]
        rep.check(
            bool(part.get("enforced")),
            "the fractional partition is enforced",
            part.get("enforcement", ""),
        )
        share = {"command": _probe_cmd(256, 4096, hold_s=8), "gpu_fraction": 0.25, "gpu_mem_gib": 2}
        ids = [
            srv.client.submit({**share, "class": "batch", "partition": "frac"})["id"]
            for _ in range(2)
        ]
        outs = [_until(lambda j=j: _probe_out(srv.data, j), 60) for j in ids]
        both = all(o is not None for o in outs)
        if not rep.check(both, "two shares started"):
            return
        for jid, out in zip(ids, outs, strict=True):
            env = out["env"]
            rep.check(
                env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == "0=2048M"
                and env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "25"
                and "CUDA_MPS_PIPE_DIRECTORY" in env,
                f"share {jid} has its MPS limits",
                json.dumps(env),
            )
            allocs = out.get("allocs", [])
            rep.check(
                len(allocs) == 2 and allocs[0]["ok"] and not allocs[1]["ok"],
                f"share {jid}: 256 MiB allocated, 4 GiB more refused (limit 2 GiB)",
                str(allocs),
            )
        rep.figures.update(mps="ok", share_limit_mib=2048, over_limit="refused")
        gpus = srv.client.nodes()[0]["gpus"]
        rep.check(
            str(gpus[gpu].get("mps", "")).startswith("running"),
            "MPS daemon on nodes",
            str(gpus[gpu].get("mps")),
        )
        for jid in ids:
            srv.wait_state(jid, ("done", "failed"), 60)
    finally:
        srv.stop()


def real_check(rep: Report, d: Discovery, root: Path) -> None:
    check_discovery(rep, d)
    check_whole_gpu(rep, d, root)
    check_mps(rep, d, root)


# ---------------------------------------------------------------------- without a GPU
def self_check(rep: Report, root: Path) -> None:
    """The same code paths on the fake NVML (see the module docstring)."""
    from gpufence.control.base.config import ADMIN, cluster_from_spec_dict, control_config
    from gpufence.control.base.jobspec import SubmitRequest
    from gpufence.control.plane import ControlPlane
    from gpufence.testing.fake_mps import install, log_lines
    from gpufence.testing.fake_nvml import FakeNvml, FakeProc, hgx_h100

    gpus = hgx_h100(3)
    gpus[2].mig_mode = (1, 1)
    gpus[0].util = 37
    nvml = FakeNvml(gpus)
    d = discover(nvml)
    check_discovery(rep, d)
    install(root / "bin")
    os.environ["PATH"] = f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    admits = ["serving", "training", "interactive", "batch"]
    spec: dict[str, Any] = {
        "name": "self",
        "node_groups": [{"name": "box", "count": 1, "gpus_per_node": 3, "gpu_type": "H100-80GB"}],
        "partitions": {
            "whole": {"gpus": ["box:0"], "admits": admits},
            "frac": {"gpus": ["box:1"], "admits": ["batch"], "sharing": "fractional"},
            "mig": {
                "gpus": ["box:2"],
                "admits": ["interactive"],
                "sharing": "mig",
                "mig": {"layout": [], "dynamic": True},
            },
        },
    }
    cfg = control_config(
        {**_control(), "gpu_sample_interval_s": 3600, "foreign_gpu_processes": "kill"}, root
    )
    plane = ControlPlane(cluster_from_spec_dict(spec), cfg, d, root / "data", nvml=nvml)
    plane.start()
    intruder = subprocess.Popen(["sleep", "60"])
    try:

        def run(**fields: Any) -> tuple[str, dict[str, Any] | None]:
            req = SubmitRequest.model_validate({"command": _probe_cmd(hold_s=20), **fields})
            jid = plane.submit(req, ADMIN).job_id
            return jid, _until(lambda: _probe_out(plane.data_dir, jid), 30)

        t0 = time.monotonic()
        whole, out = run(gpus=1, partition="whole")
        rep.figures["job_start_s"] = round(time.monotonic() - t0, 2)
        ok = out is not None and out["env"].get("CUDA_VISIBLE_DEVICES") == "0"
        rep.check(ok, "the whole-GPU job sees exactly its GPU (CUDA_VISIBLE_DEVICES=0)")
        rep.note(f"CUDA in the job: {out.get('error') if out else '-'} (no GPU here)")
        shares = [
            run(gpu_fraction=0.25, gpu_mem_gib=2, partition="frac", **{"class": "batch"})
            for _ in range(2)
        ]
        for jid, o in shares:
            env = o["env"] if o else {}
            rep.check(
                env.get("CUDA_VISIBLE_DEVICES") == f"GPU-{gpus[1].bus}"
                and env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == "0=2048M"
                and env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == "25",
                f"share {jid} runs under the GPU's MPS daemon with its limits",
                json.dumps(env),
            )
        rep.check(len(log_lines(plane.data_dir / "mps" / "gpu-1")) == 1, "one MPS daemon for GPU 1")
        mjob, mo = run(mig="2g.20gb", partition="mig", **{"class": "interactive"})
        # the re-cut leaves a full layout: the job's 2g and idle 1g instances around it
        made = [m.uuid for m in gpus[2].migs if m.slices == 2]
        rep.check(
            mo is not None and [mo["env"].get("CUDA_VISIBLE_DEVICES")] == made,
            "the MIG job sees the instance created for it",
            f"{gpus[2].layout()} {made}",
        )
        # NVML's process lists: the whole job's own process, and a real foreign one
        gpus[0].procs = [FakeProc(out["pid"]) if out else FakeProc(1), FakeProc(intruder.pid)]
        t1 = time.monotonic()
        plane.gpus.sample_once(plane._holders())
        seen = plane.nodes()[0]["gpus"][0].get("foreign", [])
        rep.check(
            [f["pid"] for f in seen] == [intruder.pid] and seen[0]["action"] == "killed",
            "the foreign process is reported and killed; the job's own is not",
            str(seen),
        )
        rep.check(intruder.wait(5) == -signal.SIGKILL, "the foreign process is gone")
        rep.figures["foreign_detect_s"] = round(time.monotonic() - t1, 3)
        util = plane.nodes()[0]["gpus"][0].get("utilization")
        rep.check(util == 0.37, "NVML utilisation read", str(util))
        rep.figures.update(procs_seen=2, util=util, mps="env-only", over_limit="needs-a-gpu")
        for jid in [whole, mjob, *[j for j, _ in shares]]:
            with contextlib.suppress(Exception):  # those already ended
                plane.cancel(jid, ADMIN)
    finally:
        if intruder.poll() is None:
            intruder.kill()
        intruder.wait()
        plane.close(kill_jobs=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--self-check", action="store_true", help="use the fake NVML even with a GPU")
    ap.add_argument("--keep", action="store_true", help="keep the temporary data directories")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpufence-device-check-"))
    rep = Report()
    t0 = time.monotonic()
    mode = "self-check"
    try:
        d = None if args.self_check else _discover_real()
        if d is None:
            print(
                "no NVIDIA GPU here (or --self-check): running the self-check on the fake NVML; "
                "nothing below touched a real device",
                flush=True,
            )
            self_check(rep, root)
        else:
            mode = "gpu"
            real_check(rep, d, root)
    except Exception as exc:  # a crash is a failure with its reason, and still the last line
        rep.check(False, "device check crashed", f"{type(exc).__name__}: {exc}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    figures = {"mode": mode, **rep.figures, "failures": len(rep.failures)}
    figures["wall_s"] = round(time.monotonic() - t0, 1)
    print(" ".join(f"{k}={v}" for k, v in figures.items()))
    return 1 if rep.failures else 0


def _discover_real() -> Discovery | None:
    try:
        return discover()
    except DiscoveryError as exc:
        print(f"NVML: {exc}", flush=True)
        return None


if __name__ == "__main__":
    sys.exit(main())
