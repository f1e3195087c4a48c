"""The control section's tenant isolation settings: run_as users, hashed tokens, the token file,
the job environment's extensions. Real users (``useradd``), real files in ``tmp_path``."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufence.control.base.config import ADMIN, TOKEN_FILE, control_config
from gpufence.control.base.runas import resolve_user
from gpufence.control.base.tenant_users import managed_name
from gpufence.control.base.tokens import GENERATED_CHARS, TokenError
from gpufence.spec.errors import SpecError
from unix_users import User, managed_users, managed_users_removed, unix_users

ADMIN_TOKEN = "admin-token-0123456789"


def _sha(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture(scope="module")
def users() -> Iterator[list[User]]:
    with unix_users("a", "b") as made:
        yield made


def _control(**extra: Any) -> dict[str, Any]:
    return {
        "auth": {
            "admin_token": ADMIN_TOKEN,
            "tenants": {"vision": {"token": "vision-token-1"}, "nlp": {"token": "nlp-token-12"}},
        },
        **extra,
    }


def _issues(exc: pytest.ExceptionInfo[SpecError]) -> list[str]:
    return exc.value.errors


# ------------------------------------------------------------------------------------ run_as


def test_run_as_users_resolve_to_uid_gid_and_groups(users: list[User], tmp_path: Path) -> None:
    a, b = users
    cfg = control_config(
        _control(run_as=b.name, tenants={"vision": {"run_as": a.name}}), tmp_path / "data"
    )
    ra = cfg.run_as_for("vision")
    assert ra is not None and (ra.user, ra.uid, ra.gid) == (a.name, a.uid, a.gid)
    assert a.gid in ra.groups
    # a tenant without its own user, and the admin's jobs, get the default
    assert cfg.run_as_for("nlp") == cfg.run_as_for(ADMIN) == cfg.default_run_as
    assert cfg.default_run_as is not None and cfg.default_run_as.uid == b.uid
    assert cfg.jobs_traversable


def test_a_missing_user_is_refused_naming_the_field(tmp_path: Path) -> None:
    ghost = f"gfnobody{secrets.token_hex(4)}"
    with pytest.raises(SpecError) as exc:
        control_config(_control(tenants={"vision": {"run_as": ghost}}), tmp_path)
    (msg,) = _issues(exc)
    assert msg.startswith("control.tenants.vision.run_as:")
    assert f"no Unix user {ghost!r}" in msg and "useradd" in msg
    with pytest.raises(SpecError) as exc:
        control_config(_control(run_as=ghost), tmp_path)
    assert _issues(exc)[0].startswith("control.run_as: no Unix user")


def test_root_is_refused_unless_explicitly_allowed(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as exc:
        control_config(_control(tenants={"nlp": {"run_as": "root"}}), tmp_path)
    (msg,) = _issues(exc)
    assert msg.startswith("control.tenants.nlp.run_as:")
    assert "add allow_root: true to control.tenants.nlp" in msg
    # the server-wide switch is not the tenant's: still refused
    with pytest.raises(SpecError, match=r"control\.tenants\.nlp\.run_as: 'root' is root"):
        control_config(
            _control(tenants={"nlp": {"run_as": "root"}}, allow_run_as_root=True), tmp_path
        )
    with pytest.raises(SpecError, match=r"control\.run_as: 'root' is root"):
        control_config(_control(run_as="root"), tmp_path)
    root_nlp = {"nlp": {"run_as": "root", "allow_root": True}}
    cfg = control_config(_control(tenants=root_nlp), tmp_path)
    nlp = cfg.run_as_for("nlp")
    assert nlp is not None and nlp.uid == 0
    with pytest.raises(SpecError, match=r"control\.tenants\.nlp: allow_root: true needs run_as"):
        control_config(_control(tenants={"nlp": {"allow_root": True}}), tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="managed users are made by a root server")
def test_a_root_server_gives_each_tenant_without_run_as_its_own_unprivileged_user(
    tmp_path: Path,
) -> None:
    """Secure by default: no run_as anywhere (or a root control.run_as) never makes a tenant's
    jobs root; each tenant gets ``gpufence-<tenant>``, created when missing (and removed
    again after the test)."""
    before = managed_users()
    with managed_users_removed():
        _each_tenant_gets_its_own_user(tmp_path)
    assert managed_users() <= before, "the users this test made were left behind"


def _each_tenant_gets_its_own_user(tmp_path: Path) -> None:
    for extra in ({}, {"run_as": "root", "allow_run_as_root": True}):
        cfg = control_config(_control(**extra), tmp_path / "data")
        vision, nlp = cfg.run_as_for("vision"), cfg.run_as_for("nlp")
        assert vision is not None and nlp is not None
        assert (vision.user, nlp.user) == ("gpufence-vision", "gpufence-nlp")
        assert vision.uid != 0 and nlp.uid != 0 and vision.uid != nlp.uid
        assert 0 not in (vision.gid, nlp.gid, *vision.groups, *nlp.groups)
        assert cfg.jobs_traversable
    admin = cfg.run_as_for(ADMIN)
    assert admin is not None and admin.uid == 0, "control.run_as still names the admin's user"


def test_managed_user_names_are_valid_and_distinct() -> None:
    names = {t: managed_name(t) for t in ("vision", "Vision", "a.b", "x" * 40, "x" * 41)}
    assert names["vision"] == "gpufence-vision"
    assert len(set(names.values())) == len(names)
    for n in names.values():
        assert re.match(r"^[a-z_][a-z0-9_-]*$", n) and len(n) <= 32, n


def test_run_as_for_an_undeclared_tenant_is_refused(users: list[User], tmp_path: Path) -> None:
    with pytest.raises(SpecError) as exc:
        control_config(_control(tenants={"visoin": {"run_as": users[0].name}}), tmp_path)
    assert "no tenant 'visoin' under control.auth.tenants (known: vision, nlp)" in _issues(exc)[0]


def _as_user(user: User, fn: Any) -> str:
    """``fn()``'s result (or error) in a forked child that runs as ``user``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.setgroups([])
            os.setgid(user.gid)
            os.setuid(user.uid)
            out = str(fn())
        except Exception as exc:
            out = f"{type(exc).__name__}: {exc}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        text = fh.read().decode()
    os.waitpid(pid, 0)
    return text


