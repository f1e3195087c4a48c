"""Fixtures for the integration tests: a LocalExecutor, and a real API server per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from api_helpers import Server, run_server
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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``serve`` in a thread on 127.0.0.1 (see ``api_helpers``), shared by a module's tests."""
    yield from run_server(tmp_path_factory.mktemp("api"))
