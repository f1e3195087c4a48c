"""A small HTTP client of the control-plane API (standard library only).

Where it connects, first found wins:

* URL: the ``url`` argument, ``$GPUFENCE_URL``, ``DATA/server.json`` (written by ``gpufence up``),
  else ``http://127.0.0.1:7878``;
* token: the ``token`` argument, ``$GPUFENCE_TOKEN``, ``DATA/admin.token``;

where DATA is ``$GPUFENCE_DATA`` or ``~/.gpufence`` (also the default ``--data`` of ``up``).
Errors are ``ClientError`` with a message fit for the terminal: the server's problem document
(its ``detail``, or each ``field: message`` of a 422), or what to do when there is no server.

``submit`` sends an ``Idempotency-Key`` (a fresh UUID per job, or the caller's) and retries
with the same key, so a retry never creates a second job. How long it tries depends on what it
knows:

* no server was ever reached (connection refused, unknown host): it fails at once -- nothing
  was sent, so nothing exists, and the user should hear "no server" without a wait;
* the request may have arrived but its answer was lost (the connection dropped mid-request, a
  timeout, 502/504): the job may exist. This is the control plane crashing after its commit,
  and a restart takes seconds, so it tries for ``SUBMIT_PATIENCE_S`` (through the refused
  connections of the restart, re-reading ``DATA/server.json`` for the new address). If that is
  not enough, the error says the job may exist and gives the key to submit again with;
* 503 (the store cannot write: nothing was created): a few short tries (``BUSY_RETRIES_S``).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

from gpufence.control.base.config import SERVER_FILE, TOKEN_FILE

DEFAULT_URL = "http://127.0.0.1:7878"
TIMEOUT_S = 40.0  # above the plane's own 30 s wait on the reconciler
START_HINT = "start one with `gpufence up --fake-gpus 8` (or `gpufence up` on a GPU machine)"
IDEMPOTENCY_KEY = "Idempotency-Key"
IDEMPOTENCY_KEY_PATTERN = re.compile(r"[\x21-\x7e]{1,255}")
"""What the server accepts as a key (1-255 visible ASCII characters)."""
SUBMIT_PATIENCE_S = 30.0
"""How long a submit whose answer was lost keeps trying (a control plane restarts in seconds)."""
BUSY_RETRIES_S = (0.2, 0.5, 1.0, 2.0)
"""Pauses between the tries of a submit the server answered 503 (about 4 s in all)."""
RETRYABLE = (502, 503, 504)
MAX_PAUSE_S = 2.0


def default_data_dir() -> Path:
    return Path(os.environ.get("GPUFENCE_DATA") or "~/.gpufence").expanduser()


class ClientError(Exception):
    """A request failed; ``str()`` is the message for the user."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        detail: Any = None,
        retry: bool = False,
        unsent: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail
        self.retry = retry or status in RETRYABLE
        """The request may not have reached the server, or it could not take it now: with an
        Idempotency-Key, sending it again is safe."""
        self.unsent = unsent
        """No server was reached at all (connection refused, unknown host): nothing was sent."""

    @property
    def bad_input(self) -> bool:
        """The request itself was wrong (invalid field, unknown job): CLI exit code 2."""
        return self.status in (400, 404, 422)


class Rejected(ClientError):
    """The scheduler rejected the job at submit (it can never run here)."""

    def __init__(self, message: str, reason: str, job: dict[str, Any]) -> None:
        super().__init__(message, 422)
        self.reason = reason
        self.job = job


@dataclass(frozen=True, slots=True)
class Text:
    """A text response (logs) with its headers."""

    body: bytes
    headers: Message


def format_problem(problem: Any) -> str:
    """A problem document for the terminal: ``field: message; ...`` for field errors (without
    the ``body.`` / ``query.`` prefix), else its ``detail``."""
    if not isinstance(problem, dict):
        return str(problem)
    errors = problem.get("errors")
    if isinstance(errors, list) and errors:
        lines = []
        for e in errors:
            if not isinstance(e, dict):
                continue
            field = str(e.get("field", ""))
            for prefix in ("body.", "query.", "path.", "header."):
                field = field.removeprefix(prefix)
            msg = str(e.get("message", ""))
            lines.append(f"{field}: {msg}" if field and field != "body" else msg)
        if lines:
            return "; ".join(lines)
    return str(problem.get("detail", problem.get("title", "")))


