"""The client config: named contexts (like kubeconfig), one per control plane the CLI talks to.

File: ``$XDG_CONFIG_HOME/gpufence/config.yaml`` (default ``~/.config/gpufence/config.yaml``);
``$GPUFENCE_CONFIG`` names another file. ``gpufence up`` writes a context for the server it
starts and makes it the current one; ``gpufence context list|use|show|set|delete`` edit it::

    current-context: default
    contexts:
      default:                        # written by `gpufence up` (data dir ~/.gpufence)
        url: http://127.0.0.1:7878
        data: /home/me/.gpufence      # token from DATA/admin.token, URL from DATA/server.json
      lab:                            # a remote control plane: `gpufence context set lab ...`
        url: http://gpu-head:7878
        token-file: ~/.secrets/lab.token

Keys of a context: ``url``, ``data`` (a data dir of ``gpufence up``), ``token`` (the token
itself: prefer ``token-file``) and ``token-file``. The file is written whole (a temporary file
renamed over it), mode 0600 in a 0700 directory, since it may hold a token.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CONFIG_ENV = "GPUFENCE_CONFIG"
CONTEXT_KEYS = ("url", "data", "token", "token-file")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class ConfigError(ValueError):
    """The client config file is unreadable or malformed; the message names the file and key."""


@dataclass
class ContextEntry:
    name: str
    url: str | None = None
    data: str | None = None
    token: str | None = None
    token_file: str | None = None

    def to_yaml(self) -> dict[str, str]:
        out = {"url": self.url, "data": self.data, "token": self.token}
        out["token-file"] = self.token_file
        return {k: v for k, v in out.items() if v is not None}

    def token_source(self) -> str | None:
        """Where this context's token comes from, never the token itself."""
        if self.token:
            return "token (in the config file)"
        if self.token_file:
            return f"token-file {self.token_file}"
        if self.data:
            return f"{self.data}/admin.token"
        return None


@dataclass
class ClientConfig:
    path: Path
    current: str | None = None
    contexts: dict[str, ContextEntry] = field(default_factory=dict)

    def get(self, name: str) -> ContextEntry:
        ctx = self.contexts.get(name)
        if ctx is None:
            known = ", ".join(sorted(self.contexts)) or "none yet: `gpufence up` writes one"
            raise ConfigError(f"no context '{name}' in {self.path} (known: {known})")
        return ctx


def config_path() -> Path:
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    return Path(base).expanduser() / "gpufence" / "config.yaml"


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ConfigError(
            f"context name {name!r}: use letters, digits, '.', '_' and '-' (at most 63, "
            "starting with a letter or digit)"
        )
    return name


def load(path: Path | None = None) -> ClientConfig:
    """The config at ``path`` (default ``config_path()``); a missing file is an empty config."""
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ClientConfig(path)
    except OSError as exc:
        raise ConfigError(f"cannot read the client config {path}: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    return _parse(path, raw)


def _parse(path: Path, raw: Any) -> ClientConfig:
    if raw is None:
        return ClientConfig(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with current-context and contexts")
    unknown = sorted(set(raw) - {"current-context", "contexts"})
    if unknown:
        raise ConfigError(
            f"{path}: unknown key '{unknown[0]}' (allowed: current-context, contexts)"
        )
    cfg = ClientConfig(path)
    contexts = raw.get("contexts") or {}
    if not isinstance(contexts, dict):
        raise ConfigError(f"{path}: contexts: expected a mapping of name -> context")
    for name, body in contexts.items():
        name = str(name)
        if not isinstance(body, dict):
            raise ConfigError(
                f"{path}: contexts.{name}: expected a mapping ({', '.join(CONTEXT_KEYS)})"
            )
        bad = sorted(set(body) - set(CONTEXT_KEYS))
        if bad:
            allowed = ", ".join(CONTEXT_KEYS)
            raise ConfigError(f"{path}: contexts.{name}.{bad[0]}: unknown key (allowed: {allowed})")
        values = {k: (str(v) if v is not None else None) for k, v in body.items()}
        cfg.contexts[name] = ContextEntry(
            name,
            url=values.get("url"),
            data=values.get("data"),
            token=values.get("token"),
            token_file=values.get("token-file"),
        )
    current = raw.get("current-context")
    cfg.current = str(current) if current else None
    return cfg


def save(cfg: ClientConfig) -> None:
    """Write ``cfg`` whole: 0600 file in a 0700 directory, renamed into place."""
    doc: dict[str, Any] = {"current-context": cfg.current}
    doc["contexts"] = {name: c.to_yaml() for name, c in sorted(cfg.contexts.items())}
    text = "# gpufence client config: `gpufence context --help`\n" + yaml.safe_dump(
        doc, sort_keys=False, default_flow_style=False
    )
    cfg.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".config.", suffix=".yaml", dir=cfg.path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:  # mkstemp: mode 0600 already
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, cfg.path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def remember_server(name: str, url: str, data: Path, path: Path | None = None) -> ClientConfig:
    """What ``gpufence up`` does once it listens: context ``name`` = this server (URL and data
    dir), made current. Another context of the same name is replaced, and contexts of servers
    whose data dir is gone (deleted: a test's, a demo's) are dropped, so they do not pile up;
    contexts without a data dir (a remote server's) are kept."""
    cfg = load(path)
    for other, entry in list(cfg.contexts.items()):
        if entry.data is not None and not Path(entry.data).exists():
            del cfg.contexts[other]
    cfg.contexts[check_name(name)] = ContextEntry(name, url=url, data=str(data))
    cfg.current = name
    save(cfg)
    return cfg
