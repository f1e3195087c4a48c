"""The server verb of the ``gpufence`` CLI: ``up`` starts the control plane on this machine.

The server modules (fastapi, uvicorn: the ``server`` extra) are imported when ``up`` runs, so
the client verbs stay light and a client-only install says what to install.

Once the server listens, ``up`` prints the line that points a shell at it::

    export GPUFENCE_URL=http://127.0.0.1:7878 GPUFENCE_DATA=/home/me/.gpufence

and writes a context for it to the client config (``clientconfig.py``), made current, so that
``gpufence queue`` in another terminal finds it without either variable.
"""

from __future__ import annotations

import logging
import re
import shlex
import threading
from pathlib import Path
from typing import Annotated

import typer

from gpufence.cli.render import err_console
from gpufence.control.http.client import default_data_dir

DEFAULT_PORT = 7878  # = server.DEFAULT_PORT (the server module imports fastapi: kept lazy)


def escape_control_characters(record: logging.LogRecord) -> bool:
    """A logging filter: the formatted message with control characters escaped (a newline in
    a job's cwd or name must not start a forged line of the server log); tracebacks keep
    their lines."""
    from gpufence.control.base.jobspec import escape

    msg = record.getMessage()
    if not (msg.isprintable() and msg.isascii()):
        record.msg, record.args = escape(msg), None
    return True


# up's options, declared apart so that its signature reads as the list of them
_ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", metavar="FILE", help="cluster spec YAML (with a control: section)"),
]
_DataOpt = Annotated[
    Path | None,
    typer.Option(
        "--data",
        metavar="DIR",
        help="data directory (store, logs, token) [default: $GPUFENCE_DATA or ~/.gpufence]",
        show_default=False,
    ),
]
_FakeGpusOpt = Annotated[
    int | None,
    typer.Option("--fake-gpus", metavar="N", help="run on N made-up GPUs (no NVIDIA GPU needed)"),
]
_FakeGpuTypeOpt = Annotated[
    str, typer.Option("--fake-gpu-type", metavar="TYPE", help="GPU type of the fake GPUs")
]
_ExecutorOpt = Annotated[
    str,
    typer.Option(
        "--executor",
        metavar="NAME",
        help="where jobs run: local (this machine) or ray (a Ray cluster)",
    ),
]
_RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        metavar="ADDRESS",
        help="Ray cluster to run on (--executor ray) [default: auto]",
    ),
]
_HostOpt = Annotated[str, typer.Option("--host", metavar="ADDRESS", help="address to listen on")]
_PortOpt = Annotated[int, typer.Option("--port", metavar="PORT", help="port (0 = any free one)")]
_LogLevelOpt = Annotated[
    str,
    typer.Option("--log-level", metavar="LEVEL", help="debug, info, warning or error (server log)"),
]
_SkipIntegrityCheckOpt = Annotated[
    bool,
    typer.Option(
        "--skip-integrity-check",
        help="start without PRAGMA quick_check of the store (a damaged store is refused)",
    ),
]
_StrictOpt = Annotated[
    bool,
    typer.Option("--strict", help="refuse to start when the spec gets advice warnings"),
]
_NoContainmentOpt = Annotated[
    bool,
    typer.Option(
        "--no-containment",
        help="run jobs without cgroups (no limits, no device isolation, strays survive); "
        "only where this machine offers no cgroup containment",
    ),
]
_ContextOpt = Annotated[
    str | None,
    typer.Option(
        "--context",
        metavar="NAME",
        help="name of the client context written for this server and made current "
        "[default: 'default' for ~/.gpufence, else the data dir's name]",
        show_default=False,
    ),
]
_NoContextOpt = Annotated[bool, typer.Option("--no-context", help="write no client context")]