def _read_server_url(data: Path) -> str | None:
    try:
        raw = json.loads((data / SERVER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    url = raw.get("url") if isinstance(raw, dict) else None
    return url if isinstance(url, str) and url else None


class Client:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        data_dir: Path | None = None,
        timeout: float = TIMEOUT_S,
        follow: bool | None = None,
    ) -> None:
        """``follow``: after a lost answer, take the address the data directory's server wrote
        (it may have restarted on another port); default: when no URL was given, i.e. the URL
        is that server's."""
        data = data_dir or default_data_dir()
        self._data = data
        given = bool(url or os.environ.get("GPUFENCE_URL"))
        self._follow = not given if follow is None else follow
        written = None if given else _read_server_url(data)
        self._guessed = not given and written is None
        """The URL is the built-in default, not the data dir's server's: its admin token
        must not go there (``token``)."""
        self.url = (url or os.environ.get("GPUFENCE_URL") or written or DEFAULT_URL).rstrip("/")
        if urllib.parse.urlsplit(self.url).scheme not in ("http", "https"):
            raise ClientError(
                f"the server URL must start with http:// or https://, not {self.url!r} "
                f"(e.g. http://{self.url.split('://')[-1]})",
                400,
            )
        self._token = token or os.environ.get("GPUFENCE_TOKEN") or None
        self.timeout = timeout

    # ------------------------------------------------------------------ plumbing
    def token(self) -> str:
        if self._token is None:
            path = self._data / TOKEN_FILE
            if self._guessed:
                # its server is not running: whatever listens on the default port is someone
                # else's, and gets no admin token (issue 32, case 2)
                raise ClientError(
                    f"no gpufence server is running for the data dir {self._data} "
                    f"({self._data / SERVER_FILE} is missing): start it with `gpufence up "
                    f"--data {self._data}`, or pass the server's URL; its admin token is not "
                    f"sent to the default {DEFAULT_URL}",
                    retry=True,  # nothing was sent; a server starting there writes the file
                    unsent=True,
                )
            try:
                self._token = path.read_text(encoding="utf-8").strip()
            except OSError:
                raise ClientError(
                    f"no token: pass --token, set GPUFENCE_TOKEN, or run where `gpufence up` "
                    f"wrote {path}"
                ) from None
        return self._token

    def _open(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
        body: Any = None,
        auth: bool = True,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[bytes, Message]:
        url = self.url + path
        if query:
            items = query.items() if isinstance(query, Mapping) else query
            pairs = [(k, str(v)) for k, v in items if v is not None]
            if pairs:
                url += "?" + urllib.parse.urlencode(pairs)
        headers = {"Accept": "application/json, application/problem+json", **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.read(), resp.headers
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc) from None
        except (urllib.error.URLError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise ClientError(
                    f"the gpufence server at {self.url} did not answer in time", retry=True
                ) from None
            # refused, or no such host: the request never left (a reset or a dropped
            # connection may have delivered it)
            unsent = isinstance(reason, OSError) and not isinstance(
                reason, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)
            )
            raise ClientError(
                f"no gpufence server at {self.url} ({reason}): {self._start_hint()}",
                retry=True,
                unsent=unsent,
            ) from None
        except TimeoutError:
            raise ClientError(
                f"the gpufence server at {self.url} did not answer in time", retry=True
            ) from None
        except http.client.HTTPException as exc:  # a cut-off answer: the server went away
            raise ClientError(
                f"the gpufence server at {self.url} broke off its answer ({exc!r})", retry=True
            ) from None

    def _start_hint(self) -> str:
        """What to do: start a server, or -- a data directory with a token but no
        ``server.json`` (its server stopped, or the file was deleted) -- start or check its."""
        if self.url == DEFAULT_URL and (self._data / TOKEN_FILE).exists():
            return (
                f"{self._data / SERVER_FILE} is missing, so the default URL was tried: is "
                f"`gpufence up --data {self._data}` running? (It writes that file; else pass "
                "--url.)"
            )
        written = _read_server_url(self._data)
        if written is not None and written.rstrip("/") == self.url:
            # the data directory's own server (it wrote this URL) is down: `gpufence up` alone
            # would start another plane on ~/.gpufence
            return (
                f"start it with `gpufence up --data {self._data}` (add --fake-gpus N without GPUs)"
            )
        return START_HINT

    def _http_error(self, exc: urllib.error.HTTPError) -> ClientError:
        try:
            payload = json.loads(exc.read() or b"null")
        except ValueError:
            payload = None
        code = exc.code
        if code == 422 and isinstance(payload, dict) and isinstance(payload.get("job"), dict):
            reason = str(payload.get("reason") or "")
            return Rejected(str(payload.get("detail", "")), reason, dict(payload["job"]))
        if not isinstance(payload, dict):  # no problem document: not a gpufence server
            path = urllib.parse.urlsplit(exc.url).path if isinstance(exc.url, str) else ""
            return ClientError(
                f"{self.url} answered {code} {exc.reason} to {path or 'the request'}, without a "
                "gpufence error: is it a gpufence server (`gpufence up` prints its URL)?",
                code,
                payload,
            )
        msg = format_problem(payload)
        if code == 401:
            msg = f"unauthorized by {self.url}: {msg} (check --token / GPUFENCE_TOKEN)"
        elif code == 403:
            msg = f"forbidden by {self.url}: {msg}"
        elif code == 413:
            msg = f"too large: {msg}"
        elif code == 422:
            msg = f"invalid request: {msg}"
        elif code == 503:
            msg = f"unavailable ({self.url}): {msg}"
        return ClientError(str(msg), code, payload)

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        raw, _ = self._open(method, path, **kw)
        try:
            return json.loads(raw)
        except ValueError:
            raise ClientError(f"{self.url}{path} did not answer JSON; is it gpufence?") from None

    # ------------------------------------------------------------------ API
    def submit(
        self,
        request: dict[str, Any],
        idempotency_key: str | None = None,
        patience_s: float = SUBMIT_PATIENCE_S,
        on_retry: Callable[[ClientError], None] | None = None,
    ) -> dict[str, Any]:
        """201 -> ``{id, state, reason, message}``; a scheduler reject raises ``Rejected``.

        Sent with an Idempotency-Key (``idempotency_key``, else a fresh UUID) and retried with
        it as the module docstring says (``patience_s``: how long once the job may exist;
        ``on_retry``: told of each failed try before the pause): the job is created once,
        whatever happened to the earlier tries."""
        key = idempotency_key or str(uuid.uuid4())
        headers = {IDEMPOTENCY_KEY: key}
        deadline = time.monotonic() + patience_s
        busy = list(BUSY_RETRIES_S)
        maybe_sent = False
        pause = BUSY_RETRIES_S[0]
        while True:
            try:
                out: dict[str, Any] = self._json("POST", "/v1/jobs", body=request, headers=headers)
                return out
            except ClientError as exc:
                if not exc.retry or (exc.unsent and not maybe_sent):
                    raise  # an answer, or no server at all: nothing to wait for
                if exc.status == 503 and not maybe_sent:
                    if not busy:
                        raise
                    pause = busy.pop(0)
                else:
                    maybe_sent = True
                if time.monotonic() + pause > deadline:
                    if maybe_sent:
                        raise ClientError(
                            f"{exc}; the job may have been created before the answer was lost: "
                            f"submit it again with --idempotency-key {key} to get that job "
                            "(never a second one)",
                            exc.status,
                            exc.detail,
                            retry=True,
                        ) from None
                    raise
                if on_retry is not None:
                    on_retry(exc)
            time.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE_S)
            self._reread()

    def _reread(self) -> None:
        """After a lost answer: the data directory's server may have restarted elsewhere
        (``gpufence up --port 0``): take the address it wrote, if any."""
        if self._follow:
            url = _read_server_url(self._data)
            if url:
                self.url = url.rstrip("/")
                self._guessed = False

    def jobs(
        self,
        states: Sequence[str] = (),
        partition: str | None = None,
        tenant: str | None = None,
        limit: int = 1000,
        after: int = 0,
    ) -> list[dict[str, Any]]:
        query: list[tuple[str, Any]] = [("state", s) for s in states]
        query += [("partition", partition), ("tenant", tenant), ("limit", limit)]
        query += [("after", after)]
        out: list[dict[str, Any]] = self._json("GET", "/v1/jobs", query=query)["jobs"]
        return out

    def job(self, job_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", f"/v1/jobs/{_q(job_id)}")
        return out

    def cancel(self, job_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self._json("POST", f"/v1/jobs/{_q(job_id)}/cancel")
        return out

    def hold(self, ref: str) -> dict[str, Any]:
        """``{jobs: [{id, state, held}]}``: every pending job ``ref`` (id or name) denotes."""
        out: dict[str, Any] = self._json("POST", f"/v1/jobs/{_q(ref)}/hold")
        return out

    def release(self, ref: str) -> dict[str, Any]:
        out: dict[str, Any] = self._json("POST", f"/v1/jobs/{_q(ref)}/release")
        return out

    def admin(self, method: str, path: str, body: Any = None, query: Any = None) -> Any:
        """One of the admin's ``/v1/admin/...`` requests (``cli/account_verbs.py``)."""
        return self._json(method, "/v1/admin/" + path, body=body, query=query)

    def update(self, ref: str, changes: dict[str, Any]) -> dict[str, Any]:
        """``{jobs: [{id, state}]}``: ``PATCH /v1/jobs/{ref}`` with the fields to change
        (``priority``, ``time_limit_s``, ``partition``, ``queue``)."""
        out: dict[str, Any] = self._json("PATCH", f"/v1/jobs/{_q(ref)}", body=changes)
        return out

    def named(self, ref: str) -> list[dict[str, Any]]:
        """The jobs a name (or id) denotes: ``[{id, tenant, state, array}]``."""
        out: list[dict[str, Any]] = self._json("GET", f"/v1/names/{_q(ref)}")["jobs"]
        return out

    def explain(self, job_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", f"/v1/jobs/{_q(job_id)}/explain")
        return out

    def logs(
        self,
        job_id: str,
        attempt: int | None = None,
        rank: int = 0,
        stream: str = "out",
        offset: int = 0,
    ) -> Text:
        query = {"attempt": attempt, "rank": rank, "stream": stream, "offset": offset}
        body, headers = self._open("GET", f"/v1/jobs/{_q(job_id)}/logs", query=query)
        return Text(body, headers)

    def nodes(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self._json("GET", "/v1/nodes")["nodes"]
        return out

    def partitions(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self._json("GET", "/v1/partitions")["partitions"]
        return out

    def events(
        self, job_id: str | None = None, after: int = 0, limit: int = 1000
    ) -> list[dict[str, Any]]:
        query = {"job": job_id, "after": after, "limit": limit}
        out: list[dict[str, Any]] = self._json("GET", "/v1/events", query=query)["events"]
        return out

    def history(
        self,
        since: float | None = None,
        until: float | None = None,
        tenant: str | None = None,
        partition: str | None = None,
        states: Sequence[str] = (),
        limit: int = 1000,
        after: int = 0,
    ) -> list[dict[str, Any]]:
        """A page of ``GET /v1/history`` (``HistoryJob`` objects)."""
        query: list[tuple[str, Any]] = [("since", since), ("until", until), ("tenant", tenant)]
        query += [("partition", partition), *(("state", s) for s in states)]
        query += [("limit", limit), ("after", after)]
        out: list[dict[str, Any]] = self._json("GET", "/v1/history", query=query)["jobs"]
        return out

    def usage(
        self,
        by: str = "tenant",
        since: float = 0.0,
        until: float | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """``GET /v1/usage``: ``{by, since, until, groups: [...], total}``."""
        query = {"by": by, "since": since, "until": until, "tenant": tenant}
        out: dict[str, Any] = self._json("GET", "/v1/usage", query=query)
        return out

    def advice(self) -> dict[str, Any]:
        """``{"advice": [{rule, severity, path, why, evidence, fix, diff, scope}], "scope"}``."""
        out: dict[str, Any] = self._json("GET", "/v1/advice")
        return out

    def metrics(self) -> str:
        body, _ = self._open("GET", "/metrics", auth=False)
        return body.decode("utf-8")

    def healthz(self) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", "/healthz", auth=False)
        return out


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")
