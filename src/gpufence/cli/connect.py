"""Which control plane a client verb talks to, with which token; and how its errors end.

Every client verb takes ``--url``, ``--token``, ``--data`` and ``--context``. Each value is the
first one found of:

* data dir: ``--data``, ``$GPUFENCE_DATA``, the context's ``data``, else ``~/.gpufence`` (but not
  for a context that names only a ``url``: that is a remote server). A data dir given by flag or
  variable is a local server of its own: the context is then not used at all;
* URL: ``--url``, ``$GPUFENCE_URL``, the data dir's ``server.json`` (written by a running
  ``gpufence up``), the context's ``url``, else ``http://127.0.0.1:7878`` -- but never for a
  data dir's token or a data dir given: without its ``server.json`` its server is not running,
  and the verb fails saying so (whatever listens on the default port may be another user's);
* token: ``--token``, ``$GPUFENCE_TOKEN``, the context's ``token`` or ``token-file``, else the data
  dir's ``admin.token``;

where the context is ``--context``, else ``$GPUFENCE_CONTEXT``, else the config's
``current-context`` (``gpufence.cli.clientconfig``), else none.

Exit codes of the client verbs: 0 ok; 1 the server refused or is not there (rejected job,
401/403, no server, no token); 2 bad input (a bad flag, an invalid field, an unknown job).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from gpufence.cli.clientconfig import ConfigError, ContextEntry, config_path, load
from gpufence.cli.render import err_console
from gpufence.control.base.config import SERVER_FILE, TOKEN_FILE
from gpufence.control.http.client import DEFAULT_URL, Client, ClientError, Rejected

DEFAULT_DATA = Path("~/.gpufence")

UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        metavar="URL",
        help="control plane URL [default: $GPUFENCE_URL, DATA/server.json, the context's url]",
        show_default=False,
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        metavar="TOKEN",
        help="API token [default: $GPUFENCE_TOKEN, the context's token, DATA/admin.token]",
        show_default=False,
    ),
]
DataOpt = Annotated[
    Path | None,
    typer.Option(
        "--data",
        metavar="DIR",
        help="data dir of the `gpufence up` to talk to (its server.json and admin.token) "
        "[default: $GPUFENCE_DATA, the context's data, ~/.gpufence]",
        show_default=False,
    ),
]
ContextOpt = Annotated[
    str | None,
    typer.Option(
        "--context",
        metavar="NAME",
        help="client context to use (gpufence context list) [default: $GPUFENCE_CONTEXT, the "
        "current context]",
        show_default=False,
    ),
]


@dataclass(frozen=True, slots=True)
class Target:
    """Where a verb connects, and where each value came from (``context show`` prints it)."""

    url: str
    url_source: str
    token: str | None
    token_source: str
    data: Path | None
    context: str | None


def _context(name: str | None) -> ContextEntry | None:
    cfg = load()
    chosen = name or os.environ.get("GPUFENCE_CONTEXT") or cfg.current
    if not chosen:
        return None
    return cfg.get(chosen)


def resolve(
    url: str | None = None,
    token: str | None = None,
    data: Path | None = None,
    context: str | None = None,
) -> Target:
    """The URL, token and data dir for these flags (see the module docstring for the order)."""
    ctx = _context(context)
    data_dir: Path | None
    if data is not None or os.environ.get("GPUFENCE_DATA"):
        ctx = None  # a local server's own data dir: its server.json and token, no context
        data_dir = (data or Path(os.environ["GPUFENCE_DATA"])).expanduser()
    elif ctx is not None and ctx.data:
        data_dir = Path(ctx.data).expanduser()
    elif ctx is not None and ctx.url:
        data_dir = None  # a remote server: a local ~/.gpufence is not its data dir
    else:
        data_dir = DEFAULT_DATA.expanduser()
    where = f"context {ctx.name}" if ctx is not None else ""
    from_file = server_url(data_dir) if data_dir is not None else None
    if url:
        the_url, url_source = url, "--url"
    elif os.environ.get("GPUFENCE_URL"):
        the_url, url_source = os.environ["GPUFENCE_URL"], "$GPUFENCE_URL"
    elif from_file:
        the_url, url_source = from_file, f"{data_dir}/server.json"
    elif ctx is not None and ctx.url:
        the_url, url_source = ctx.url, f"{where} url"
    else:
        the_url, url_source = DEFAULT_URL, "default"
    the_token, token_source = _token(token, ctx, data_dir, where)
    return Target(
        the_url.rstrip("/"),
        url_source,
        the_token,
        token_source,
        data_dir,
        ctx.name if ctx is not None else None,
    )


def _token(
    token: str | None, ctx: ContextEntry | None, data_dir: Path | None, where: str
) -> tuple[str | None, str]:
    if token:
        return token, "--token"
    if os.environ.get("GPUFENCE_TOKEN"):
        return os.environ["GPUFENCE_TOKEN"], "$GPUFENCE_TOKEN"
    if ctx is not None and ctx.token:
        return ctx.token, f"{where} token"
    if ctx is not None and ctx.token_file:
        path = Path(ctx.token_file).expanduser()
        return _read_token(path), f"{where} token-file {path}"
    if data_dir is not None:
        path = data_dir / TOKEN_FILE
        return _read_token(path), str(path)
    return None, "none"


def server_url(data_dir: Path) -> str | None:
    """The URL a running ``gpufence up`` wrote to ``DATA/server.json``, if any."""
    try:
        raw = json.loads((data_dir / SERVER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    url = raw.get("url") if isinstance(raw, dict) else None
    return url if isinstance(url, str) and url else None


def _read_token(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def no_token_message(target: Target) -> str:
    """What to do when no token is found: every way to give one."""
    looked = target.token_source if target.token_source != "none" else "no token file"
    ctx = f" (context {target.context})" if target.context else ""
    return (
        f"no API token for {target.url}{ctx}: none given and none in {looked}. "
        "If the server was started with `gpufence up --data DIR`, pass --data DIR or "
        "`export GPUFENCE_DATA=DIR` (the export line `gpufence up` printed), or select its "
        f"context (`gpufence context use NAME`; contexts in {config_path()}); else pass "
        "--token TOKEN or set GPUFENCE_TOKEN."
    )


def _guessed_for_a_data_dir(target: Target) -> bool:
    """The URL is only the built-in default while a data dir was meant: its ``server.json`` is
    missing (its server stopped, or is restarting). Whatever listens on the default port then
    is not that server -- maybe another user's -- and must get neither the data dir's admin
    token nor a job meant for it (issue 32, case 2). A token given by flag or variable to the
    built-in ``~/.gpufence`` keeps the documented default URL."""
    if target.url_source != "default" or target.data is None:
        return False
    from_dir = target.token_source == str(target.data / TOKEN_FILE)
    return from_dir or target.data.resolve() != DEFAULT_DATA.expanduser().resolve()


def no_server_message(data: Path) -> str:
    return (
        f"no gpufence server is running for the data dir {data} ({data / SERVER_FILE} is "
        f"missing: a running `gpufence up --data {data}` writes it). Start it with `gpufence up "
        f"--data {data}` (add --fake-gpus N without GPUs), or name the server with --url; "
        f"the token is not sent to the default {DEFAULT_URL}"
    )


def client_for(
    url: str | None, token: str | None, data: Path | None, context: str | None
) -> Client:
    """A client for the verb's connection flags; exits 1 with the fix when there is no token,
    2 when the context is unknown or the config file is malformed."""
    try:
        target = resolve(url, token, data, context)
    except ConfigError as exc:
        err_console().print(f"error: {exc}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if target.token is None:
        err_console().print(f"error: {no_token_message(target)}", markup=False, soft_wrap=True)
        raise typer.Exit(1)
    if _guessed_for_a_data_dir(target):
        assert target.data is not None
        err_console().print(
            f"error: {no_server_message(target.data)}", markup=False, soft_wrap=True
        )
        raise typer.Exit(1)
    # after a lost answer the client re-reads DATA/server.json (a restart may change the port)
    # when the URL is that file's, or $GPUFENCE_URL beside a data directory (what `gpufence up`
    # prints for a shell: the port it names is gone after a restart); never an explicit --url
    local = target.url_source.endswith("server.json")
    follow = local or (target.url_source == "$GPUFENCE_URL" and target.data is not None)
    try:
        return Client(
            url=None if local else target.url,
            token=target.token,
            data_dir=target.data,
            follow=follow,
        )
    except ClientError as exc:  # a URL that is no http(s) URL
        err_console().print(f"error: {exc} ({target.url_source})", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None


@contextlib.contextmanager
def client_errors() -> Iterator[None]:
    """Client errors end the command with the server's message, never a traceback."""
    try:
        yield
    except Rejected as e:
        err_console().print(f"rejected ({e.reason}): {e}", markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except ClientError as e:
        err_console().print(f"error: {e}", markup=False, soft_wrap=True)
        raise typer.Exit(2 if e.bad_input else 1) from None


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` and return the Exit to raise (2: bad input)."""
    err_console().print(f"error: {message}", markup=False, soft_wrap=True)
    return typer.Exit(code)
