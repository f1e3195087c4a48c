"""Accounts and QOS changed at run time by the admin: tenants, their tokens, queues' weight and
quota (issue 32), without editing the cluster YAML.

**Precedence.** The YAML is the starting point; each change the admin makes is kept in the store
and, at every start, wins over the YAML for exactly what it changed (a queue's weight, its
quota, a tenant's presence); everything else comes from the YAML as edited. ``gpufence queue
list`` / ``GET /v1/admin/queues`` show each value with where it came from.

**Where changes go.** Every change is one store transaction on the reconciler thread (the
store's one writer), with its audit row (who, what, when, old -> new); only once it committed
does the plane's memory follow (``Accounts``) and, for queues and tenants, the scheduling core
learn it -- as an event (``QueueRetuned``, ``TenantsChanged``) applied by the next cycle, never
by the plane editing the core. A quota lowered below what a queue runs stops no work: it only
keeps new work of that queue waiting (reason ``quota``) until it is under the quota again.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from gpufence.control.base.accounts import TokenRecord, iso, new_secret, new_token_id
from gpufence.control.base.config import ADMIN, ControlConfig, tenant_names
from gpufence.control.base.executor import RunAs
from gpufence.control.base.runas import RunAsError, resolve_user
from gpufence.control.base.tenant_users import managed_user
from gpufence.control.base.tokens import digest
from gpufence.control.reconciler.inbox import InvalidField
from gpufence.control.reconciler.loop import Reconciler
from gpufence.control.store import account_rows as rows
from gpufence.control.store import database as st
from gpufence.model.cluster import Cluster
from gpufence.model.events import QueueRetuned, TenantsChanged
from gpufence.model.partition import QueueSpec

T = TypeVar("T")
CALL_TIMEOUT_S = 30.0


class AdminOnly(PermissionError):
    """Not the admin (HTTP 403)."""


class AccountConflict(ValueError):
    """The change contradicts the state (HTTP 409): a tenant with live jobs, a known name."""


class UnknownAccount(LookupError):
    """No such tenant, token or queue (HTTP 404)."""


def require_admin(tenant: str, what: str) -> None:
    if tenant != ADMIN:
        raise AdminOnly(
            f"only the admin may {what} (rule: accounts, tokens and queue settings are the "
            f"admin's; this request came with tenant {tenant}'s token)"
        )


def load(store: st.Store, cluster: Cluster, config: ControlConfig) -> Cluster:
    """At start: the store's run-time tenants and tokens into ``config.accounts``, and the
    cluster with the queue settings the admin made over the YAML's (unknown queues: ignored)."""
    acc = config.accounts
    with store.transaction() as tx:
        tenants = rows.tenant_rows(tx.execute)
        tokens = rows.token_rows(tx.execute)
        settings = rows.queue_settings(tx.execute)
    acc.reset()  # a config reused by a second plane (tests) starts from this store
    for t in tenants:
        acc.set_tenant(t.name, not t.removed, None if t.removed else _user_of(config, t))
    for rec in tokens:
        acc.put_token(rec)
    queues = dict(cluster.queues)
    for s in settings:
        if s.queue in queues:
            queues[s.queue] = _with(queues[s.queue], s)
    return dataclasses.replace(cluster, queues=queues)


def _with(spec: QueueSpec, s: rows.QueueSetting) -> QueueSpec:
    weight = spec.weight if s.weight is None else s.weight
    nominal = s.nominal_milli if s.quota_set else spec.nominal_milli
    return dataclasses.replace(spec, weight=weight, nominal_milli=nominal)


def _user_of(config: ControlConfig, t: rows.TenantRow) -> RunAs | None:
    """A run-time tenant's Unix user, as the YAML's get theirs: its own ``run_as`` (root only
    with ``allow_root``), else an unprivileged ``control.run_as``, else on a root server its
    managed user (never root by default); ``RunAsError`` says why a named user cannot be."""
    if t.run_as is not None:
        return resolve_user(t.run_as, t.allow_root)
    default = config.default_run_as
    if default is not None and default.uid != 0:
        return default
    if os.geteuid() != 0:
        return None
    return managed_user(t.name)


