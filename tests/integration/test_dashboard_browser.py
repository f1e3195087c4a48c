"""The web dashboard in a real browser (Playwright + Debian's Chromium) against a real
``gpufence up --fake-gpus 8`` (its own process) running real jobs.

The machine is fenced four ways (serving 0-1 may preempt training in an incident, training 2-5
with one queue per tenant, interactive 6 as MIG slices, batch 7 in fractional shares) with two
tenants. Checked: every page loads without a console error; the GPU map shows a running job on
the GPU the executor gave it; a job submitted through the CLI appears within 2 s; a tenant's
dashboard shows none of another tenant's jobs; an incident preemption appears as a mark in the
joint view. Screenshots of every page are saved (``dashboard_browser.artifacts_dir``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_browser import Tab, artifacts_dir, launch, sign_in
from tenant_server import JOB_PY, Server, gpufence_up

pytestmark = pytest.mark.skipif(not Path(JOB_PY).exists(), reason=f"needs {JOB_PY}")

VISION = "vision-dashboard-token-0123456789"
NLP = "nlp-dashboard-token-0123456789"
SLEEP = "import time; time.sleep(120)"
# a checkpointable job that ignores its notice, so the preemption ends in the plane's stop
STUBBORN = "import signal, time; signal.signal(signal.SIGUSR1, signal.SIG_IGN); time.sleep(120)"
CONFIG = """
name: dashboard
node_groups:
  - {name: local, count: 1, gpus_per_node: 8, gpu_type: H100-80GB, rack: rack-0,
     nvlink_domains: [8]}
partitions:
  serving:
    gpus: ["local:0-1"]
    admits: [serving]
    sharing: exclusive
    backfill: false
    preemption: {mode: incident-only, from: [training], budget: 4, window_s: 3600,
                 min_runtime_s: 0, grace_s: 2}
  training: {gpus: ["local:2-5"], admits: [training], sharing: exclusive}
  interactive:
    gpus: ["local:6"]
    admits: [interactive]
    sharing: mig
    mig: {layout: ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}
  batch: {gpus: ["local:7"], admits: [batch], sharing: fractional}
queues:
  - {name: vision, partition: training, tenant: vision}
  - {name: nlp, partition: training, tenant: nlp}
control:
  auth:
    tenants:
      vision: {token_env: GFT_DASH_VISION}
      nlp: {token_env: GFT_DASH_NLP}
  # test servers under pytest's 0700 tmp dirs, jobs from root's venv: explicitly root
  tenants: {vision: {run_as: root, allow_root: true}, nlp: {run_as: root, allow_root: true}}
  stop_grace_s: 2
  telemetry: {series_step_s: 0.5}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("dashboard")
    env = {**os.environ, "GFT_DASH_VISION": VISION, "GFT_DASH_NLP": NLP}
    for k in ("GPUFENCE_TOKEN", "GPUFENCE_URL", "GPUFENCE_CONTEXT"):
        env.pop(k, None)
    with gpufence_up(root, CONFIG, env, {"vision": VISION, "nlp": NLP}, gpus=8) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return artifacts_dir(tmp_path_factory)


@pytest.fixture(autouse=True)
def clean(server: Server) -> Iterator[None]:
    """Each test starts and ends on an idle cluster: whatever it left running is cancelled."""
    yield
    status, body, _ = server.call("GET", "/v1/jobs?state=pending&state=starting&state=running")
    assert status == 200, body
    for j in body["jobs"]:
        server.call("POST", f"/v1/jobs/{j['id']}/cancel")
    for j in body["jobs"]:
        server.wait(j["id"], ("cancelled", "done", "failed", "reclaimed"), timeout=30)


def admin_tab(browser: Any, server: Server, shots: Path) -> Tab:
    return sign_in(browser, server.url, server.tokens["admin"], shots)


