"""The README's test instructions say what the full suite needs, and the docs point only into
the repository for the design (issue 32, case 8)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def test_each_test_command_names_what_the_full_suite_needs() -> None:
    readme = (ROOT / "README.md").read_text()
    for heading in ("## On a fresh machine", "## Development"):
        flat = " ".join(_section(readme, heading).split())
        assert "python -m pytest" in flat, heading
        for need in ("chromium", "promtool", "Go >= 1.26", ".ci/run"):
            assert need in flat, (heading, need)
    assert (ROOT / ".ci" / "run").is_file()
    assert (ROOT / "docs" / "architecture.md").is_file()


def test_no_doc_points_to_the_design_outside_the_repository() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for doc in docs:
        assert "shared/DESIGN.md" not in doc.read_text(), doc
