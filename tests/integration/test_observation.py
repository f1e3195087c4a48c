"""The control plane observing itself, end to end: a real server on 127.0.0.1 over 8 fake GPUs
whose counters come from the fake NVML, real job processes, a real serving replica (the demo's
``serve`` program: its own request loop and latency histogram) scraped over HTTP, latencies
pushed to ``POST /v1/jobs/{id}/latency``, and ``/metrics`` read as Prometheus would read it
(``promtool check metrics`` on the real scrape; skipped, saying why, without promtool).

Also dcgm-exporter's HPC job-mapping files (``control.telemetry.dcgm_job_mapping_dir``) as jobs
bind and release GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.control.base.config import SERVER_FILE, cluster_from_spec_dict, control_config
from gpufence.control.gpus.discovery import fake_gpus
from gpufence.control.http.server import serve
from gpufence.control.plane import ControlPlane
from gpufence.telemetry.measures import MEASURES
from gpufence.testing.fake_nvml import FakeNvml, hgx_h100
from gpufence.testing.waiting import until, until_value

ADMIN = "admin-token-0123456789"
TOKEN_A = "tenant-a-token-0123"
TOKEN_B = "tenant-b-token-0123"
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
FAIL = [sys.executable, "-c", "raise SystemExit(3)"]
DONE = [sys.executable, "-c", "pass"]

SPEC: dict[str, Any] = {
    "name": "observe-test",
    "node_groups": [
        {
            "name": "h100",
            "count": 1,
            "gpus_per_node": 8,
            "gpu_type": "H100-80GB",
            "nvlink_domains": [8],
        }
    ],
    "partitions": {
        "serving": {"gpus": ["h100:0-1"], "admits": ["serving"], "sharing": "exclusive"},
        "work": {"gpus": ["h100:2-7"], "admits": ["training", "batch"], "sharing": "exclusive"},
    },
    "queues": [
        {"name": "online", "partition": "serving"},
        {"name": "research", "partition": "work", "weight": 2},
        {"name": "product", "partition": "work", "weight": 1},
    ],
}


@dataclass
class Server:
    url: str
    data: Path
    plane: ControlPlane
    nvml: FakeNvml
    jobmap: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("observe")
    data, jobmap = root / "data", root / "job-mapping"
    raw = {
        "auth": {
            "admin_token": ADMIN,
            "tenants": {"team-a": {"token": TOKEN_A}, "team-b": {"token": TOKEN_B}},
        },
        # jobs from root's venv under pytest's 0700 tmp dirs: the tenants are explicitly root
        "tenants": {t: {"run_as": "root", "allow_root": True} for t in ("team-a", "team-b")},
        "stop_grace_s": 2,
        "gpu_sample_interval_s": 0.2,
        "telemetry": {
            "series_step_s": 0.25,
            "latency_window_s": 30,
            "series_retention_s": 300,
            "net_devices": ["lo"],
            "dcgm_job_mapping_dir": str(jobmap),
        },
    }
    nvml = FakeNvml(hgx_h100(8))
    cfg = control_config(raw, data)
    plane = ControlPlane(cluster_from_spec_dict(SPEC), cfg, fake_gpus(8), data, nvml=nvml)
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=serve,
        args=(plane, "127.0.0.1", 0, ready, stop),
        kwargs={"kill_jobs": True, "log_level": "warning"},
        daemon=True,
    )
    thread.start()
    assert ready.wait(30), "server did not start"
    info = json.loads((data / SERVER_FILE).read_text())
    yield Server(info["url"], data, plane, nvml, jobmap)
    stop.set()
    thread.join(30)


def call(srv: Server, method: str, path: str, token: str | None = ADMIN, body: Any = None) -> Any:
    """(status, parsed JSON or text)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(srv.url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, raw, ctype = resp.status, resp.read(), resp.headers.get("content-type", "")
    except urllib.error.HTTPError as exc:
        status, raw, ctype = exc.code, exc.read(), exc.headers.get("content-type", "")
    return status, json.loads(raw) if "json" in ctype else raw.decode()


def submit(srv: Server, body: dict[str, Any], token: str = ADMIN) -> str:
    status, out = call(srv, "POST", "/v1/jobs", token, body)
    assert status in (200, 201), out
    return str(out["id"])


def state(srv: Server, jid: str, states: tuple[str, ...], timeout: float = 30.0) -> Any:
    def read() -> Any:
        return call(srv, "GET", f"/v1/jobs/{jid}")[1]

    return until_value(read, lambda j: j["state"] in states, timeout, f"{jid} in {states}")


def scrape(srv: Server) -> str:
    status, text = call(srv, "GET", "/metrics", token=None)
    assert status == 200
    return str(text)


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    for lab, v in samples(text).get(name, []):
        if all(lab.get(k) == want for k, want in labels.items()):
            return v
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -------------------------------------------------------------------------------- the tests


def test_a_quiet_plane_exports_every_family_with_zeros_for_quiet_queues(server: Server) -> None:
    text = scrape(server)
    s = samples(text)
    assert "_created" not in text  # disable_created_metrics
    (build,) = s["gpufence_build_info"]
    assert build[1] == 1.0 and set(build[0]) == {"version", "python"}
    assert (
        s["gpufence_node_up"] == [({"node": "h100-0"}, 1.0)]
        or value(text, "gpufence_node_up") == 1.0
    )
    for q, p in (("online", "serving"), ("research", "work"), ("product", "work")):
        for name in ("gpufence_queue_pending_jobs", "gpufence_queue_running_jobs"):
            assert any(lab["queue"] == q and lab["partition"] == p for lab, _ in s[name]), (q, name)
        assert value(text, "gpufence_queue_admitted_jobs_total", queue=q) is not None
        assert value(text, "gpufence_jobs_finished_total", queue=q, outcome="failed") is not None
        assert value(text, "gpufence_queue_weighted_share", queue=q) is not None
        assert value(text, "gpufence_queue_usage_gpu_seconds", queue=q) is not None
    for name, serving, work in (
        ("gpufence_partition_capacity_gpus", 2.0, 6.0),
        ("gpufence_partition_used_gpus", None, None),
        ("gpufence_partition_lent_gpus", None, None),
        ("gpufence_partition_borrowed_gpus", None, None),
    ):
        got = {lab["partition"]: v for lab, v in s[name]}
        assert set(got) == {"serving", "work"}, name
        if serving is not None:
            assert (got["serving"], got["work"]) == (serving, work)
    assert "gpufence_partition_gpus" not in s  # the old one-gauge-with-a-kind-label is gone
    # every GPU: its uuid (DCGM joins on it), utilisation and memory from the fake NVML
    uuids = {lab["gpu"]: lab["uuid"] for lab, _ in s["gpufence_gpu_utilization"]}
    assert set(uuids) == {str(i) for i in range(8)}
    assert all(u.startswith("GPU-") for u in uuids.values())
    assert value(text, "gpufence_gpu_memory_total_bytes", gpu="0") == float(81559 << 20)
    for name in MEASURES:  # every measure declared (HELP/TYPE), even with nothing to report
        assert f"# TYPE {MEASURES[name].base}" in text, name


def test_a_running_job_maps_to_its_gpus_in_metrics_and_dcgm_files(server: Server) -> None:
    jid = submit(
        server, {"command": SLEEP, "class": "training", "gpus": 2, "queue": "product"}, TOKEN_B
    )
    state(server, jid, ("running",))
    nodes = call(server, "GET", "/v1/nodes")[1]["nodes"]
    gpus = sorted(str(g["index"]) for n in nodes for g in n["gpus"] if jid in (g.get("jobs") or []))
    text = until_value(
        lambda: scrape(server),
        lambda t: value(t, "gpufence_gpu_allocated", job_id=jid) is not None,
        10,
        "gpu_allocated of the job",
    )
    held = [lab for lab, v in samples(text)["gpufence_gpu_allocated"] if lab["job_id"] == jid]
    assert len(held) == 2
    for lab in held:
        assert lab["tenant"] == "team-b" and lab["partition"] == "work"
        assert lab["class"] == "training" and lab["mig"] == "" and lab["uuid"].startswith("GPU-")
    assert sorted(lab["gpu"] for lab in held) == gpus  # the GPUs /v1/nodes says it holds
    assert (
        value(text, "gpufence_queue_running_jobs", queue="product", **{"class": "training"}) == 1.0
    )
    used = value(text, "gpufence_partition_used_gpus", partition="work")
    assert used is not None and used >= 2.0
    # dcgm-exporter's job-mapping files: one per GPU index, the job id in each it holds
    until(
        lambda: (
            sorted(p.name for p in server.jobmap.iterdir() if jid in p.read_text())
            == sorted(lab["gpu"] for lab in held)
        ),
        10,
        "dcgm job mapping files",
    )
    assert sorted(p.name for p in server.jobmap.iterdir()) == [str(i) for i in range(8)]
    call(server, "POST", f"/v1/jobs/{jid}/cancel", TOKEN_B)
    state(server, jid, ("cancelled",))
    until(
        lambda: not any(jid in p.read_text() for p in server.jobmap.iterdir()),
        10,
        "dcgm files emptied at release",
    )
    until(
        lambda: value(scrape(server), "gpufence_gpu_allocated", job_id=jid) is None,
        10,
        "gpu_allocated gone at release",
    )


def test_outcomes_and_time_in_state_move(server: Server) -> None:
    before = scrape(server)
    done = submit(server, {"command": DONE, "class": "batch", "queue": "research"})
    failed = submit(server, {"command": FAIL, "class": "batch", "queue": "research"})
    state(server, done, ("done",))
    state(server, failed, ("failed",))
    lab = {"partition": "work", "queue": "research", "class": "batch"}

    def finished(text: str, outcome: str) -> float:
        return value(text, "gpufence_jobs_finished_total", **lab, outcome=outcome) or 0.0

    after = until_value(
        lambda: scrape(server),
        lambda t: finished(t, "failed") >= finished(before, "failed") + 1,
        10,
        "a failed job counted",
    )
    assert finished(after, "done") >= finished(before, "done") + 1
    running = value(after, "gpufence_job_state_seconds_count", state="running", **lab)
    assert running is not None and running >= 2
    cycles = value(after, "gpufence_scheduling_cycle_duration_seconds_count")
    assert cycles is not None and cycles > 0
    delays = value(after, "gpufence_queue_delay_seconds_count", **lab)
    assert delays is not None and delays >= 2


def test_serving_latency_scraped_from_a_real_replica_gives_p99_and_attainment(
    server: Server,
) -> None:
    """Submitted with the CLI (``gpufence submit --metrics-port P --slo-p99-ms ...``: the
    replica's own node, here 127.0.0.1; the demo's replicas give --metrics-url)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "gpufence.demo.programs", "serve", "--port", str(port)]
    url = f"http://127.0.0.1:{port}/metrics"
    env = {"GPUFENCE_URL": server.url, "GPUFENCE_TOKEN": TOKEN_A, "GPUFENCE_DATA": None}
    runner = CliRunner()
    flags = ["--class", "serving", "--name", "chat", "--slo-p99-ms", "250"]
    res = runner.invoke(
        app,
        [
            "submit",
            *flags,
            "--metrics-port",
            str(port),
            "--",
            *cmd,
            "--rps",
            "50",
            "--work-ms",
            "2",
        ],
        env=env,
    )
    assert res.exit_code == 0, res.output
    jid = res.stdout.strip().splitlines()[0]
    bad = runner.invoke(app, ["submit", "--metrics-url", url, "--", *SLEEP], env=env)
    assert bad.exit_code != 0 and "metrics_url" in bad.output  # a training job has no latency
    state(server, jid, ("running",))
    lab = {"deployment": "chat", "tenant": "team-a", "partition": "serving"}
    text = until_value(
        lambda: scrape(server),
        lambda t: (value(t, "gpufence_serving_requests_total", **lab) or 0) >= 20,
        30,
        "requests of the scraped replica",
    )
    p99 = value(text, "gpufence_serving_p99_seconds", **lab)
    assert p99 is not None and 0.001 <= p99 < 0.25  # 2 ms of work a request, on a busy machine
    assert value(text, "gpufence_serving_slo_seconds", **lab) == pytest.approx(0.25)
    assert value(text, "gpufence_serving_slo_attainment", **lab) == pytest.approx(1.0)
    assert value(text, "gpufence_serving_replicas", **lab) == 1.0
    up = value(text, "gpufence_serving_latency_source_up", job_id=jid)
    assert up == 1.0
    # the joint view reads the same book (GET /v1/series; its shape is the dashboard's)
    status, series = call(server, "GET", "/v1/series", TOKEN_A)
    assert status == 200, series
    assert "chat" in json.dumps(series)
    call(server, "POST", f"/v1/jobs/{jid}/cancel", TOKEN_A)
    state(server, jid, ("cancelled",))


def test_pushed_latencies_count_and_bad_pushes_are_refused(server: Server) -> None:
    body = {"command": SLEEP, "class": "serving", "name": "embed", "slo_p99_ms": 50}
    jid = submit(server, body, TOKEN_B)
    state(server, jid, ("running",))
    path = f"/v1/jobs/{jid}/latency"
    status, out = call(server, "POST", path, TOKEN_B, {"latencies_ms": [10.0] * 95 + [400.0] * 5})
    assert status == 202, out
    assert out == {"job_id": jid, "deployment": "embed", "accepted": 100}
    lab = {"deployment": "embed", "tenant": "team-b"}
    text = until_value(
        lambda: scrape(server),
        lambda t: value(t, "gpufence_serving_requests_total", **lab) == 100.0,
        10,
        "pushed requests",
    )
    p99 = value(text, "gpufence_serving_p99_seconds", **lab)
    assert p99 is not None and 0.3 <= p99 <= 0.45  # the slow 5 % are above the 99th
    assert value(text, "gpufence_serving_slow_requests_total", **lab) == pytest.approx(5.0)
    assert value(text, "gpufence_serving_slo_attainment", **lab) == 0.0  # its p99 missed 50 ms
    # refused, with a sentence: another tenant, a non-serving job, bad values, no such job
    assert call(server, "POST", path, TOKEN_A, {"latencies_ms": [1.0]})[0] == 403
    batch = submit(server, {"command": DONE, "class": "batch"}, TOKEN_B)
    status, out = call(server, "POST", f"/v1/jobs/{batch}/latency", TOKEN_B, {"latencies_ms": [1]})
    assert status == 409 and "only serving jobs" in json.dumps(out)
    status, out = call(server, "POST", path, TOKEN_B, {"latencies_ms": [-1.0]})
    assert status == 422 and "latencies_ms[0]" in json.dumps(out)
    assert call(server, "POST", path, TOKEN_B, {"latencies_ms": []})[0] == 422
    assert call(server, "POST", "/v1/jobs/nope/latency", ADMIN, {"latencies_ms": [1]})[0] == 404
    call(server, "POST", f"/v1/jobs/{jid}/cancel", TOKEN_B)
    state(server, jid, ("cancelled",))
    status, out = call(server, "POST", path, TOKEN_B, {"latencies_ms": [1.0]})
    assert status == 409 and "running replicas only" in json.dumps(out)


def test_gpu_and_link_counters_from_nvml_and_the_loopback_nic(server: Server) -> None:
    g = server.nvml.gpus[3]
    g.util, g.mem_used_mib = 64, 10240
    g.pcie_tx_kbs = 16_000_000  # 16 GB/s
    stop = threading.Event()

    def traffic() -> None:  # NVLink traffic while the sampler reads: ~90 GB/s out
        while not stop.wait(0.05):
            g.send(4.5e9, 0.0)

    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    try:
        text = until_value(
            lambda: scrape(server),
            lambda t: (
                (value(t, "gpufence_gpu_nvlink_bytes_per_second", gpu="3", direction="tx") or 0)
                > 1e9
                and value(t, "gpufence_gpu_utilization", gpu="3") == pytest.approx(0.64)
            ),
            10,
            "NVLink and utilisation of GPU 3",
        )
    finally:
        stop.set()
        t.join(5)
    assert value(text, "gpufence_gpu_memory_used_bytes", gpu="3") == float(10240 << 20)
    assert value(text, "gpufence_gpu_pcie_bytes_per_second", gpu="3", direction="tx") == 16e9
    nv = value(text, "gpufence_link_utilization", link="gpu3", link_class="nvlink")
    assert nv is not None and 0.0 < nv <= 1.0
    pcie = value(text, "gpufence_link_utilization", link="gpu3", link_class="pcie")
    assert pcie is not None and pcie == pytest.approx(16e9 / 63.015e9, rel=0.01)
    # the loopback NIC: real bytes (this test's own HTTP), no line rate, so no utilisation
    rx = value(text, "gpufence_node_network_bytes_per_second", device="lo", direction="rx")
    assert rx is not None and rx > 0
    assert value(text, "gpufence_link_utilization", link="lo") is None
    dev = os.stat(server.data).st_dev
    if os.major(dev) != 0:
        assert value(text, "gpufence_node_storage_busy_ratio") is not None
    g.util = g.mem_used_mib = g.pcie_tx_kbs = 0


def test_promtool_check_metrics_on_a_real_scrape(server: Server) -> None:
    """Last, on a scrape where every kind of series has samples (promtool lints only families
    with samples): a running training job, a serving deployment with pushed latencies, the
    GPU and NIC counters of the tests before."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus); .ci/run has it")
    train = submit(server, {"command": SLEEP, "class": "training", "queue": "research"})
    serving = submit(
        server, {"command": SLEEP, "class": "serving", "name": "lint", "slo_p99_ms": 9}
    )
    state(server, train, ("running",))
    state(server, serving, ("running",))
    push = {"latencies_ms": [3.0, 5.0, 12.0]}
    assert call(server, "POST", f"/v1/jobs/{serving}/latency", ADMIN, push)[0] == 202
    text = until_value(
        lambda: scrape(server),
        lambda t: value(t, "gpufence_serving_replicas", deployment="lint") == 1.0,
        10,
        "the serving deployment on /metrics",
    )
    s = samples(text)
    for name in (
        "gpufence_gpu_allocated",
        "gpufence_serving_requests_total",
        "gpufence_serving_p99_seconds",
        "gpufence_gpu_nvlink_bytes_per_second",
        "gpufence_node_network_bytes_per_second",
        "gpufence_job_state_seconds_bucket",
    ):
        assert s.get(name), f"{name} has no sample to lint"
    res = subprocess.run(
        [promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    for jid in (train, serving):
        call(server, "POST", f"/v1/jobs/{jid}/cancel")
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), (
        res.stdout + res.stderr
    )