def test_switching_users_needs_root(users: list[User]) -> None:
    """A server that is not root cannot make jobs another user: refused; its own user is fine."""
    a, b = users
    other = _as_user(b, lambda: resolve_user(a.name, False))
    assert other.startswith(f"RunAsError: switching jobs to user {a.name!r} needs root")
    assert f"uid {b.uid}" in other
    assert _as_user(b, lambda: resolve_user(b.name, False).uid) == str(b.uid)


# ------------------------------------------------------------------------------------ tokens


def test_hashed_tokens_are_accepted_and_checked_by_digest(tmp_path: Path) -> None:
    admin, vision = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    ctl = {"auth": {"admin_token": _sha(admin), "tenants": {"vision": {"token": _sha(vision)}}}}
    cfg = control_config(ctl, tmp_path)
    assert cfg.tenant_of(admin) == ADMIN
    assert cfg.tenant_of(vision) == "vision"
    assert cfg.tenant_of(_sha(vision)) is None, "the hash itself is no token"
    assert cfg.tenant_of(vision + "x") is None
    assert not (tmp_path / TOKEN_FILE).exists(), "a configured admin token needs no file"


def test_a_malformed_hash_is_refused_with_how_to_make_one(tmp_path: Path) -> None:
    ctl = {"auth": {"admin_token": ADMIN_TOKEN, "tenants": {"vision": {"token": "sha256:abc"}}}}
    with pytest.raises(SpecError) as exc:
        control_config(ctl, tmp_path)
    (msg,) = _issues(exc)
    assert msg.startswith("control.auth.tenants.vision.token:")
    assert "64 hex digits" in msg and "sha256sum" in msg


def test_hashed_and_clear_forms_of_one_token_are_the_same_token(tmp_path: Path) -> None:
    ctl = {
        "auth": {
            "admin_token": ADMIN_TOKEN,
            "tenants": {"a": {"token": "shared-token-1"}, "b": {"token": _sha("shared-token-1")}},
        }
    }
    with pytest.raises(SpecError, match="same token as tenant 'a'"):
        control_config(ctl, tmp_path)


def test_the_generated_token_file_is_0600_in_a_0700_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cfg = control_config(None, data)
    token = (data / TOKEN_FILE).read_text()
    assert token.endswith("\n") and len(token.strip()) == GENERATED_CHARS
    assert cfg.tenant_of(token.strip()) == ADMIN
    assert (data / TOKEN_FILE).stat().st_mode & 0o777 == 0o600
    assert data.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in data.iterdir()] == [TOKEN_FILE], "no temporary file left behind"
    # the next start reads the same token
    assert control_config(None, data).tenant_of(token.strip()) == ADMIN


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("", "is empty"),
        ("\n  \n", "is empty"),
        ("abcdefgh\n", "looks truncated (8 characters"),
        (secrets.token_urlsafe(24)[:20], "no final newline"),
        ("one-token-xxxxxxxxxx two-token-yyyyyyyyyy\n", "more than one token"),
    ],
    ids=["empty", "blank", "short", "cut", "two"],
)
def test_a_bad_token_file_is_refused_at_start_up(tmp_path: Path, content: str, why: str) -> None:
    path = tmp_path / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content.encode())
    os.close(fd)
    with pytest.raises(TokenError) as exc:
        control_config(None, tmp_path)
    assert why in str(exc.value)
    assert f"delete {path}" in str(exc.value), "says what to do"


