"""The store's rows of run-time accounts and QOS: tenants, tokens (digests only), queue
settings and their audit trail (migration: "accounts and QOS changed at run time").

Plain SQL over a transaction's or a connection's ``execute``; what the rows mean and who may
write them is ``control/plane/admin_accounts.py``'s business.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpufence.control.base.accounts import TokenRecord
from gpufence.model.lifecycle import TERMINAL_STATES

Query = Callable[[str, Sequence[object]], sqlite3.Cursor]
_ENDED = ",".join(repr(str(s)) for s in TERMINAL_STATES)


@dataclass(frozen=True, slots=True)
class QueueSetting:
    """What the admin set for a queue: None fields (and ``quota_set`` False) keep the YAML's."""

    queue: str
    weight: float | None
    quota_set: bool
    nominal_milli: int | None
    at: float


@dataclass(frozen=True, slots=True)
class AuditRow:
    seq: int
    t: float
    actor: str
    action: str
    target: str
    old: str
    new: str


@dataclass(frozen=True, slots=True)
class TenantRow:
    name: str
    removed: bool
    run_as: str | None = None
    allow_root: bool = False


def tenant_rows(q: Query) -> list[TenantRow]:
    """Every tenant the admin added or removed."""
    rows = q("SELECT name, removed, run_as, allow_root FROM tenants ORDER BY name", ())
    return [TenantRow(r[0], bool(r[1]), r[2], bool(r[3])) for r in rows]


def set_tenant(q: Query, t: TenantRow, at: float) -> None:
    q(
        "INSERT INTO tenants(name, removed, run_as, allow_root, at) VALUES(?, ?, ?, ?, ?) "
        "ON CONFLICT(name) DO UPDATE SET removed = excluded.removed, run_as = excluded.run_as, "
        "allow_root = excluded.allow_root, at = excluded.at",
        (t.name, int(t.removed), t.run_as, int(t.allow_root), at),
    )


def live_jobs(q: Query, tenant: str) -> int:
    """How many of ``tenant``'s jobs have not ended (pending, starting, running, stopping)."""
    row = q(f"SELECT COUNT(*) FROM jobs WHERE tenant = ? AND state NOT IN ({_ENDED})", (tenant,))
    return int(row.fetchone()[0])


def token_rows(q: Query) -> list[TokenRecord]:
    rows = q(
        "SELECT id, tenant, digest, created_at, expires_at, revoked_at, replaced_by FROM tokens",
        (),
    )
    return [TokenRecord(r[0], r[1], bytes.fromhex(r[2]), r[3], r[4], r[5], r[6]) for r in rows]


def insert_token(q: Query, rec: TokenRecord) -> None:
    q(
        "INSERT INTO tokens(id, tenant, digest, created_at, expires_at, revoked_at, replaced_by) "
        "VALUES(?, ?, ?, ?, ?, ?, ?)",
        (
            rec.id,
            rec.tenant,
            rec.digest.hex(),
            rec.created_at,
            rec.expires_at,
            rec.revoked_at,
            rec.replaced_by,
        ),
    )


def update_token(q: Query, rec: TokenRecord) -> None:
    q(
        "UPDATE tokens SET expires_at = ?, revoked_at = ?, replaced_by = ? WHERE id = ?",
        (rec.expires_at, rec.revoked_at, rec.replaced_by, rec.id),
    )


def queue_settings(q: Query) -> list[QueueSetting]:
    rows = q("SELECT queue, weight, quota_set, nominal_milli, at FROM queue_settings", ())
    return [QueueSetting(r[0], r[1], bool(r[2]), r[3], r[4]) for r in rows]


def set_queue(q: Query, s: QueueSetting) -> None:
    q(
        "INSERT INTO queue_settings(queue, weight, quota_set, nominal_milli, at) "
        "VALUES(?, ?, ?, ?, ?) ON CONFLICT(queue) DO UPDATE SET weight = excluded.weight, "
        "quota_set = excluded.quota_set, nominal_milli = excluded.nominal_milli, "
        "at = excluded.at",
        (s.queue, s.weight, int(s.quota_set), s.nominal_milli, s.at),
    )


def audit(
    q: Query, t: float, actor: str, action: str, target: str, old: object, new: object
) -> None:
    """One audit row; ``old`` and ``new`` as compact JSON (never a secret)."""
    q(
        "INSERT INTO audit(t, actor, action, target, old, new) VALUES(?, ?, ?, ?, ?, ?)",
        (t, actor, action, target, _text(old), _text(new)),
    )


def _text(value: object) -> str:
    return "" if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


def audit_rows(q: Query, limit: int = 100) -> list[AuditRow]:
    rows = q(
        "SELECT seq, t, actor, action, target, old, new FROM audit ORDER BY seq DESC LIMIT ?",
        (limit,),
    )
    return [AuditRow(*r) for r in rows]
