"""Fixtures for the LocalExecutor integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from executor_helpers import Recorder

from gpufence.control.executors.local.local_executor import LocalExecutor


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


@pytest.fixture
def ex(rec: Recorder) -> Iterator[LocalExecutor]:
    executor = LocalExecutor()
    executor.set_callbacks(rec.on_exit, rec.on_ack)
    yield executor
    executor.close(kill=True)
