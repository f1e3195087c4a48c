"""The admin's verbs for accounts and QOS at run time (issue 32), over ``/v1/admin/*``:

* ``gpufence tenant list | add NAME | remove NAME``;
* ``gpufence token issue --tenant T [--expires 30d] | list [--tenant T] | revoke ID |
  rotate ID [--overlap 1h] [--expires 30d]``: a secret is printed once, on stdout alone, so
  ``TOKEN=$(gpufence token issue --tenant T)`` captures it (the id and expiry go to stderr);
* ``gpufence queue set QUEUE [--weight W] [--quota N|none]`` and ``gpufence queue show`` (each
  queue's weight and quota now, and whether the YAML or the admin set it); ``gpufence queue``
  alone still lists jobs;
* ``gpufence audit``: who changed what, when, old -> new.

What the admin changes is kept by the server and wins over the cluster YAML at every start for
what it changed (``control/plane/admin_accounts.py``). ``-o json`` prints the API's documents.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from gpufence.cli import job_verbs
from gpufence.cli.connect import ContextOpt, DataOpt, TokenOpt, UrlOpt, client_errors, client_for
from gpufence.cli.units import parse_duration
from gpufence.control.http.client import Client

tenant_app = typer.Typer(help="Tenants (admin): list, add, remove.", no_args_is_help=True)
token_app = typer.Typer(
    help="API tokens of tenants (admin): issue, list, revoke, rotate.", no_args_is_help=True
)
queue_app = typer.Typer(invoke_without_command=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="print the API's JSON document")]


def _client(url: str | None, token: str | None, data: Any, context: str | None) -> Client:
    return client_for(url, token, data, context)


def _print(rows: Sequence[dict[str, Any]], cols: Sequence[str], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(list(rows), indent=2))
        return
    cells = [[("-" if r.get(c) is None else str(r.get(c))) for c in cols] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(cols)]
    typer.echo("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    for row in cells:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _seconds(text: str | None, flag: str) -> float | None:
    if text is None or text.lower() in ("never", "none"):
        return None
    try:
        s = parse_duration(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from None
    if s <= 0:
        raise typer.BadParameter("must be more than 0 (or 'never')", param_hint=flag)
    return s


# ---------------------------------------------------------------------------- tenant


@tenant_app.command("list")
def tenant_list(
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Every tenant: the cluster YAML's (less those removed) and those added at run time."""
    with client_errors():
        rows = _client(url, token, data, context).admin("GET", "tenants")
    _print(rows, ("name", "source", "tokens"), as_json)


