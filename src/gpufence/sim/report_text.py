"""Small text formatting shared by the CLI tables and the HTML report."""

from __future__ import annotations


def dur(seconds: float) -> str:
    """A duration a person reads at a glance: 45 s, 12 min, 3.1 h."""
    if seconds != seconds:  # NaN
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
