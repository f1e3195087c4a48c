"""Control-plane configuration: the cluster spec plus its optional ``control:`` section.

```yaml
control:
  auth:
    admin_token_env: GPUFENCE_ADMIN_TOKEN   # or admin_token: "sha256:<hex>" (or clear; avoid)
    tenants:
      vision: {token_env: VISION_TOKEN}
      nlp: {token: "sha256:9f86d0..."}      # printf %s "$TOKEN" | sha256sum
  run_as: gpufence-jobs     # Unix user of the admin's jobs and of tenants without their own
  tenants:
    vision: {run_as: vision-jobs, max_pending_jobs: 50000}   # its own cap on pending jobs
    nlp: {run_as: nlp-jobs}
    ops: {run_as: root, allow_root: true}   # a tenant's jobs as root: only like this
  allow_run_as_root: false  # control.run_as with uid 0 is refused unless this is true
  max_pending_jobs: 10000   # per tenant (an array counts its tasks); the admin has none
  store_reserve_mib: 16     # free pages kept inside the store: cancels and exits land on a
                            # full disk (new submits get 507 there); 0: none
  job_env_inherit: [CONDA_PREFIX, "http_proxy"]   # server variables jobs also get (NAME, PREFIX*)
  job_pids_limit: 16384     # processes + threads per gang member (null: no limit)
  stop_grace_s: 10          # SIGTERM -> SIGKILL
  notice_signal: SIGUSR1    # or SIGTERM: how a job hears about a preemption / reclaim notice
  activity_interval_s: 1    # how often idle detection samples running interactive jobs
  max_request_bytes: 1048576  # larger HTTP request bodies get 413
  gpu_sample_interval_s: 5  # real GPUs: how often NVML's process lists are checked (and MPS)
  foreign_gpu_processes: report   # or kill: a process on a GPU that no job holding it owns
  telemetry: {series_step_s: 5, latency_window_s: 300}   # control/observe/observe_config.py
  advice:                   # `gpufence validate` / `up` / `advise` (gpufence.advice.inputs)
    ignore: [quota-borrow-unbounded]   # rule ids not to report (say why in a comment)
    chronic_preemption: {more_than: 2, of_last: 7, period_s: 86400}
    failure_margin_nodes: 1
  containment: {...}        # cgroup mode, parent, fake GPU devices: containment/settings.py
```

Without a config file, the cluster is this machine as discovered (one exclusive partition) and
the admin token is generated into ``DATA/admin.token`` (mode 0600), where the CLI finds it.
Tokens are kept as SHA-256 digests (``tokens.py``); run_as users are resolved at start-up
(``runas.py``); the data dir is created private (``privatefs.py``).

Secure by default: a root server runs a tenant's jobs as root only when that tenant says
``run_as: root`` and ``allow_root: true``. A tenant with no run_as of its own (and no
unprivileged ``control.run_as``) gets a managed user, ``gpufence-<tenant>``, created at start-up
when missing (``tenant_users.py``). A server that is not root cannot switch users: its jobs run
as its own user (a start-up warning says so when there are tenants).
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpufence.advice.inputs import AdviceSettings
from gpufence.control.base.accounts import Accounts
from gpufence.control.base.containment_settings import (
    DEFAULT_PIDS_LIMIT,
    ContainmentSchema,
    ContainmentSettings,
)
from gpufence.control.base.executor import RunAs
from gpufence.control.base.memberenv import OWN_PREFIX, name_matches
from gpufence.control.base.observe_config import TelemetrySettings
from gpufence.control.base.privatefs import dir_mode, ensure_dir
from gpufence.control.base.runas import RunAsError, resolve_user
from gpufence.control.base.tenant_users import managed_user
from gpufence.control.base.tokens import (
    TokenError,
    TokenTable,
    admin_token_from_file,
    configured_digest,
)
from gpufence.model.cluster import Cluster
from gpufence.spec import load_cluster_with_sections
from gpufence.spec.build import cluster_from_dict
from gpufence.spec.errors import SpecError, SpecIssue

log = logging.getLogger("gpufence.config")

DEFAULT_MAX_PENDING = 10_000
"""Pending jobs per tenant: one full array (``arrays.MAX_TASKS``); what a restart reads back
stays bounded by the tenants, not by whoever submits most (issue 30 case 7)."""
MAX_PENDING_CAP = 1_000_000
DEFAULT_RESERVE_MIB = 16
"""The store's free pages kept for cancels and exits on a full disk (``store/reserve.py``)."""

