"""The server verb of the ``gpufence`` CLI: ``up`` starts the control plane on this machine.

The server modules (fastapi, uvicorn) are imported when ``up`` runs, so the client verbs stay
light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufence.cli.render import err_console
from gpufence.control.http.client import default_data_dir

DEFAULT_PORT = 7878  # = server.DEFAULT_PORT (the server module imports fastapi: kept lazy)


def up(
    config: Annotated[
        Path | None, typer.Option("--config", help="cluster spec YAML (with a control: section)")
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="data directory (store, logs, token) [default: $GPUFENCE_DATA or ~/.gpufence]",
            show_default=False,
        ),
    ] = None,
    fake_gpus: Annotated[
        int | None,
        typer.Option("--fake-gpus", help="run on N made-up GPUs (no NVIDIA GPU needed)"),
    ] = None,
    fake_gpu_type: Annotated[
        str, typer.Option("--fake-gpu-type", help="GPU type of the fake GPUs")
    ] = "H100-80GB",
    executor: Annotated[
        str,
        typer.Option(
            "--executor", help="where jobs run: local (this machine) or ray (a Ray cluster)"
        ),
    ] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address", help="Ray cluster to run on (--executor ray) [default: auto]"
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="port (0 = any free one)")] = DEFAULT_PORT,
    log_level: Annotated[str, typer.Option("--log-level")] = "info",
    strict: Annotated[
        bool,
        typer.Option("--strict", help="refuse to start when the spec gets advice warnings"),
    ] = False,
    no_containment: Annotated[
        bool,
        typer.Option(
            "--no-containment",
            help="run jobs without cgroups (no limits, no device isolation, strays survive); "
            "only where this machine offers no cgroup containment",
        ),
    ] = False,
) -> None:
    """Start the control plane: API server, reconciler and executor (local, or --executor ray)
    (Ctrl-C stops it; running jobs keep running and are adopted by the next `up` on the same
    --data)."""
    import logging

    from gpufence.control.http.server import StartupError, build_plane, serve
    from gpufence.control.privatefs import set_private_umask
    from gpufence.spec import SpecError, format_spec_error

    if not 0 <= port <= 65535:
        raise typer.BadParameter("must be 0..65535", param_hint="--port")
    data_dir = (data or default_data_dir()).expanduser()
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # before anything is created: the data dir, the store, the token, the jobs' files (the
    # launcher and the jobs inherit it) are private from their first byte
    set_private_umask()
    try:
        if config is not None:
            _lint(config, strict)
        plane = build_plane(
            config, data_dir, fake_gpus, fake_gpu_type, executor, ray_address, no_containment
        )
        serve(plane, host, port, log_level=log_level.lower())
    except SpecError as e:
        err_console().print(format_spec_error(e), markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except (StartupError, ValueError, FileNotFoundError) as e:
        err_console().print(f"error: {e}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _lint(config: Path, strict: bool) -> None:
    """The spec advice on the config file, as warnings on stderr (errors with --strict)."""
    from gpufence.cli.lint import lint_file
    from gpufence.control.config import control_schema
    from gpufence.spec import load_cluster_with_sections

    cluster, extra, lines = load_cluster_with_sections(config, ("control",))
    control = control_schema(extra.get("control"), str(config))
    lint_file(err_console(), cluster, config, strict, lines, control.advice)
