"""Fixtures for the integration tests: a LocalExecutor, cgroup drivers for the containment
tests, and a real API server per module."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from api_helpers import Server, run_server
from containment_helpers import MODES, clear, make_driver, unique
from executor_helpers import Recorder

from gpufence.control.containment.cgroup import CgroupDriver
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


@pytest.fixture
def cgroup_parent() -> str:
    """A cgroup parent of this test alone (removed by the driver fixtures)."""
    return unique("/gpufence-test")


@pytest.fixture(params=MODES)
def driver(request: pytest.FixtureRequest, cgroup_parent: str) -> Iterator[CgroupDriver]:
    """Each cgroup mode this machine has (v2 even without controllers: tracking, kill and BPF
    device isolation work there); skipped with the reason where one is missing."""
    d = make_driver(request.param, cgroup_parent)
    yield d
    clear(d)


@pytest.fixture
def v1(cgroup_parent: str) -> Iterator[CgroupDriver]:
    d = make_driver("v1", cgroup_parent)
    yield d
    clear(d)


@pytest.fixture
def cgroups(cgroup_parent: str) -> Iterator[Callable[[str, tuple[str, ...]], CgroupDriver]]:
    """``cgroups(mode, controllers)``: a driver that must offer ``controllers`` (skips with the
    reason otherwise); cleared at the end."""
    made: list[CgroupDriver] = []

    def make(mode: str, controllers: tuple[str, ...] = ()) -> CgroupDriver:
        d = make_driver(mode, cgroup_parent, controllers)
        made.append(d)
        return d

    yield make
    for d in made:
        clear(d)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``serve`` in a thread on 127.0.0.1 (see ``api_helpers``), shared by a module's tests."""
    yield from run_server(tmp_path_factory.mktemp("api"))