TOKEN_FILE = "admin.token"
SERVER_FILE = "server.json"
_ENV_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*\*?$"


class _Secret(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str | None = Field(default=None, min_length=8)
    token_env: str | None = None

    @model_validator(mode="after")
    def _one(self) -> _Secret:
        if (self.token is None) == (self.token_env is None):
            raise ValueError("give exactly one of token or token_env")
        return self

    def resolve(self) -> str | None:
        return self.token if self.token is not None else os.environ.get(self.token_env or "")


def tenant_names(names: dict[str, Any]) -> dict[str, Any]:
    """Tenant names as keys: not the admin's (a tenant called ``admin`` would be the admin:
    tokens map to names), not empty, no whitespace, control characters or '/'."""
    for name in names:
        if name.strip().lower() == ADMIN:
            raise ValueError(
                f"{name!r} is reserved for the admin token (control.auth.admin_token): a tenant "
                "of that name would have the admin's rights; rename the tenant"
            )
        if not name or any(c.isspace() or not c.isprintable() or c == "/" for c in name):
            raise ValueError(
                f"tenant name {name!r} must be non-empty, without spaces, control characters or '/'"
            )
    return names


class AuthSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")
    admin_token: str | None = Field(default=None, min_length=8)
    admin_token_env: str | None = None
    tenants: dict[str, _Secret] = Field(default_factory=dict)

    @field_validator("tenants")
    @classmethod
    def _names(cls, v: dict[str, _Secret]) -> dict[str, _Secret]:
        return tenant_names(v)


class TenantSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_as: str | None = Field(default=None, min_length=1, description="Unix user of its jobs")
    allow_root: bool = Field(default=False, description="run_as may be uid 0 (root)")
    max_pending_jobs: int | None = Field(
        default=None, ge=1, le=MAX_PENDING_CAP, description="control.max_pending_jobs for it"
    )

    @model_validator(mode="after")
    def _root_needs_run_as(self) -> TenantSchema:
        if self.allow_root and self.run_as is None:
            raise ValueError("allow_root: true needs run_as (e.g. run_as: root); remove one")
        return self


class ControlSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")
    auth: AuthSchema = Field(default_factory=AuthSchema)
    tenants: dict[str, TenantSchema] = Field(default_factory=dict)

    @field_validator("tenants")
    @classmethod
    def _names(cls, v: dict[str, TenantSchema]) -> dict[str, TenantSchema]:
        return tenant_names(v)

    run_as: str | None = Field(default=None, min_length=1)
    allow_run_as_root: bool = False
    max_pending_jobs: int = Field(default=DEFAULT_MAX_PENDING, ge=1, le=MAX_PENDING_CAP)
    store_reserve_mib: int = Field(default=DEFAULT_RESERVE_MIB, ge=0, le=1 << 14)
    job_env_inherit: list[str] = Field(default_factory=list)
    job_pids_limit: int | None = Field(default=DEFAULT_PIDS_LIMIT, ge=16, le=1 << 22)
    stop_grace_s: float = Field(default=10.0, ge=0.0, le=3600.0)
    notice_signal: Literal["SIGUSR1", "SIGUSR2", "SIGTERM"] = "SIGUSR1"
    activity_interval_s: float = Field(default=1.0, gt=0.0, le=600.0)
    max_request_bytes: int = Field(default=1 << 20, ge=1024, le=1 << 30)
    gpu_sample_interval_s: float = Field(default=5.0, gt=0.0, le=3600.0)
    foreign_gpu_processes: Literal["report", "kill"] = "report"
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    advice: AdviceSettings = Field(default_factory=AdviceSettings)
    containment: ContainmentSchema = Field(default_factory=ContainmentSchema)


@dataclass(frozen=True)
class ControlConfig:
    tokens: TokenTable = field(default_factory=TokenTable)
    tenants: tuple[str, ...] = ()
    run_as: Mapping[str, RunAs] = field(default_factory=dict)
    """Tenant -> the Unix user its jobs run as (tenants without one: ``default_run_as``)."""
    default_run_as: RunAs | None = None
    """The admin's jobs and those of tenants without their own; None: the server's own user."""
    max_pending: Mapping[str, int] = field(default_factory=dict)
    """Tenant -> its own cap on pending jobs (others: ``default_max_pending``)."""
    default_max_pending: int = DEFAULT_MAX_PENDING
    store_reserve_mib: int = DEFAULT_RESERVE_MIB
    """Free pages the store keeps for cancels and exits on a full disk (store/reserve.py)."""
    job_env_inherit: tuple[str, ...] = ()
    """Server variables (NAME or PREFIX*) jobs get besides memberenv.DEFAULT_ENV_INHERIT."""
    job_pids_limit: int | None = DEFAULT_PIDS_LIMIT
    stop_grace_s: float = 10.0
    notice_signal: signal.Signals = signal.SIGUSR1
    activity_interval_s: float = 1.0
    max_request_bytes: int = 1 << 20
    gpu_sample_interval_s: float = 5.0
    """Real GPUs: how often the processes on each GPU are checked, and MPS daemons watched."""
    foreign_gpu_processes: Literal["report", "kill"] = "report"
    """A process on a GPU that belongs to no job holding it: reported, or also killed."""
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    advice: AdviceSettings = field(default_factory=AdviceSettings)
    containment: ContainmentSettings = field(default_factory=ContainmentSettings)
    """How members are confined; its ``pids_max`` is ``job_pids_limit`` (one setting)."""
    accounts: Accounts = field(default_factory=Accounts, compare=False)
    """Tenants and tokens the admin changed at run time (kept in the store; they win over
    ``tenants`` and ``tokens``, the YAML's, for what they changed: ``accounts.py``)."""

    def tenant_of(self, token: str) -> str | None:
        """'admin' for the admin token, the tenant for a tenant token, else None (a YAML
        tenant removed at run time has no valid token)."""
        name = self.tokens.tenant_of(token)
        if name is not None:
            return None if self.accounts.is_removed(name) else name
        return self.accounts.tenant_of(token)

    def token_refusal(self, token: str) -> str:
        """Why ``token`` is refused (after ``tenant_of`` gave None), without revealing it."""
        name = self.tokens.tenant_of(token)
        if name is not None:
            return f"tenant {name} was removed by the admin"
        return self.accounts.refusal(token) or "invalid token"

    def current_tenants(self) -> tuple[str, ...]:
        """The tenants now: the YAML's, less those removed and with those added at run time."""
        return self.accounts.tenants(self.tenants)

    def run_as_for(self, tenant: str) -> RunAs | None:
        if tenant in self.accounts.run_as:
            return self.accounts.run_as[tenant]
        return self.run_as.get(tenant, self.default_run_as)

    def pending_cap(self, tenant: str) -> int | None:
        """How many pending jobs ``tenant`` may have (None: the admin, who has no cap)."""
        if tenant == ADMIN:
            return None
        return self.max_pending.get(tenant, self.default_max_pending)

    @property
    def jobs_traversable(self) -> bool:
        """Jobs run as another user than the server: the data dir must let them pass."""
        me = os.geteuid()
        users = [*self.run_as.values(), self.default_run_as]
        return any(u is not None and u.uid != me for u in users)


ADMIN = "admin"


def core_tenant(tenant: str) -> str:
    """A tenant as the scheduling core knows it: the admin is nobody's tenant ("")."""
    return "" if tenant == ADMIN else tenant


def _admin_digest(auth: AuthSchema, data_dir: Path, traversable: bool) -> bytes:
    """The admin token's digest: configured (clear or hashed), from an env var, or from the
    token file (generated on first start; ``TokenError`` if it is unusable)."""
    where = ("control", "auth")
    if auth.admin_token is not None:
        digest, hashed = _digest_or_issue(auth.admin_token, (*where, "admin_token"))
        if not hashed:
            log.warning(
                "control.auth.admin_token is a clear-text secret in the config file; store its "
                'hash instead: admin_token: "sha256:<hex>" (printf %s TOKEN | sha256sum)'
            )
        return digest
    if auth.admin_token_env is not None:
        value = os.environ.get(auth.admin_token_env)
        if not value:
            raise SpecError(
                [
                    SpecIssue(
                        (*where, "admin_token_env"),
                        f"environment variable {auth.admin_token_env} is not set; export it",
                    )
                ]
            )
        return _digest_or_issue(value, (*where, "admin_token_env"))[0]
    ensure_dir(data_dir, dir_mode(traversable))
    return configured_digest(admin_token_from_file(data_dir / TOKEN_FILE))[0]


def _digest_or_issue(value: str, path: tuple[str, ...]) -> tuple[bytes, bool]:
    try:
        return configured_digest(value)
    except TokenError as exc:
        raise SpecError([SpecIssue(path, str(exc))]) from None


def control_schema(raw: object, source: str | None = None) -> ControlSchema:
    """Validate the ``control:`` section's shape (None = defaults); errors name the field."""
    try:
        return ControlSchema.model_validate(raw if raw is not None else {})
    except ValidationError as exc:
        issues = [
            SpecIssue(
                ("control", *(str(p) for p in e["loc"])), e["msg"].removeprefix("Value error, ")
            )
            for e in exc.errors()
        ]
        raise SpecError(issues, source) from None


def _tokens(schema: ControlSchema, problems: list[SpecIssue]) -> dict[bytes, str]:
    by_digest: dict[bytes, str] = {}
    for name, secret in schema.auth.tenants.items():
        value = secret.resolve()
        path = ("control", "auth", "tenants", name)
        if not value:
            problems.append(SpecIssue(path, f"environment variable {secret.token_env} is not set"))
            continue
        try:
            d, hashed = configured_digest(value)
        except TokenError as exc:
            problems.append(SpecIssue((*path, "token" if secret.token else "token_env"), str(exc)))
            continue
        if d in by_digest:
            problems.append(SpecIssue(path, f"same token as tenant '{by_digest[d]}'"))
            continue
        by_digest[d] = name
        if secret.token is not None and not hashed:
            log.warning(
                "control.auth.tenants.%s.token is a clear-text secret in the config file; "
                'store its hash instead: token: "sha256:<hex>" (printf %%s TOKEN | sha256sum)',
                name,
            )
    return by_digest


def _users(
    schema: ControlSchema, problems: list[SpecIssue]
) -> tuple[dict[str, RunAs], RunAs | None]:
    default: RunAs | None = None
    if schema.run_as is not None:
        try:
            default = resolve_user(schema.run_as, schema.allow_run_as_root)
        except RunAsError as exc:
            problems.append(SpecIssue(("control", "run_as"), str(exc)))
    known = list(schema.auth.tenants)
    for name in schema.tenants:
        if name not in schema.auth.tenants:
            shown = ", ".join(known) or "none"
            problems.append(
                SpecIssue(
                    ("control", "tenants", name),
                    f"no tenant {name!r} under control.auth.tenants (known: {shown})",
                )
            )
    users: dict[str, RunAs] = {}
    for name in known:
        try:
            who = _tenant_user(schema, name, default)
        except RunAsError as exc:
            problems.append(SpecIssue(("control", "tenants", name, "run_as"), str(exc)))
            continue
        if who is not None:
            users[name] = who
    return users, default


def _tenant_user(schema: ControlSchema, tenant: str, default: RunAs | None) -> RunAs | None:
    """A tenant's user: its own run_as (uid 0 only with its allow_root), else an unprivileged
    control.run_as, else -- on a root server -- its managed user; None: the server's own user
    (a server that is not root cannot switch)."""
    own = schema.tenants.get(tenant)
    if own is not None and own.run_as is not None:
        try:
            return resolve_user(own.run_as, own.allow_root)
        except RunAsError as exc:
            if "is root" not in str(exc):
                raise
            raise RunAsError(
                f"{own.run_as!r} is root (uid 0): the tenant's jobs could read every tenant's "
                "files and the server's tokens and leave their cgroups; name an unprivileged "
                f"user, or add allow_root: true to control.tenants.{tenant} if you really mean it"
            ) from None
    if default is not None and default.uid != 0:
        return default
    if os.geteuid() != 0:
        return None
    user = managed_user(tenant)
    log.info("tenant %s: jobs run as managed user %s (uid %d)", tenant, user.user, user.uid)
    return user


def _env_inherit(schema: ControlSchema, problems: list[SpecIssue]) -> tuple[str, ...]:
    """``job_env_inherit`` entries: names or PREFIX*; never one that lets a secret through."""
    secrets_env = [s.token_env for s in schema.auth.tenants.values() if s.token_env]
    if schema.auth.admin_token_env:
        secrets_env.append(schema.auth.admin_token_env)
    out: list[str] = []
    for i, pat in enumerate(schema.job_env_inherit):
        path = ("control", "job_env_inherit", str(i))
        if not re.match(_ENV_PATTERN, pat):
            problems.append(SpecIssue(path, f"{pat!r} is not a variable name or NAME_PREFIX*"))
        elif name_matches(OWN_PREFIX, [pat]) or pat.startswith(OWN_PREFIX):
            problems.append(
                SpecIssue(
                    path, f"{pat!r}: GPUFENCE_* variables are the server's; jobs never get them"
                )
            )
        elif any(name_matches(s, [pat]) for s in secrets_env):
            hit = next(s for s in secrets_env if name_matches(s, [pat]))
            problems.append(
                SpecIssue(path, f"{pat!r} would pass {hit}, which holds an API token, to every job")
            )
        else:
            out.append(pat)
    return tuple(out)


def control_config(raw: object, data_dir: Path, source: str | None = None) -> ControlConfig:
    """Validate the ``control:`` section, resolve its users and secrets (env vars, token file)."""
    schema = control_schema(raw, source)
    problems: list[SpecIssue] = []
    by_digest = _tokens(schema, problems)
    users, default = _users(schema, problems)
    inherit = _env_inherit(schema, problems)
    if problems:
        raise SpecError(problems, source)
    probe = ControlConfig(run_as=users, default_run_as=default)
    admin = _admin_digest(schema.auth, data_dir, probe.jobs_traversable)
    if admin in by_digest:
        raise SpecError([SpecIssue(("control", "auth"), "a tenant token equals the admin token")])
    by_digest[admin] = ADMIN
    _warn_shared_users(schema, users, default)
    return ControlConfig(
        tokens=TokenTable(by_digest),
        tenants=tuple(schema.auth.tenants),
        run_as=users,
        default_run_as=default,
        max_pending={
            t: ts.max_pending_jobs
            for t, ts in schema.tenants.items()
            if ts.max_pending_jobs is not None
        },
        default_max_pending=schema.max_pending_jobs,
        store_reserve_mib=schema.store_reserve_mib,
        job_env_inherit=inherit,
        job_pids_limit=schema.job_pids_limit,
        stop_grace_s=schema.stop_grace_s,
        notice_signal=signal.Signals[schema.notice_signal],
        activity_interval_s=schema.activity_interval_s,
        max_request_bytes=schema.max_request_bytes,
        gpu_sample_interval_s=schema.gpu_sample_interval_s,
        foreign_gpu_processes=schema.foreign_gpu_processes,
        telemetry=schema.telemetry,
        advice=schema.advice,
        containment=schema.containment.settings(pids_max=schema.job_pids_limit),
    )


def _warn_shared_users(
    schema: ControlSchema, users: Mapping[str, RunAs], default: RunAs | None
) -> None:
    """Tenants that share a Unix user can read each other's job files, and a server that is not
    root runs its tenants' jobs as itself: say so at start-up."""
    by_user: dict[str, list[str]] = {}
    for tenant in (*schema.auth.tenants, ADMIN):
        who = users.get(tenant, default)
        by_user.setdefault(who.user if who else "", []).append(tenant)
    for user, tenants in by_user.items():
        if user and len([t for t in tenants if t != ADMIN]) > 1:
            log.warning(
                "tenants %s run as the same Unix user %s: their jobs can read each other's files; "
                "give each its own control.tenants.<name>.run_as",
                ", ".join(t for t in tenants if t != ADMIN),
                user,
            )
    tenants_as_server = [t for t in by_user.get("", []) if t != ADMIN]
    if tenants_as_server:  # only a server that is not root leaves a tenant without a user
        log.warning(
            "jobs of tenants %s run as this server's own user (uid %d): such a job can read the "
            "store and every token; start gpufence as root so each tenant gets its own user",
            ", ".join(tenants_as_server),
            os.geteuid(),
        )


def load_config(
    path: Path, data_dir: Path, node_defaults: dict[str, object] | None = None
) -> tuple[Cluster, ControlConfig]:
    """The cluster and the control config of ``path``; ``node_defaults`` fills node-group
    fields the file leaves out (``load_cluster_with_sections``)."""
    cluster, extra, _lines = load_cluster_with_sections(path, ("control",), node_defaults)
    return cluster, control_config(extra.get("control"), data_dir, str(path))


def cluster_from_spec_dict(spec: dict[str, object]) -> Cluster:
    return cluster_from_dict(spec, source="discovered GPUs")
