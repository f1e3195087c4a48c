"""The client verbs' exit codes as the README's table gives them (issue 32, case 6): 0 ok, 1 the
server refused or is not there, 2 bad input (a bad flag or field, an unknown job). Through the
CLI and a real server on 127.0.0.1 (4 fake GPUs)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cli_server import Cli, CliServer, cli_for, cli_server

from gpufence.control.gpus.discovery import fake_gpus, node_spec

ADMIN = "exit-codes-admin-token-0123456789"
TENANT = "exit-codes-tenant-token-0123456789"
UNKNOWN = "j999999"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliServer]:
    spec = node_spec(fake_gpus(4))
    spec["control"] = {
        "auth": {"admin_token": ADMIN, "tenants": {"team-a": {"token": TENANT}}},
        # under pytest's 0700 tmp dirs, jobs from root's venv: explicitly root
        "tenants": {"team-a": {"run_as": "root", "allow_root": True}},
        "stop_grace_s": 1,
    }
    yield from cli_server(tmp_path_factory.mktemp("exit-codes"), spec, ADMIN)


@pytest.fixture
def cli(server: CliServer) -> Cli:
    return cli_for(server, ADMIN)


@pytest.mark.parametrize(
    "argv",
    [
        ["cancel", UNKNOWN],
        ["cancel", UNKNOWN, "j999998"],
        ["hold", UNKNOWN, "j999998"],
        ["release", UNKNOWN, "j999998"],
        ["cancel", "no-such-name"],
        ["status", UNKNOWN],
        ["hold", UNKNOWN],
    ],
)
def test_an_unknown_job_exits_2(cli: Cli, argv: list[str]) -> None:
    r = cli(*argv)
    assert r.exit_code == 2, (argv, r.output)
    assert "Traceback" not in r.output


def test_a_refusal_among_unknown_jobs_exits_1(cli: Cli, server: CliServer) -> None:
    """The server refusing one job (a tenant cancelling the admin's) is 1, not bad input."""
    jid = server.client.submit({"command": ["sleep", "30"], "gpus": 1, "hold": True})["id"]
    try:
        r = cli("cancel", jid, UNKNOWN, "--token", TENANT)
        assert r.exit_code == 1, r.output
    finally:
        server.client.cancel(jid)


@pytest.mark.parametrize("gpus", ["-1", "-8"])
def test_negative_gpus_exits_2_naming_the_flag(cli: Cli, gpus: str) -> None:
    r = cli("submit", "--gpus", gpus, "--", "true")
    assert r.exit_code == 2, r.output
    assert "--gpus" in r.output and "Traceback" not in r.output, r.output
