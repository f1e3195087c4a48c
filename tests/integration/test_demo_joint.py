"""``gpufence demo``'s act 2 for real (8 fake GPUs, real processes, about 15 s): its summary has
the joint view - the serving deployment's p99 against its SLO from the replicas' own request
loops (scraped from their /metrics), the NIC figure of the loopback those requests travel over,
and the NVLink / PCIe figures of the demo's GPU model read back through the fake NVML's
counters and the GPU sampler."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from gpufence.control.gpus.discovery import fake_gpus
from gpufence.demo.live import SERVING_SLO_MS, fenced
from gpufence.testing.fake_nvml import FakeNvml, hgx_h100


def test_act_two_reports_serving_p99_vs_slo_and_the_interconnect(tmp_path: Path) -> None:
    console = Console(file=io.StringIO(), width=200)
    res = fenced(console, fake_gpus(8), tmp_path / "act2", lambda n: FakeNvml(hgx_h100(n)))
    rows = dict(res.rows)
    assert res.ok, rows
    p99 = rows["serving chat: p99 vs SLO"]
    m = re.match(r"([\d.]+) ms at the end, worst ([\d.]+) ms vs SLO ([\d.]+) ms; attainment", p99)
    assert m is not None, p99  # requests were measured (not "no requests measured")
    assert 0.0 < float(m.group(1)) <= float(m.group(2))
    assert float(m.group(3)) == SERVING_SLO_MS
    assert re.search(r"up to \d+ req/s on [1-9]\d* replicas", p99), p99
    nic = rows["NIC lo: peak throughput"]
    assert not nic.startswith("-") and "/s" in nic, nic
    nvlink = rows["nvlink utilisation: peak"]
    assert re.match(r"[1-9]\d*% on GPUs [\d, ]+ \(modelled: fake GPUs\)", nvlink), nvlink
    assert "pcie utilisation: peak" in rows
