"""Control-plane configuration: the cluster spec plus its optional ``control:`` section.

```yaml
control:
  auth:
    admin_token_env: GPUFENCE_ADMIN_TOKEN   # or admin_token: "..." (prefer the env form)
    tenants:
      vision: {token_env: VISION_TOKEN}
      nlp: {token: "s3cret"}
  stop_grace_s: 10          # SIGTERM -> SIGKILL
  notice_signal: SIGUSR1    # or SIGTERM: how a job hears about a preemption / reclaim notice
  activity_interval_s: 1    # how often idle detection samples running interactive jobs
  containment: {...}        # cgroup mode, parent, pids_max: see containment/settings.py
```

Without a config file, the cluster is this machine as discovered (one exclusive partition) and
the admin token is generated into ``DATA/admin.token`` (mode 0600), where the CLI finds it.
"""

from __future__ import annotations

import os
import secrets
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpufence.control.containment.settings import ContainmentSchema, ContainmentSettings
from gpufence.model.cluster import Cluster
from gpufence.spec import load_cluster_with_sections
from gpufence.spec.build import cluster_from_dict
from gpufence.spec.errors import SpecError, SpecIssue

TOKEN_FILE = "admin.token"
SERVER_FILE = "server.json"


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


class AuthSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")
    admin_token: str | None = Field(default=None, min_length=8)
    admin_token_env: str | None = None
    tenants: dict[str, _Secret] = Field(default_factory=dict)


class ControlSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")
    auth: AuthSchema = Field(default_factory=AuthSchema)
    stop_grace_s: float = Field(default=10.0, ge=0.0, le=3600.0)
    notice_signal: Literal["SIGUSR1", "SIGUSR2", "SIGTERM"] = "SIGUSR1"
    activity_interval_s: float = Field(default=1.0, gt=0.0, le=600.0)
    containment: ContainmentSchema = Field(default_factory=ContainmentSchema)


@dataclass(frozen=True)
class ControlConfig:
    admin_token: str
    tenant_tokens: dict[str, str] = field(default_factory=dict)  # token -> tenant
    tenants: tuple[str, ...] = ()
    stop_grace_s: float = 10.0
    notice_signal: signal.Signals = signal.SIGUSR1
    activity_interval_s: float = 1.0
    containment: ContainmentSettings = field(default_factory=ContainmentSettings)

    def tenant_of(self, token: str) -> str | None:
        """'admin' for the admin token, the tenant for a tenant token, else None."""
        if secrets.compare_digest(token, self.admin_token):
            return ADMIN
        for t, name in self.tenant_tokens.items():
            if secrets.compare_digest(token, t):
                return name
        return None


ADMIN = "admin"


def _admin_token(auth: AuthSchema, data_dir: Path) -> str:
    if auth.admin_token is not None:
        return auth.admin_token
    if auth.admin_token_env is not None:
        value = os.environ.get(auth.admin_token_env)
        if not value:
            raise SpecError(
                [
                    SpecIssue(
                        ("control", "auth", "admin_token_env"),
                        f"environment variable {auth.admin_token_env} is not set; export it",
                    )
                ]
            )
        return value
    path = data_dir / TOKEN_FILE
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    token = secrets.token_urlsafe(24)
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    return token


def control_schema(raw: object, source: str | None = None) -> ControlSchema:
    """Validate the ``control:`` section's shape (None = defaults); errors name the field."""
    try:
        return ControlSchema.model_validate(raw if raw is not None else {})
    except ValidationError as exc:
        issues = [
            SpecIssue(("control", *(str(p) for p in e["loc"])), e["msg"]) for e in exc.errors()
        ]
        raise SpecError(issues, source) from None


def control_config(raw: object, data_dir: Path, source: str | None = None) -> ControlConfig:
    """Validate the ``control:`` section and resolve its secrets (env vars, token file)."""
    schema = control_schema(raw, source)
    tenant_tokens: dict[str, str] = {}
    problems: list[SpecIssue] = []
    for name, secret in schema.auth.tenants.items():
        value = secret.resolve()
        path = ("control", "auth", "tenants", name)
        if not value:
            problems.append(SpecIssue(path, f"environment variable {secret.token_env} is not set"))
        elif value in tenant_tokens:
            problems.append(SpecIssue(path, f"same token as tenant '{tenant_tokens[value]}'"))
        else:
            tenant_tokens[value] = name
    if problems:
        raise SpecError(problems, source)
    admin = _admin_token(schema.auth, data_dir)
    if admin in tenant_tokens:
        raise SpecError([SpecIssue(("control", "auth"), "a tenant token equals the admin token")])
    return ControlConfig(
        admin_token=admin,
        tenant_tokens=tenant_tokens,
        tenants=tuple(schema.auth.tenants),
        stop_grace_s=schema.stop_grace_s,
        notice_signal=signal.Signals[schema.notice_signal],
        activity_interval_s=schema.activity_interval_s,
        containment=schema.containment.settings(),
    )


def load_config(path: Path, data_dir: Path) -> tuple[Cluster, ControlConfig]:
    cluster, extra, _lines = load_cluster_with_sections(path, ("control",))
    return cluster, control_config(extra.get("control"), data_dir, str(path))


def cluster_from_spec_dict(spec: dict[str, object]) -> Cluster:
    return cluster_from_dict(spec, source="discovered GPUs")
