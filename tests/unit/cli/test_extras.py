"""What each pip extra brings (pyproject.toml): a verb's extra must hold every package the
verb needs, or `pip install 'gpufence[X]'` leaves it refusing to start."""

from __future__ import annotations

import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def _extras() -> dict[str, list[str]]:
    with PYPROJECT.open("rb") as f:
        return dict(tomllib.load(f)["project"]["optional-dependencies"])


def test_ray_extra_brings_the_server() -> None:
    """`gpufence up --executor ray` is `gpufence up`: it needs the server extra too (issue 32,
    case 1: `pip install 'gpufence[ray]'` alone said to install the server extra)."""
    ray = _extras()["ray"]
    assert "gpufence[server]" in ray, ray
    assert any(dep.startswith("ray") for dep in ray), ray