def test_a_token_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, (secrets.token_urlsafe(24) + "\n").encode())
    os.close(fd)
    os.chmod(path, 0o644)
    with pytest.raises(TokenError, match=r"readable by others \(mode 0644\)"):
        control_config(None, tmp_path)


# ------------------------------------------------------------------------------- environment


def test_job_env_inherit_may_not_pass_a_secret(tmp_path: Path) -> None:
    ctl = {
        "auth": {"admin_token_env": "GFT_ADMIN", "tenants": {"v": {"token_env": "GFT_V_TOKEN"}}},
        "job_env_inherit": ["CONDA_*", "GFT_*", "GPUFENCE_URL", "bad name"],
    }
    os.environ["GFT_ADMIN"], os.environ["GFT_V_TOKEN"] = ADMIN_TOKEN, "vision-token-1"
    try:
        with pytest.raises(SpecError) as exc:
            control_config(ctl, tmp_path)
    finally:
        del os.environ["GFT_ADMIN"], os.environ["GFT_V_TOKEN"]
    msgs = _issues(exc)
    assert len(msgs) == 3, msgs
    assert msgs[0].startswith("control.job_env_inherit.1: 'GFT_*' would pass GFT_V_TOKEN")
    assert msgs[1].startswith("control.job_env_inherit.2: 'GPUFENCE_URL': GPUFENCE_* variables")
    assert msgs[2].startswith("control.job_env_inherit.3: 'bad name' is not a variable name")


def test_job_env_inherit_and_pids_limit_reach_the_config(tmp_path: Path) -> None:
    cfg = control_config(
        _control(job_env_inherit=["CONDA_*", "http_proxy"], job_pids_limit=512), tmp_path
    )
    assert cfg.job_env_inherit == ("CONDA_*", "http_proxy")
    assert cfg.job_pids_limit == 512
    assert cfg.containment.pids_max == 512, "one setting: the cgroups' default is the same"
    unlimited = control_config(_control(job_pids_limit=None), tmp_path)
    assert unlimited.job_pids_limit is None and unlimited.containment.pids_max is None
    assert control_config(_control(), tmp_path).containment.pids_max == 16384
    with pytest.raises(SpecError, match=r"control\.job_pids_limit"):
        control_config(_control(job_pids_limit=1), tmp_path)


@pytest.mark.parametrize("name", ["admin", "Admin", " admin", "ADMIN"])
@pytest.mark.parametrize("where", ["auth", "tenants"])
def test_a_tenant_named_admin_is_refused(tmp_path: Path, name: str, where: str) -> None:
    """Tokens map to names: a tenant called 'admin' would have the admin's rights."""
    control = _control()
    if where == "auth":
        control["auth"]["tenants"][name] = {"token": "evil-tenant-token-0123"}
    else:
        control["tenants"] = {name: {}}
    with pytest.raises(SpecError) as exc:
        control_config(control, tmp_path)
    assert any("reserved for the admin token" in i for i in _issues(exc)), _issues(exc)


@pytest.mark.parametrize("name", ["", "a b", "a/b", "a\x1bb"])
def test_a_tenant_name_that_cannot_be_told_apart_is_refused(tmp_path: Path, name: str) -> None:
    control = _control()
    control["auth"]["tenants"][name] = {"token": "odd-tenant-token-0123"}
    with pytest.raises(SpecError) as exc:
        control_config(control, tmp_path)
    assert any("must be non-empty" in i for i in _issues(exc)), _issues(exc)


def test_a_deleted_admin_token_is_replaced_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A data directory that has a store lost its token file: the new token is said aloud (the
    old one, in every client that kept it, stops working); a new data directory stays quiet."""
    from gpufence.control.base.tokens import admin_token_from_file

    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    with caplog.at_level("WARNING", logger="gpufence.config"):
        first = admin_token_from_file(data / TOKEN_FILE)
        assert not caplog.records
        (data / "gpufence.db").write_bytes(b"")
        (data / TOKEN_FILE).unlink()
        second = admin_token_from_file(data / TOKEN_FILE)
    assert second != first
    assert any("a new admin token was generated" in r.getMessage() for r in caplog.records)