def running_gpu(server: Server, job_id: str) -> str:
    """The GPU the executor gave a one-GPU job: its CUDA_VISIBLE_DEVICES entry."""
    job = server.wait(job_id, ("running",))
    devices = job["attempts"][-1]["devices"]
    assert len(devices) == 1 and len(devices[0]) == 1, devices
    return str(devices[0][0])


def test_the_page_and_its_assets_are_served_with_a_strict_policy(server: Server) -> None:
    with urllib.request.urlopen(server.url + "/", timeout=10) as resp:
        page = resp.read().decode()
        csp = resp.headers["Content-Security-Policy"]
    assert "/ui/app.js" in page and "script-src 'self'" in csp and "'unsafe" not in csp
    for name in ("app.js", "api.js", "base.css"):
        with urllib.request.urlopen(f"{server.url}/ui/{name}", timeout=10) as resp:
            assert resp.status == 200 and resp.read()
    assert "http://" not in page.replace(server.url, "") and "https://" not in page  # no CDN
    status, _, _ = server.call("GET", "/ui/..%2Fapi.py")
    assert status == 404
    req = urllib.request.Request(server.url + "/v1/dashboard/whoami")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 401


def test_every_page_loads_without_console_errors(server: Server, browser: Any, shots: Path) -> None:
    jid = server.submit("admin", SLEEP, name="sleeper")
    mig = server.submit("admin", SLEEP, name="notebook", mig="3g.40gb", **{"class": "interactive"})
    frac = server.submit("admin", SLEEP, name="eval", gpu_fraction=0.5, **{"class": "batch"})
    for j in (jid, mig, frac):
        server.wait(j, ("running",))
    tab = admin_tab(browser, server, shots)
    for route, name in (
        ("#/", "overview"),
        ("#/gpus", "gpus"),
        ("#/queue", "queue"),
        ("#/joint", "joint"),
        (f"#/jobs/{jid}", "job"),
    ):
        tab.go(route, name)
        tab.page.wait_for_timeout(300)
        tab.shot(f"page-{name}")
    assert "sleeper" in tab.text()  # the job page names its job
    tab.go("#/gpus", "gpus")
    slice_ = tab.page.locator(".gpu[data-gpu='6'] .slice[data-profile='3g.40gb']")
    assert mig in slice_.inner_text()  # the MIG instance shows the job on it
    assert frac in tab.page.locator(".gpu[data-gpu='7']").inner_text()
    assert tab.page.locator(".gpu[data-gpu='7'] .share").inner_text().strip() == "50 %"
    assert tab.errors == []


def test_gpu_map_shows_a_running_job_on_its_gpu(server: Server, browser: Any, shots: Path) -> None:
    jid = server.submit("vision", SLEEP, name="resnet", queue="vision")
    gpu = running_gpu(server, jid)
    tab = admin_tab(browser, server, shots)
    tab.go("#/gpus", "gpus")
    cells = tab.page.locator(f".gpu[data-jobs~='{jid}']")
    cells.first.wait_for()
    assert cells.count() == 1
    assert cells.get_attribute("data-gpu") == gpu
    assert cells.get_attribute("data-node") == "local-0"
    assert f"{jid} resnet" in cells.inner_text()
    tab.shot("gpu-map-running-job")
    assert tab.errors == []