@dataclass
class AccountsAdmin:
    """The admin's operations; every method takes the caller's tenant and refuses others."""

    reconciler: Reconciler
    store: st.Store
    config: ControlConfig
    yaml_queues: dict[str, QueueSpec]
    """The queues as the YAML gives them (for "where the value came from")."""
    clock: Callable[[], float]

    def _on_loop(self, fn: Callable[[Reconciler], T]) -> T:
        return self.reconciler.call(fn).result(CALL_TIMEOUT_S)

    # ------------------------------------------------------------------ tenants
    def tenants(self, caller: str) -> list[dict[str, Any]]:
        require_admin(caller, "list tenants")
        acc = self.config.accounts
        return [
            {
                "name": t,
                "source": "runtime" if t in acc.added else "yaml",
                "tokens": sum(1 for r in acc.listed(t) if r.status(self.clock()) == "active"),
            }
            for t in self.config.current_tenants()
        ]

    def add_tenant(
        self, caller: str, name: str, run_as: str | None = None, allow_root: bool = False
    ) -> dict[str, Any]:
        require_admin(caller, "add a tenant")
        try:
            tenant_names({name: None})
        except ValueError as exc:
            raise InvalidField(("body", "name"), str(exc)) from None
        if name in self.config.current_tenants():
            raise AccountConflict(f"tenant {name} exists already (gpufence tenant list)")
        row = rows.TenantRow(name, False, run_as, allow_root)
        try:
            user = _user_of(self.config, row)
        except RunAsError as exc:
            raise InvalidField(("body", "run_as"), str(exc)) from None

        def write(r: Reconciler) -> None:
            now = self.clock()
            with self.store.transaction(durable=True) as tx:
                rows.set_tenant(tx.execute, row, now)
                new = {"present": True, "run_as": user.user if user else None}
                rows.audit(tx.execute, now, caller, "tenant.add", name, None, new)
            self.config.accounts.set_tenant(name, True, user)
            r.boot([TenantsChanged(frozenset(self.config.current_tenants()))], [])

        self._on_loop(write)
        return {"name": name, "source": "runtime", "tokens": 0}

    def remove_tenant(self, caller: str, name: str) -> None:
        require_admin(caller, "remove a tenant")
        if name not in self.config.current_tenants():
            raise UnknownAccount(f"no tenant {name} (gpufence tenant list)")

        def write(r: Reconciler) -> None:
            now = self.clock()
            ended = [
                dataclasses.replace(t, revoked_at=now)
                for t in self.config.accounts.listed(name)
                if t.revoked_at is None
            ]
            with self.store.transaction(durable=True) as tx:
                live = rows.live_jobs(tx.execute, name)
                if live:
                    raise AccountConflict(
                        f"tenant {name} has {live} job(s) pending or running: cancel them "
                        f"(gpufence queue --tenant {name}; gpufence cancel ID) or wait for "
                        "them to end, then remove it"
                    )
                rows.set_tenant(tx.execute, rows.TenantRow(name, True), now)
                for t in ended:  # its tokens end with it: a tenant added again gets new ones
                    rows.update_token(tx.execute, t)
                rows.audit(
                    tx.execute,
                    now,
                    caller,
                    "tenant.remove",
                    name,
                    {"present": True},
                    {"present": False},
                )
            for t in ended:
                self.config.accounts.put_token(t)
            self.config.accounts.set_tenant(name, False)
            r.boot([TenantsChanged(frozenset(self.config.current_tenants()))], [])

        self._on_loop(write)

    # ------------------------------------------------------------------ tokens
    def issue(
        self, caller: str, tenant: str, expires_in_s: float | None
    ) -> tuple[str, TokenRecord]:
        """A new token of ``tenant``: its secret (shown once, never kept) and its record."""
        require_admin(caller, "issue tokens")
        if tenant not in self.config.current_tenants():
            raise InvalidField(
                ("body", "tenant"),
                f"no tenant {tenant!r}: add it first (gpufence tenant add {tenant}) or name "
                f"one of: {', '.join(self.config.current_tenants()) or 'none'}",
            )

        def write(_r: Reconciler) -> tuple[str, TokenRecord]:
            now = self.clock()
            secret, rec = _new_token(tenant, expires_in_s, now)
            with self.store.transaction(durable=True) as tx:
                rows.insert_token(tx.execute, rec)
                rows.audit(
                    tx.execute, now, caller, "token.issue", rec.id, None, token_view(rec, now)
                )
            self.config.accounts.put_token(rec)
            return secret, rec

        return self._on_loop(write)

    def tokens(self, caller: str, tenant: str | None) -> list[dict[str, Any]]:
        require_admin(caller, "list tokens")
        now = self.clock()
        return [token_view(r, now) for r in self.config.accounts.listed(tenant)]

    def revoke(self, caller: str, token_id: str) -> dict[str, Any]:
        require_admin(caller, "revoke tokens")
        rec = self._token(token_id)

        def write(_r: Reconciler) -> dict[str, Any]:
            now = self.clock()
            new = dataclasses.replace(rec, revoked_at=now)
            with self.store.transaction(durable=True) as tx:
                rows.update_token(tx.execute, new)
                rows.audit(
                    tx.execute,
                    now,
                    caller,
                    "token.revoke",
                    rec.id,
                    token_view(rec, now),
                    token_view(new, now),
                )
            self.config.accounts.put_token(new)
            return token_view(new, now)

        return self._on_loop(write)

    def rotate(
        self, caller: str, token_id: str, overlap_s: float, expires_in_s: float | None
    ) -> tuple[str, TokenRecord]:
        """A new secret for ``token_id``'s tenant; the old one works ``overlap_s`` more."""
        require_admin(caller, "rotate tokens")
        old = self._token(token_id)
        if old.status(self.clock()) != "active":
            raise AccountConflict(
                f"token {token_id} is {old.status(self.clock())}: issue a new one instead "
                f"(gpufence token issue --tenant {old.tenant})"
            )

        def write(_r: Reconciler) -> tuple[str, TokenRecord]:
            now = self.clock()
            secret, rec = _new_token(old.tenant, expires_in_s, now)
            gone = _rotated_out(old, rec.id, now, overlap_s)
            with self.store.transaction(durable=True) as tx:  # both or neither
                rows.insert_token(tx.execute, rec)
                rows.update_token(tx.execute, gone)
                rows.audit(
                    tx.execute,
                    now,
                    caller,
                    "token.rotate",
                    old.id,
                    token_view(old, now),
                    token_view(gone, now),
                )
                rows.audit(
                    tx.execute, now, caller, "token.issue", rec.id, None, token_view(rec, now)
                )
            self.config.accounts.put_token(rec)
            self.config.accounts.put_token(gone)
            return secret, rec

        return self._on_loop(write)

    def _token(self, token_id: str) -> TokenRecord:
        rec = self.config.accounts.by_id(token_id)
        if rec is None:
            raise UnknownAccount(f"no token {token_id} (gpufence token list)")
        return rec

    # ------------------------------------------------------------------ queues
    def queues(self, caller: str, live: dict[str, QueueSpec]) -> list[dict[str, Any]]:
        require_admin(caller, "list queue settings")
        return [queue_view(spec, self.yaml_queues.get(q)) for q, spec in live.items()]

    def set_queue(
        self, caller: str, queue: str, weight: float | None, quota: tuple[bool, float | None]
    ) -> dict[str, Any]:
        """``quota``: (whether it is set, GPUs or None for no quota)."""
        require_admin(caller, "change queue settings")
        if queue not in self.yaml_queues:
            raise UnknownAccount(
                f"no queue {queue} (known: {', '.join(self.yaml_queues) or 'none'})"
            )

        def write(r: Reconciler) -> dict[str, Any]:
            spec = r.scheduler.cluster.queues[queue]
            new = dataclasses.replace(
                spec,
                weight=spec.weight if weight is None else weight,
                nominal_milli=(
                    spec.nominal_milli
                    if not quota[0]
                    else None
                    if quota[1] is None
                    else round(quota[1] * 1000)
                ),
            )
            now = self.clock()
            yaml = self.yaml_queues[queue]
            setting = rows.QueueSetting(
                queue,
                None if new.weight == yaml.weight else new.weight,
                new.nominal_milli != yaml.nominal_milli,
                new.nominal_milli,
                now,
            )
            with self.store.transaction(durable=True) as tx:
                rows.set_queue(tx.execute, setting)
                rows.audit(tx.execute, now, caller, "queue.set", queue, _qos(spec), _qos(new))
            r.boot([QueueRetuned(queue, new.weight, new.nominal_milli)], [])
            return queue_view(new, yaml)

        return self._on_loop(write)

    def audit(self, caller: str, limit: int) -> list[dict[str, Any]]:
        require_admin(caller, "read the audit log")
        with self.store.reader() as rd:
            got = rows.audit_rows(rd.execute, limit)
        return [
            {
                "seq": a.seq,
                "at": iso(a.t),
                "actor": a.actor,
                "action": a.action,
                "target": a.target,
                "old": a.old,
                "new": a.new,
            }
            for a in got
        ]


