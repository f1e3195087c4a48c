"""The client config (named contexts) and where a verb connects: flags, $GPUFENCE_*, context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufence.cli.clientconfig import ConfigError, ContextEntry, load, remember_server, save
from gpufence.cli.connect import no_token_message, resolve
from gpufence.cli.main import app

CLEAN = ("GPUFENCE_URL", "GPUFENCE_TOKEN", "GPUFENCE_DATA", "GPUFENCE_CONTEXT", "GPUFENCE_CONFIG")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in CLEAN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def _data_dir(root: Path, name: str, url: str, token: str) -> Path:
    d = root / name
    d.mkdir()
    (d / "server.json").write_text(json.dumps({"url": url, "pid": 1}))
    (d / "admin.token").write_text(token + "\n")
    return d


def test_remember_server_writes_a_private_file_and_makes_it_current(home: Path) -> None:
    (home / "d").mkdir()
    (home / "e").mkdir()
    cfg = remember_server("lab", "http://127.0.0.1:1234", home / "d")
    path = home / "xdg" / "gpufence" / "config.yaml"
    assert cfg.path == path and path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    again = load()
    assert again.current == "lab"
    assert again.contexts["lab"] == ContextEntry(
        "lab", url="http://127.0.0.1:1234", data=str(home / "d")
    )
    remember_server("other", "http://127.0.0.1:9", home / "e")
    assert load().current == "other" and set(load().contexts) == {"lab", "other"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("contexts: [1, 2]", "contexts: expected a mapping"),
        ("current-context: a\ncontext: {}", "unknown key 'context'"),
        ("contexts:\n  a: {url: x, tokn: y}", "contexts.a.tokn: unknown key (allowed: url, data"),
        ("contexts:\n  a: [1]\n", "contexts.a: expected a mapping"),
        ("contexts: {a: {url: x}\n", "config.yaml:2: not valid YAML"),
    ],
)
def test_a_malformed_config_names_the_file_and_key(home: Path, text: str, message: str) -> None:
    path = home / "xdg" / "gpufence" / "config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"config\.yaml") as err:
        load()
    assert message in str(err.value)
    r = CliRunner().invoke(app, ["queue"])
    assert r.exit_code == 2 and message in " ".join(r.output.split())


def test_resolution_order(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx_data = _data_dir(home, "ctx", "http://127.0.0.1:1001", "token-of-the-context-dir")
    env_data = _data_dir(home, "env", "http://127.0.0.1:1002", "token-of-the-env-dir")
    flag_data = _data_dir(home, "flag", "http://127.0.0.1:1003", "token-of-the-flag-dir")
    remember_server("local", "http://127.0.0.1:1000", ctx_data)
    cfg = load()
    cfg.contexts["remote"] = ContextEntry(
        "remote", url="http://10.0.0.9:7878", token_file=str(home / "t")
    )
    save(cfg)
    (home / "t").write_text("remote-token-0123456789\n")

    t = resolve()  # the current context: its data dir's server.json and token
    assert (t.url, t.token, t.context) == (
        "http://127.0.0.1:1001",
        "token-of-the-context-dir",
        "local",
    )
    t = resolve(context="remote")  # a URL-only context does not read ~/.gpufence
    assert (t.url, t.token, t.data) == ("http://10.0.0.9:7878", "remote-token-0123456789", None)
    monkeypatch.setenv("GPUFENCE_CONTEXT", "remote")
    assert resolve().url == "http://10.0.0.9:7878"
    monkeypatch.setenv("GPUFENCE_DATA", str(env_data))  # a data dir of its own: no context
    t = resolve()
    assert (t.url, t.token, t.context) == ("http://127.0.0.1:1002", "token-of-the-env-dir", None)
    t = resolve(data=flag_data)  # the flag beats the variable
    assert (t.url, t.token, t.data) == ("http://127.0.0.1:1003", "token-of-the-flag-dir", flag_data)
    monkeypatch.setenv("GPUFENCE_URL", "http://127.0.0.1:2000")
    monkeypatch.setenv("GPUFENCE_TOKEN", "env-token-0123456789")
    t = resolve(data=flag_data)
    assert (t.url, t.token) == ("http://127.0.0.1:2000", "env-token-0123456789")
    t = resolve(url="http://127.0.0.1:3000", token="flag-token-0123456789", data=flag_data)
    assert (t.url, t.url_source, t.token_source) == ("http://127.0.0.1:3000", "--url", "--token")


def test_no_token_says_every_way_to_give_one(home: Path) -> None:
    t = resolve(data=home / "nothing-here")
    assert t.token is None
    msg = no_token_message(t)
    for words in (
        str(home / "nothing-here" / "admin.token"),
        "--data DIR",
        "export GPUFENCE_DATA=DIR",
        "gpufence context use NAME",
        "--token TOKEN",
        "GPUFENCE_TOKEN",
    ):
        assert words in msg, msg
    r = CliRunner().invoke(app, ["queue", "--data", str(home / "nothing-here")])
    assert r.exit_code == 1 and "no API token" in r.output and "Traceback" not in r.output


def test_context_verbs(home: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["context", "list"])
    assert r.exit_code == 0 and "no contexts" in r.output
    r = runner.invoke(app, ["context", "set", "a", "--url", "http://127.0.0.1:1"])
    assert r.exit_code == 0 and "(current)" in r.output  # the first one becomes current
    r = runner.invoke(app, ["context", "set", "b", "--data", str(home / "d")])
    assert r.exit_code == 0 and "(current)" not in r.output
    assert (
        json.loads(runner.invoke(app, ["context", "list", "-o", "json"]).stdout)["current"] == "a"
    )
    r = runner.invoke(app, ["context", "use", "b"])
    assert r.exit_code == 0 and load().current == "b"
    shown = json.loads(runner.invoke(app, ["context", "show", "-o", "json"]).stdout)
    assert shown["name"] == "b" and shown["resolved"]["data"] == str(home / "d")
    assert "none found" in shown["resolved"]["token_source"]
    r = runner.invoke(app, ["context", "set", "bad name"])
    assert r.exit_code == 2 and "context name" in r.output
    r = runner.invoke(app, ["context", "set", "c"])
    assert r.exit_code == 2 and "give --url or --data" in r.output
    r = runner.invoke(app, ["context", "delete", "b"])
    assert r.exit_code == 0 and load().current is None and set(load().contexts) == {"a"}
    r = runner.invoke(app, ["queue", "--context", "zzz"])
    assert r.exit_code == 2 and "no context 'zzz'" in r.output and "known: a" in r.output


def test_up_names_contexts_apart_and_default_is_only_the_home_dir(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two data dirs named 'data' get 'data' and 'data-2' (the second replaced the first's
    context); $GPUFENCE_DATA exported by an earlier `up` does not make another dir 'default'."""
    from gpufence.cli.up import default_context_name

    first, second = home / "a" / "data", home / "b" / "data"
    for d in (first, second):
        d.mkdir(parents=True)
    monkeypatch.setenv("GPUFENCE_DATA", str(first))
    assert default_context_name(first) == "data"  # not 'default': that is ~/.gpufence
    remember_server("data", "http://127.0.0.1:1", first.resolve())
    assert default_context_name(first) == "data"  # the same dir keeps its name
    assert default_context_name(second) == "data-2"
    remember_server("data-2", "http://127.0.0.1:2", second.resolve())
    assert load().contexts["data"].data == str(first.resolve())
    (home / "home" / ".gpufence").mkdir(parents=True)
    assert default_context_name(home / "home" / ".gpufence") == "default"


def test_contexts_of_deleted_data_dirs_do_not_pile_up(home: Path) -> None:
    """Issue 30, case 10: every `up` on a fresh directory added a context (122 seen); one
    whose data dir is gone is dropped by the next `up`. A remote one (no data dir) is kept."""
    save(load())
    cfg = load()
    cfg.contexts["remote"] = ContextEntry("remote", url="http://10.0.0.1:8080", token="t" * 20)
    save(cfg)
    kept = home / "kept"
    kept.mkdir()
    remember_server("kept", "http://127.0.0.1:1", kept)
    for i in range(5):
        gone = home / f"tmp-{i}"
        gone.mkdir()
        remember_server(f"tmp-{i}", f"http://127.0.0.1:{10 + i}", gone)
        gone.rmdir()  # the test or demo that made it is over
    remember_server("last", "http://127.0.0.1:99", kept)
    assert set(load().contexts) == {"remote", "kept", "last"}
    assert load().current == "last"
