"""Shared pytest setup: make ``from builders import ...`` work from any test directory."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

# CI explores the same examples every run (a red CI must mean a change broke something, not an
# unlucky draw); locally hypothesis keeps drawing new examples to find new bugs.
try:
    import os

    from hypothesis import Phase, settings

    settings.register_profile("ci", derandomize=True, print_blob=True)
    # a quick first look at a failing property: the first failing example, not the smallest
    settings.register_profile("noshrink", phases=[Phase.explicit, Phase.generate])
    if os.environ.get("HYPOTHESIS_PROFILE"):
        settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])
    if os.environ.get("CI"):
        settings.load_profile("ci")
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass
