"""Paging through the API's ``after`` cursor, the "N more" footer, and tables at 80 columns."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from gpufence.cli import output
from gpufence.cli.jobtables import queue_table
from gpufence.cli.output import more_footer, page_all


def pages(n: int, calls: list[tuple[int, int]]) -> Any:
    """A cursor source of n items (seq 1..n), pages of at most ``limit``."""

    def fetch(after: int, limit: int) -> list[dict[str, Any]]:
        calls.append((after, limit))
        return [{"seq": s} for s in range(after + 1, min(n, after + limit) + 1)]

    return fetch


@pytest.mark.parametrize(
    ("n", "limit", "shown", "more"),
    [
        (0, 100, 0, 0),
        (5, 100, 5, 0),
        (250, 100, 100, 150),
        (250, 0, 250, 0),
        (25_001, 3, 3, 24_998),
    ],
)
def test_page_all_counts_what_the_limit_leaves_out(
    monkeypatch: pytest.MonkeyPatch, n: int, limit: int, shown: int, more: int
) -> None:
    monkeypatch.setattr(output, "PAGE_MAX", 100)
    calls: list[tuple[int, int]] = []
    items, left, last = page_all(pages(n, calls), limit)
    assert (len(items), left, last) == (shown, more, n)
    assert [i["seq"] for i in items] == list(range(1, shown + 1))
    assert calls[0] == (0, 100) and all(b == 100 for _, b in calls)
    assert len(calls) == n // 100 + 1  # every page read once, through the cursor


def test_footer() -> None:
    assert more_footer(0, 100) is None
    assert more_footer(12, 100) == "12 more (use --limit 112 or --limit 0 for all)"


def _job(i: int) -> dict[str, Any]:
    return {
        "id": f"j{i}",
        "tenant": "vision-research",
        "class": "training",
        "partition": "training",
        "state": "pending",
        "gpus": "2x 8 GPUs",
        "submitted_at": 0,
        "name": "a-rather-long-job-name-for-the-table",
        "pending": {"reason": "quota", "message": "queue research is at its nominal quota " * 3},
        "spec": {"command": ["python", "train.py"]},
    }


def test_queue_table_fits_80_columns_cutting_free_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    buf = io.StringIO()
    Console(file=buf, width=80).print(queue_table([_job(i) for i in range(1, 4)]))
    lines = buf.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = [line for line in lines if line.lstrip().startswith("j")]
    assert [r.split()[0] for r in rows] == ["j1", "j2", "j3"]  # ids whole
    assert all("…" in r for r in rows)  # the reason is cut
    wide = io.StringIO()
    Console(file=wide, width=400).print(queue_table([_job(1)], wide=True))
    assert "queue research is at its nominal quota " * 2 in wide.getvalue()
    assert "python train.py" in wide.getvalue()