def test_a_job_submitted_through_the_cli_appears_within_2_s(
    server: Server, browser: Any, shots: Path
) -> None:
    tab = admin_tab(browser, server, shots)
    tab.go("#/queue", "queue")
    # two 4-GPU gangs on the 4 training GPUs: the second one waits, with its reason sentence
    env = {**os.environ, "GPUFENCE_URL": server.url, "GPUFENCE_TOKEN": server.tokens["admin"]}
    env.pop("GPUFENCE_CONTEXT", None)
    cli = [sys.executable, "-m", "gpufence", "submit", "--gpus", "4", "--cwd", "/"]
    ids = []
    for name in ("first", "second"):
        out = subprocess.run(
            [*cli, "--name", name, "--", JOB_PY, "-c", SLEEP],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        ids.append(out.stdout.split()[0])
    submitted = time.monotonic()
    row = tab.page.locator(f"tr[data-job='{ids[1]}']")
    row.wait_for(timeout=2000)
    seen_s = time.monotonic() - submitted
    assert seen_s <= 2.0
    assert "free GPUs" in row.inner_text()  # the pending reason sentence
    tab.shot("queue-cli-job")
    assert tab.errors == []


def test_a_tenant_sees_only_its_own_jobs(server: Server, browser: Any, shots: Path) -> None:
    mine = server.submit("vision", SLEEP, name="vision-job", queue="vision")
    theirs = server.submit("nlp", SLEEP, name="nlp-job", queue="nlp")
    waiting = server.submit("nlp", SLEEP, name="nlp-waits", queue="nlp", gpus=4)
    for j in (mine, theirs):
        server.wait(j, ("running",))
    admin = admin_tab(browser, server, shots)
    admin.go("#/gpus", "gpus")
    admin.page.locator(f".gpu[data-jobs~='{theirs}']").wait_for()
    tab = sign_in(browser, server.url, VISION, shots)
    assert "tenant vision" in tab.page.inner_text("#who")
    seen = ""
    for route, name, state in (
        ("#/", "overview", None),
        ("#/gpus", "gpus", None),
        ("#/queue", "queue", "pending"),
        ("#/queue", "queue", "active"),
        ("#/joint", "joint", None),
    ):
        if state == "active":
            tab.page.select_option("select[data-filter='state']", "active")
            tab.page.locator(f"tr[data-job='{mine}']").wait_for()
        else:
            tab.go(route, name)
        seen += tab.text()
        tab.shot(f"tenant-{name}-{state or 'all'}")
    assert re.search(rf"\b{mine}\b", seen) and "vision-job" in seen
    for other in (theirs, waiting, "nlp-job", "nlp-waits"):
        assert not re.search(rf"\b{other}\b", seen), other
    tab.go("#/gpus", "gpus")
    assert tab.page.locator(f".gpu[data-jobs~='{mine}']").count() == 1
    assert tab.page.locator(f".gpu[data-jobs~='{theirs}']").count() == 0
    assert "other tenant" in tab.text()  # the GPU is shown as held, not whose
    assert tab.errors == [] and admin.errors == []
    tab.go(f"#/jobs/{theirs}", "job")  # another tenant's job page: refused, and said so
    assert "belongs to another tenant" in tab.page.inner_text("#page-error")
    assert "nlp-job" not in tab.text()
    assert tab.errors and all("status of 403" in e for e in tab.errors)  # the refusals only


def test_a_preemption_appears_as_a_mark_in_the_joint_view(
    server: Server, browser: Any, shots: Path
) -> None:
    serving = {"class": "serving"}
    base = [server.submit("admin", SLEEP, name="chat", **serving) for _ in range(2)]
    gang = server.submit("admin", STUBBORN, name="gang", replicas=2, gpus=2, checkpointable=True)
    for j in (*base, gang):
        server.wait(j, ("running",))
    tab = admin_tab(browser, server, shots)
    tab.go("#/joint", "joint")
    assert tab.page.locator("line.mark[data-kind='preemption']").count() == 0
    surge = server.submit("admin", SLEEP, name="chat", **serving)  # the fence is full
    mark = tab.page.locator(f"svg.chart line.mark[data-kind='preemption'][data-job='{gang}']")
    mark.first.wait_for(state="attached", timeout=30_000)
    assert mark.count() == 5  # through every chart of the joint view
    server.wait(surge, ("running",))
    tab.page.locator("[data-mark-count='preemption']").wait_for()
    assert "preemption × 1" in tab.page.inner_text("[data-mark-count='preemption']")
    row = tab.page.locator("tr[data-kind='preemption']")
    assert gang in row.first.inner_text()
    tab.shot("joint-preemption")
    assert tab.errors == []