def up(
    config: _ConfigOpt = None,
    data: _DataOpt = None,
    fake_gpus: _FakeGpusOpt = None,
    fake_gpu_type: _FakeGpuTypeOpt = "H100-80GB",
    executor: _ExecutorOpt = "local",
    ray_address: _RayAddressOpt = None,
    host: _HostOpt = "127.0.0.1",
    port: _PortOpt = DEFAULT_PORT,
    log_level: _LogLevelOpt = "info",
    skip_integrity_check: _SkipIntegrityCheckOpt = False,
    strict: _StrictOpt = False,
    no_containment: _NoContainmentOpt = False,
    context: _ContextOpt = None,
    no_context: _NoContextOpt = False,
) -> None:
    """Start the control plane: API server, reconciler and executor (local, or --executor ray)
    (Ctrl-C stops it; running jobs keep running and are adopted by the next `up` on the same
    --data)."""
    from gpufence.cli.extras import require

    require("server", "gpufence up")
    if executor == "ray":
        require("ray", "gpufence up --executor ray")
    from gpufence.control.http.server import StartupError, build_plane, listen_on, serve
    from gpufence.spec import SpecError, format_spec_error

    if not 0 <= port <= 65535:
        raise typer.BadParameter("must be 0..65535", param_hint="--port")
    # resolved: the same directory reached through another path (a symlink, ..) must name
    # the same attempt directories, whose paths name the members' cgroups (issue 30, case 2)
    data_dir = (data or default_data_dir()).expanduser().resolve()
    _prepare_process(log_level)
    try:
        if config is not None:
            _lint(config, strict)
        # the port first: one in use stops here, before a data directory or store is made
        listening = listen_on(host, port)
        plane = build_plane(
            config,
            data_dir,
            fake_gpus,
            fake_gpu_type,
            executor,
            ray_address,
            check_integrity=not skip_integrity_check,
            no_containment=no_containment,
        )
        ready = threading.Event()
        name = None if no_context else (context or default_context_name(data_dir))
        threading.Thread(
            target=announce, args=(ready, data_dir, name), name="announce", daemon=True
        ).start()
        serve(plane, host, port, ready=ready, log_level=log_level.lower(), listening=listening)
    except SpecError as e:
        err_console().print(format_spec_error(e), markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except (StartupError, ValueError, OSError) as e:
        # OSError: a --data that is a file, a directory it may not write, a full disk: the
        # operator gets the reason in one line, not a traceback
        err_console().print(f"error: {e}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _prepare_process(log_level: str) -> None:
    """The server log (its level, lines that user text cannot forge) and the umask that keeps
    every file the server and its jobs create private."""
    from gpufence.control.base.privatefs import set_private_umask

    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # before anything is created: the data dir, the store, the token, the jobs' files (the
    # launcher and the jobs inherit it) are private from their first byte
    set_private_umask()
    for handler in logging.getLogger().handlers:  # user text must not forge log lines
        handler.addFilter(escape_control_characters)


def default_context_name(data_dir: Path) -> str:
    """'default' for ``~/.gpufence`` (the built-in default: not $GPUFENCE_DATA, which names
    whatever server a shell last used), else the dir's name made a valid context name -- with
    a number added while that name is another data directory's context (``data``, ``data-2``:
    two planes whose dirs share a name must not overwrite each other's context)."""
    from gpufence.cli.clientconfig import ConfigError, load

    here = data_dir.expanduser().resolve()
    if here == Path("~/.gpufence").expanduser().resolve():
        return "default"
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", here.name).strip("-.") or "data"
    base = base[:56]
    try:
        taken = {n: c.data for n, c in load().contexts.items()}
    except (ConfigError, OSError):
        return base  # remember_server will say what is wrong with the file
    name, n = base, 1
    while name in taken and taken[name] is not None and Path(str(taken[name])) != here:
        n += 1
        name = f"{base}-{n}"
    return name


def export_line(url: str, data_dir: Path) -> str:
    return f"export GPUFENCE_URL={shlex.quote(url)} GPUFENCE_DATA={shlex.quote(str(data_dir))}"


def announce(ready: threading.Event, data_dir: Path, context: str | None) -> None:
    """Once the server listens: print the export line, write the client context."""
    from gpufence.cli.clientconfig import ConfigError, config_path, remember_server
    from gpufence.cli.connect import server_url
    from gpufence.control.base.config import TOKEN_FILE

    ready.wait()
    url = server_url(data_dir)
    if url is None:
        return
    data = data_dir.expanduser().resolve()
    typer.echo(export_line(url, data))
    token = data / TOKEN_FILE
    how = f"the admin token in {token} or a tenant's" if token.exists() else "your token"
    err_console().print(f"web dashboard: {url}/ (sign in with {how})", markup=False, soft_wrap=True)
    if context is None:
        return
    try:
        remember_server(context, url, data)
    except (ConfigError, OSError) as exc:  # the server runs anyway; say why the CLI may not
        err_console().print(f"warning: client context not written: {exc}", markup=False)
        return
    err_console().print(
        f"client context '{context}' (current) written to {config_path()}: the gpufence "
        "verbs find this server from any shell",
        markup=False,
        soft_wrap=True,
    )


def _lint(config: Path, strict: bool) -> None:
    """The spec advice on the config file, as warnings on stderr (errors with --strict)."""
    from gpufence.cli.speclint import lint_file
    from gpufence.control.base.config import control_schema
    from gpufence.spec import load_cluster_with_sections

    cluster, extra, lines = load_cluster_with_sections(config, ("control",))
    control = control_schema(extra.get("control"), str(config))
    lint_file(err_console(), cluster, config, strict, lines, control.advice)