def _new_token(tenant: str, expires_in_s: float | None, now: float) -> tuple[str, TokenRecord]:
    """A fresh secret (returned once, never kept) and the record that keeps its digest."""
    secret = new_secret()
    rec = TokenRecord(
        id=new_token_id(),
        tenant=tenant,
        digest=digest(secret),
        created_at=now,
        expires_at=None if expires_in_s is None else now + expires_in_s,
    )
    return secret, rec


def _rotated_out(old: TokenRecord, new_id: str, now: float, overlap_s: float) -> TokenRecord:
    """The old token of a rotation: revoked now, or valid ``overlap_s`` more (never past its
    own expiry)."""
    if overlap_s <= 0:
        return dataclasses.replace(old, replaced_by=new_id, revoked_at=now)
    ends = now + overlap_s
    if old.expires_at is not None:
        ends = min(ends, old.expires_at)
    return dataclasses.replace(old, replaced_by=new_id, expires_at=ends)


def _qos(spec: QueueSpec) -> dict[str, object]:
    quota = None if spec.nominal_milli is None else spec.nominal_milli / 1000
    return {"weight": spec.weight, "quota_gpus": quota}


def queue_view(spec: QueueSpec, yaml: QueueSpec | None) -> dict[str, Any]:
    """A queue's weight and quota now, and whether each is the YAML's or the admin's."""
    quota = None if spec.nominal_milli is None else spec.nominal_milli / 1000
    return {
        "queue": spec.name,
        "partition": spec.partition,
        "tenant": spec.tenant,
        "weight": spec.weight,
        "quota_gpus": quota,
        "weight_source": "yaml" if yaml is not None and yaml.weight == spec.weight else "runtime",
        "quota_source": (
            "yaml" if yaml is not None and yaml.nominal_milli == spec.nominal_milli else "runtime"
        ),
    }


def token_view(rec: TokenRecord, now: float) -> dict[str, Any]:
    """A token as listed: its id and dates, never its secret or digest."""
    return {
        "id": rec.id,
        "tenant": rec.tenant,
        "status": rec.status(now),
        "created_at": iso(rec.created_at),
        "expires_at": None if rec.expires_at is None else iso(rec.expires_at),
        "revoked_at": None if rec.revoked_at is None else iso(rec.revoked_at),
        "replaced_by": rec.replaced_by,
    }
