"""Shared pytest setup: the test helpers beside the tests (``scenario_harness``, ``strategies``,
``executor_helpers``) import by bare name from any test directory; the shipped test support is
``gpufence.testing``."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

# `gpufence up` writes a client context to $XDG_CONFIG_HOME/gpufence/config.yaml: every test (and
# every server a test starts as a subprocess) gets a private one, never the user's ~/.config
_XDG = tempfile.mkdtemp(prefix=f"gpufence-test-xdg-{os.getpid()}-")
os.environ["XDG_CONFIG_HOME"] = _XDG
for _name in ("GPUFENCE_CONFIG", "GPUFENCE_CONTEXT"):
    os.environ.pop(_name, None)
atexit.register(shutil.rmtree, _XDG, True)

# By default every run explores the same examples (a red test run must mean a change broke
# something, not an unlucky draw, and CI and a laptop see the same examples);
# HYPOTHESIS_PROFILE=explore draws new examples each run to hunt for new counterexamples
# (README, "Tests"), noshrink shows the first failing example quickly.
try:
    from hypothesis import Phase, settings

    settings.register_profile("ci", derandomize=True, print_blob=True)
    settings.register_profile("explore", derandomize=False, print_blob=True)
    # a quick first look at a failing property: the first failing example, not the smallest
    settings.register_profile("noshrink", phases=[Phase.explicit, Phase.generate])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass


# A root server without run_as creates gpufence-<tenant> users (control/base/tenant_users.py);
# the tests that make it do so remove them (unix_users.managed_users_removed), and so does the
# session, for any test that did not: only those it saw appear, and only when nothing runs as
# them (another session on this machine may be using its own).
_SESSION_USERS: contextlib.ExitStack | None = None


def pytest_sessionstart(session: object) -> None:
    global _SESSION_USERS
    if os.geteuid() == 0 and shutil.which("userdel") is not None:
        from unix_users import managed_users_removed

        _SESSION_USERS = contextlib.ExitStack()
        _SESSION_USERS.enter_context(managed_users_removed())


def pytest_sessionfinish(session: object, exitstatus: int) -> None:
    if _SESSION_USERS is not None:
        _SESSION_USERS.close()
