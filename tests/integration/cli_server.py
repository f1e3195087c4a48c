"""A real control plane for the CLI tests: ``run_server`` (api_helpers) on a spec, plus a typed
client and a ``cli`` runner pointed at it (the token and URL through the environment, as a user
sets them; no data dir, so the CLI cannot read the admin token from disk).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from api_helpers import run_server
from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.control.http.client import Client

Cli = Callable[..., Any]


@dataclass
class CliServer:
    url: str
    data: Path
    client: Client


def cli_server(root: Path, spec: dict[str, Any], token: str) -> Iterator[CliServer]:
    """Serve ``spec`` from ``root`` until the generator is closed (a module fixture's body)."""
    for srv in run_server(root, yaml.safe_dump(spec)):
        yield CliServer(srv.url, srv.data, Client(url=srv.url, token=token))


def cli_for(server: CliServer, token: str) -> Cli:
    runner = CliRunner()
    env = {"GPUFENCE_URL": server.url, "GPUFENCE_TOKEN": token, "GPUFENCE_DATA": None}

    def run(*args: str, **kw: Any) -> Any:
        return runner.invoke(app, list(args), env={**env, **kw.pop("env", {})}, **kw)

    return run