@tenant_app.command("add")
def tenant_add(
    name: Annotated[str, typer.Argument(help="the new tenant's name")],
    run_as: Annotated[
        str | None,
        typer.Option("--run-as", metavar="USER", help="Unix user of its jobs (default: managed)"),
    ] = None,
    allow_root: Annotated[
        bool, typer.Option("--allow-root", help="let --run-as name root (uid 0)")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Add a tenant; then give it a token: gpufence token issue --tenant NAME."""
    with client_errors():
        body = {"name": name, "run_as": run_as, "allow_root": allow_root}
        _client(url, token, data, context).admin("POST", "tenants", body)
    typer.echo(f"tenant {name} added; give it a token: gpufence token issue --tenant {name}")


@tenant_app.command("remove")
def tenant_remove(
    name: Annotated[str, typer.Argument(help="a tenant with no job pending or running")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Remove a tenant (refused while it has jobs pending or running); its tokens stop."""
    with client_errors():
        _client(url, token, data, context).admin("DELETE", f"tenants/{name}")
    typer.echo(f"tenant {name} removed")


# ---------------------------------------------------------------------------- token

ExpiresOpt = Annotated[
    str | None,
    typer.Option("--expires", metavar="DURATION", help="valid for this long: 30d, 12h, 90 (s)"),
]


def _issued(out: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    expiry = out["expires_at"] or "never"
    typer.echo(f"token {out['id']} of tenant {out['tenant']}, expires {expiry}", err=True)
    typer.echo("the secret below is shown this once; the server keeps only its hash:", err=True)
    typer.echo(out["token"])


@token_app.command("issue")
def token_issue(
    tenant: Annotated[str, typer.Option("--tenant", metavar="NAME", help="whose token")],
    expires: ExpiresOpt = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Issue a token for a tenant and print its secret (once)."""
    body = {"tenant": tenant, "expires_in_s": _seconds(expires, "--expires")}
    with client_errors():
        out = _client(url, token, data, context).admin("POST", "tokens", body)
    _issued(out, as_json)


@token_app.command("list")
def token_list(
    tenant: Annotated[
        str | None, typer.Option("--tenant", metavar="NAME", help="only this tenant's tokens")
    ] = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Tokens issued at run time, by id: never their secrets."""
    with client_errors():
        rows = _client(url, token, data, context).admin("GET", "tokens", query={"tenant": tenant})
    cols = ("id", "tenant", "status", "created_at", "expires_at", "replaced_by")
    _print(rows, cols, as_json)


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[str, typer.Argument(metavar="ID", help="tok-... (gpufence token list)")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Revoke a token now: requests with it get 401."""
    with client_errors():
        _client(url, token, data, context).admin("POST", f"tokens/{token_id}/revoke")
    typer.echo(f"token {token_id} revoked")


@token_app.command("rotate")
def token_rotate(
    token_id: Annotated[str, typer.Argument(metavar="ID", help="tok-... (gpufence token list)")],
    overlap: Annotated[
        str | None,
        typer.Option("--overlap", metavar="DURATION", help="the old secret works this long more"),
    ] = None,
    expires: ExpiresOpt = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """A new secret in place of a token's (printed once); the old stops now or after --overlap."""
    body = {
        "overlap_s": _seconds(overlap, "--overlap") or 0.0,
        "expires_in_s": _seconds(expires, "--expires"),
    }
    with client_errors():
        out = _client(url, token, data, context).admin("POST", f"tokens/{token_id}/rotate", body)
    _issued(out, as_json)


# ---------------------------------------------------------------------------- queue


def _queue(ctx: typer.Context, **kw: Any) -> None:
    # ``gpufence queue`` with no sub-command lists jobs, as it always did
    if ctx.invoked_subcommand is None:
        job_verbs.queue(**kw)


# the listing's options are job_verbs.queue's own (one definition), after the context
_LISTING = inspect.signature(job_verbs.queue, eval_str=True)
_CTX = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
setattr(  # noqa: B010 -- a function's signature, as typer reads it
    _queue, "__signature__", _LISTING.replace(parameters=[_CTX, *_LISTING.parameters.values()])
)
_queue.__doc__ = job_verbs.queue.__doc__
queue_app.callback(invoke_without_command=True)(_queue)


@queue_app.command("set")
def queue_set(
    queue: Annotated[str, typer.Argument(metavar="QUEUE", help="a queue of the cluster spec")],
    weight: Annotated[
        float | None, typer.Option("--weight", metavar="W", help="fair-share weight, > 0")
    ] = None,
    quota: Annotated[
        str | None,
        typer.Option("--quota", metavar="N", help="nominal quota in GPUs, or 'none' (no quota)"),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Change a queue's weight and/or quota (admin); the next scheduling cycle uses them. A
    quota below what the queue runs stops nothing: new work of the queue waits."""
    body: dict[str, Any] = {}
    if weight is not None:
        if weight <= 0:
            raise typer.BadParameter("must be more than 0 (e.g. 2)", param_hint="--weight")
        body["weight"] = weight
    if quota is not None:
        body["quota_gpus"] = _quota(quota)
    if not body:
        raise typer.BadParameter("give --weight W, --quota N (or both)", param_hint="QUEUE")
    with client_errors():
        out = _client(url, token, data, context).admin("PATCH", f"queues/{queue}", body)
    shown = "none" if out["quota_gpus"] is None else f"{out['quota_gpus']:g} GPUs"
    typer.echo(f"queue {queue}: weight {out['weight']:g}, quota {shown} (from the next cycle)")


def _quota(text: str) -> float | None:
    if text.lower() == "none":
        return None
    try:
        n = float(text)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not a number of GPUs; write e.g. 4, 0.5 or none", param_hint="--quota"
        ) from None
    if not 0 <= n <= 1e6:
        raise typer.BadParameter("must be between 0 and 1e6 GPUs, or none", param_hint="--quota")
    return n


@queue_app.command("show")
def queue_show(
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Each queue's weight and quota now, and whether the YAML or the admin set each (admin)."""
    with client_errors():
        rows = _client(url, token, data, context).admin("GET", "queues")
    cols = ("queue", "partition", "tenant", "weight", "weight_source", "quota_gpus", "quota_source")
    _print(rows, cols, as_json)


def audit(
    limit: Annotated[
        int, typer.Option("--limit", metavar="N", min=1, max=1000, help="the newest N changes")
    ] = 50,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    data: DataOpt = None,
    context: ContextOpt = None,
) -> None:
    """Changes to tenants, tokens and queues, newest first: who, what, when, old -> new."""
    with client_errors():
        rows = _client(url, token, data, context).admin("GET", "audit", query={"limit": limit})
    _print(rows, ("seq", "at", "actor", "action", "target", "old", "new"), as_json)
