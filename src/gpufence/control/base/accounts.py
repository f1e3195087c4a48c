"""Tenants and API tokens the admin manages at run time, over the cluster YAML's.

The YAML (``control.auth``) is the starting point; what the admin changed since, through the
API or the CLI (``gpufence tenant`` / ``token``), is kept in the store and wins over the YAML
for what it changed: a tenant added at run time exists, a tenant removed at run time is gone
(its YAML token stops working too) until it is added again. ``Accounts`` is the plane's memory
of those rows, loaded at start and updated after each committed change, read by every request's
authentication on the API threads (hence the lock).

Tokens issued at run time are shown once and kept only as SHA-256 digests, as ``tokens.py``
keeps the YAML's: a secret is 32 random URL-safe characters (``secrets.token_urlsafe(24)``),
so a digest cannot be reversed by guessing. Each has an id (``tok-`` and 8 hex digits) that
lists, revokes and rotates it without revealing it. A token that expired, was revoked or was
rotated out is refused with a message that says which and what to do, never which secret.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpufence.control.base.executor import RunAs
from gpufence.control.base.tokens import digest

TOKEN_PREFIX = "gft_"
"""Issued secrets start with this, so a leaked one is recognisable (secret scanners)."""


def new_token_id() -> str:
    return f"tok-{secrets.token_hex(4)}"


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(24)


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """One issued token, as the store keeps it: never its secret."""

    id: str
    tenant: str
    digest: bytes
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    replaced_by: str | None = None

    def refusal(self, now: float) -> str | None:
        """Why this token is refused at ``now`` (None: it is valid)."""
        fix = f"ask the admin for a new one (gpufence token issue --tenant {self.tenant})"
        if self.revoked_at is not None and self.revoked_at <= now:
            if self.replaced_by:
                return f"token {self.id} was rotated: use its replacement {self.replaced_by}"
            return f"token {self.id} was revoked at {iso(self.revoked_at)}; {fix}"
        if self.expires_at is not None and self.expires_at <= now:
            if self.replaced_by:
                return (
                    f"token {self.id} was rotated and its overlap ended at "
                    f"{iso(self.expires_at)}: use its replacement {self.replaced_by}"
                )
            return f"token {self.id} expired at {iso(self.expires_at)}; {fix}"
        return None

    def status(self, now: float) -> str:
        if self.revoked_at is not None and self.revoked_at <= now:
            return "rotated" if self.replaced_by else "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass
class Accounts:
    """Run-time tenants and tokens (see the module docstring); thread-safe."""

    tokens: dict[bytes, TokenRecord] = field(default_factory=dict)
    added: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)
    run_as: dict[str, RunAs] = field(default_factory=dict)
    """Users of tenants added at run time (a root server gives each its managed user)."""
    clock: Callable[[], float] = time.time
    """Wall seconds, for expiry (tests give their own)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def tenants(self, configured: Iterable[str]) -> tuple[str, ...]:
        """The tenants now: the YAML's less those removed, then those added, in that order."""
        with self._lock:
            base = [t for t in configured if t not in self.removed]
            return (*base, *sorted(t for t in self.added if t not in base))

    def is_removed(self, tenant: str) -> bool:
        with self._lock:
            return tenant in self.removed

    def tenant_of(self, token: str) -> str | None:
        """The tenant of a valid issued token (None: not an issued token, or refused)."""
        rec = self._record(token)
        if rec is None or rec.refusal(self.clock()) is not None:
            return None
        with self._lock:
            return None if rec.tenant in self.removed else rec.tenant

    def refusal(self, token: str) -> str | None:
        """Why an issued token is refused now (None: unknown here, or valid)."""
        rec = self._record(token)
        if rec is None:
            return None
        if self.is_removed(rec.tenant):  # (which also revoked the token)
            return f"tenant {rec.tenant} (of token {rec.id}) was removed by the admin"
        return rec.refusal(self.clock())

    def _record(self, token: str) -> TokenRecord | None:
        d = digest(token)
        with self._lock:
            rec = self.tokens.get(d)
        # the dictionary lookup found the digest; compare it again in constant time so the
        # answer does not depend on how much of it matched (as TokenTable does)
        if rec is not None and secrets.compare_digest(rec.digest, d):
            return rec
        return None

    def by_id(self, token_id: str) -> TokenRecord | None:
        with self._lock:
            return next((r for r in self.tokens.values() if r.id == token_id), None)

    def listed(self, tenant: str | None = None) -> list[TokenRecord]:
        with self._lock:
            rows = [r for r in self.tokens.values() if tenant is None or r.tenant == tenant]
        return sorted(rows, key=lambda r: (r.created_at, r.id))

    def put_token(self, rec: TokenRecord) -> None:
        with self._lock:
            self.tokens[rec.digest] = rec

    def reset(self) -> None:
        with self._lock:
            self.tokens.clear()
            self.added.clear()
            self.removed.clear()
            self.run_as.clear()

    def set_tenant(self, tenant: str, present: bool, user: RunAs | None = None) -> None:
        with self._lock:
            if present:
                self.removed.discard(tenant)
                self.added.add(tenant)
                if user is not None:
                    self.run_as[tenant] = user
            else:
                self.added.discard(tenant)
                self.removed.add(tenant)
                self.run_as.pop(tenant, None)
