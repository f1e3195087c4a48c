"""Shared pytest setup: the test helpers beside the tests (``scenario_harness``, ``strategies``,
``executor_helpers``) import by bare name from any test directory; the shipped test support is
``gpufence.testing``."""

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

    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI"):
        settings.load_profile("ci")
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass
