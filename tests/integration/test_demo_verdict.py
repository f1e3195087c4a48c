"""``gpufence demo``'s act 2 verdict checks the serving SLO its table prints (issue 32, case 3):
run for real (8 fake GPUs, real processes) with an SLO no replica can meet, the verdict fails and
says which deployment missed it, by how much; the printed verdict row carries that text."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from gpufence.control.gpus.discovery import fake_gpus
from gpufence.demo import live
from gpufence.testing.fake_nvml import FakeNvml, hgx_h100


@pytest.mark.slow  # act 2 of the live demo (~15-30 s)
def test_a_missed_serving_slo_fails_the_verdict_and_says_what_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "SERVING_SLO_MS", 0.001)  # 1 us: every window misses it
    console = Console(file=io.StringIO(), width=300)
    res = live.fenced(console, fake_gpus(8), tmp_path / "act2", lambda n: FakeNvml(hgx_h100(n)))
    assert res.ok, res.rows  # the fence's own checks held: only the SLO fails the act
    assert len(res.misses) == 1, res.misses
    assert res.misses[0].startswith("serving chat missed its SLO: attainment 0.0% < 90% goal")
    assert "vs SLO 0.001 ms" in res.misses[0], res.misses
    out = Console(file=io.StringIO(), width=300, color_system=None)
    out.print(live._verdict(res))
    assert out.file.getvalue().startswith("FAILED: serving chat missed its SLO")  # type: ignore[attr-defined]
