"""``gpufence context list|use|show|set|delete``: the client config's named contexts.

The file and its format are in ``clientconfig.py``; ``gpufence up`` writes a context for the
server it starts. ``-o json`` documents:

* ``context list``: ``{"current": NAME|null, "config": PATH, "contexts": [CTX, ...]}``;
* ``context show``: CTX plus ``"resolved": {"url", "url_source", "token_source", "data"}`` (what a
  verb run now would use, with every flag and variable applied);

where CTX is ``{"name", "current", "url", "data", "token_source"}``. No token is ever printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpufence.cli.clientconfig import (
    ClientConfig,
    ConfigError,
    ContextEntry,
    check_name,
    load,
    save,
)
from gpufence.cli.connect import ContextOpt, DataOpt, TokenOpt, UrlOpt, fail, resolve
from gpufence.cli.output import Frame, OutputOpt, check_format, show
from gpufence.cli.render import Col, build_table

context_app = typer.Typer(
    help="Named client contexts (which control plane the verbs talk to), like kubeconfig's.",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(metavar="NAME", help="context name", show_default=False)]


def _load() -> ClientConfig:
    try:
        return load()
    except ConfigError as exc:
        raise fail(str(exc)) from None


def _ctx_doc(cfg: ClientConfig, c: ContextEntry) -> dict[str, Any]:
    return {
        "name": c.name,
        "current": c.name == cfg.current,
        "url": c.url,
        "data": c.data,
        "token_source": c.token_source(),
    }


COLS = (
    Col(""),
    Col("name", max_width=20),
    Col("url", max_width=32),
    Col("data", flex=True),
    Col("token", flex=True),
)


@context_app.command("list")
def list_contexts(output: OutputOpt = "table") -> None:
    """Every context of the client config; * marks the current one."""
    fmt = check_format(output)
    cfg = _load()
    docs = [_ctx_doc(cfg, c) for _, c in sorted(cfg.contexts.items())]
    rows = [
        [
            "*" if d["current"] else "",
            d["name"],
            d["url"] or "-",
            d["data"] or "-",
            d["token_source"] or "-",
        ]
        for d in docs
    ]
    frame = Frame(
        {"current": cfg.current, "config": str(cfg.path), "contexts": docs},
        lambda wide: build_table(COLS, rows, wide, title=str(cfg.path)),
        empty=None if docs else f"no contexts in {cfg.path} (`gpufence up` writes one)",
    )
    show(frame, fmt)


@context_app.command("use")
def use(name: NameArg) -> None:
    """Make NAME the current context (the verbs talk to its server from now on)."""
    cfg = _load()
    try:
        cfg.get(name)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    cfg.current = name
    save(cfg)
    typer.echo(f"current context: {name}")


@context_app.command("show")
def show_context(
    name: Annotated[
        str | None,
        typer.Argument(metavar="NAME", help="context [default: the current one]"),
    ] = None,
    output: OutputOpt = "table",
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """A context, and what a verb run now would connect to (with the flags and $GPUFENCE_*
    variables applied)."""
    fmt = check_format(output)
    cfg = _load()
    chosen = name or context
    try:
        entry = cfg.get(chosen) if chosen else (cfg.get(cfg.current) if cfg.current else None)
        target = resolve(url, token, data, chosen)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    doc: dict[str, Any] = _ctx_doc(cfg, entry) if entry else {"name": None, "current": False}
    doc["resolved"] = {
        "url": target.url,
        "url_source": target.url_source,
        "token_source": target.token_source
        if target.token
        else f"none found ({target.token_source})",
        "data": str(target.data) if target.data else None,
    }
    rows = [[k, str(v) if v is not None else "-"] for k, v in doc.items() if k != "resolved"]
    rows += [
        [f"resolved {k}", str(v) if v is not None else "-"] for k, v in doc["resolved"].items()
    ]
    show(
        Frame(doc, lambda wide: build_table((Col("key"), Col("value", flex=True)), rows, wide)), fmt
    )


@context_app.command("set")
def set_context(
    name: NameArg,
    url: Annotated[str | None, typer.Option("--url", metavar="URL", help="server URL")] = None,
    data: Annotated[
        Path | None,
        typer.Option("--data", metavar="DIR", help="data dir of a local `gpufence up`"),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option("--token-file", metavar="FILE", help="file holding the API token"),
    ] = None,
    use_it: Annotated[bool, typer.Option("--use", help="also make it current")] = False,
) -> None:
    """Create or change a context (e.g. a remote server: --url and --token-file)."""
    cfg = _load()
    try:
        check_name(name)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    entry = cfg.contexts.get(name) or ContextEntry(name)
    if url is not None:
        entry.url = url
    if data is not None:
        entry.data = str(data.expanduser().resolve())
    if token_file is not None:
        entry.token_file = str(token_file.expanduser().resolve())
    if not (entry.url or entry.data):
        raise fail(f"context {name}: give --url or --data (where its server is)")
    cfg.contexts[name] = entry
    if use_it or cfg.current is None:
        cfg.current = name
    save(cfg)
    typer.echo(
        f"context {name} saved in {cfg.path}" + (" (current)" if cfg.current == name else "")
    )


@context_app.command("delete")
def delete(name: NameArg) -> None:
    """Remove a context (the current context is then unset)."""
    cfg = _load()
    try:
        cfg.get(name)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    del cfg.contexts[name]
    if cfg.current == name:
        cfg.current = None
    save(cfg)
    typer.echo(f"context {name} deleted")
