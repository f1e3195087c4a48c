"""API tokens: configured in clear or as ``sha256:<hex>``, checked by digest; the admin token file.

The server keeps only SHA-256 digests of the tokens it accepts, so a config file can hold
``token: "sha256:<64 hex digits>"`` (``printf %s "$TOKEN" | sha256sum``) instead of the secret.
A bearer token is accepted when its digest equals a configured one (constant-time comparison).

Without a configured admin token the server generates one into ``DATA/admin.token``: one line,
the token and a newline, mode 0600 from creation, linked into place whole. At start-up a file
that is empty, truncated (no final newline, or shorter than ``MIN_FILE_TOKEN``), spans several
lines, or is readable by group or others is refused with a message saying what to do.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from gpufence.control.base.privatefs import create_private

log = logging.getLogger("gpufence.config")

HASH_PREFIX = "sha256:"
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
GENERATED_CHARS = 32
"""Length of a generated token (``secrets.token_urlsafe(24)``)."""
MIN_FILE_TOKEN = 16
"""Shortest token accepted from a token file."""


class TokenError(ValueError):
    """A token, a token hash or the token file is unusable; the message says why and what to do."""


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def configured_digest(value: str) -> tuple[bytes, bool]:
    """The digest a configured value stands for, and whether it was given hashed."""
    if value.startswith(HASH_PREFIX):
        hexpart = value[len(HASH_PREFIX) :]
        if not _HEX64.match(hexpart):
            raise TokenError(
                f"'{HASH_PREFIX}' must be followed by the 64 hex digits of the token's SHA-256 "
                f'(got {len(hexpart)} characters); make it with: printf %s "$TOKEN" | sha256sum'
            )
        return bytes.fromhex(hexpart), True
    return digest(value), False


@dataclass(frozen=True)
class TokenTable:
    """Digest -> tenant name (``"admin"`` for the admin token)."""

    by_digest: dict[bytes, str] = field(default_factory=dict)

    def tenant_of(self, token: str) -> str | None:
        d = digest(token)
        found: str | None = None
        for known, name in self.by_digest.items():  # every entry: no early exit
            if secrets.compare_digest(d, known):
                found = name
        return found


def read_token_file(path: Path) -> str:
    """The token in ``path`` (see the module docstring for what is refused)."""
    fix = f"delete {path} and restart to generate a new admin token (clients then need it)"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise TokenError(f"cannot read the admin token file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise TokenError(f"the admin token file {path} is not a regular file; {fix}")
        if st.st_mode & 0o077:
            raise TokenError(
                f"the admin token file {path} is readable by others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}); consider the token leaked: {fix}"
            )
        raw = fh.read(4096)
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise TokenError(f"the admin token file {path} is not ASCII text; {fix}") from None
    if not text.strip():
        raise TokenError(f"the admin token file {path} is empty; {fix}")
    token = text.strip()
    if not text.endswith("\n") or len(token) < MIN_FILE_TOKEN:
        raise TokenError(
            f"the admin token file {path} looks truncated ({len(token)} characters"
            f"{'' if text.endswith(chr(10)) else ', no final newline'}; a generated token has "
            f"{GENERATED_CHARS} and a newline); {fix}"
        )
    if any(c.isspace() for c in token):
        raise TokenError(f"the admin token file {path} holds more than one token; {fix}")
    return token


def admin_token_from_file(path: Path) -> str:
    """The token in ``path``, generated into it first if there is none."""
    if not os.path.lexists(path):
        create_private(path, secrets.token_urlsafe(24) + "\n")
        if (path.parent / "gpufence.db").exists():  # not a new data directory: it had one
            log.warning(
                "%s was missing: a new admin token was generated into it; the old one no "
                "longer works (clients that kept it get 401)",
                path,
            )
    return read_token_file(path)
