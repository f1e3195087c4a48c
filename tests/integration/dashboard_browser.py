"""A real browser for the dashboard tests: Playwright for Python driving Debian's Chromium.

No browser is ever downloaded: Chromium is the system's (``shutil.which("chromium")``, Debian's
``chromium`` package, which ``.ci/run`` installs); without it, or without the ``playwright``
module, the tests are skipped and the reason is printed. Screenshots go to
``$GPUFENCE_ARTIFACTS/dashboard`` when that is set, else under pytest's tmp path.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Page


def skip_loudly(reason: str) -> None:
    print(f"SKIPPED dashboard browser tests: {reason}", file=sys.stderr)
    pytest.skip(reason)


def chromium_path() -> str:
    path = shutil.which("chromium")
    if path is None:
        skip_loudly("no chromium on PATH (Debian: apt-get install chromium)")
    assert path is not None
    return path


def launch() -> Iterator[Browser]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_loudly("the playwright module is missing (pip install -e '.[test]')")
    exe = chromium_path()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--disable-gpu"])
        try:
            yield browser
        finally:
            browser.close()


def artifacts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = os.environ.get("GPUFENCE_ARTIFACTS")
    if base:
        out = Path(base) / "dashboard"
        out.mkdir(parents=True, exist_ok=True)
    else:
        out = tmp_path_factory.mktemp("dashboard-screenshots")
    print(f"dashboard screenshots: {out}", file=sys.stderr)
    return out


@dataclass
class Tab:
    """One signed-in browser tab and every console error and page error it saw."""

    page: Page
    shots: Path
    errors: list[str] = field(default_factory=list)

    def go(self, route: str, painted: str, timeout_ms: float = 10_000) -> None:
        """Open ``#/route`` and wait until that page has drawn its data once."""
        self.page.evaluate("r => { location.hash = r; }", route)
        self.page.wait_for_selector(
            f"body[data-painted='{painted}']", state="attached", timeout=timeout_ms
        )

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def text(self) -> str:
        return str(self.page.inner_text("#page"))


def sign_in(browser: Browser, url: str, token: str, shots: Path) -> Tab:
    """A fresh context (its own sessionStorage), signed in through the login form."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    tab = Tab(page, shots)

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            tab.errors.append(f"console: {msg.text} at {msg.location}")

    def on_error(exc: Any) -> None:
        tab.errors.append(f"page error: {exc}")

    page.on("console", on_console)
    page.on("pageerror", on_error)
    page.goto(url + "/")
    page.wait_for_selector("#login:not([hidden])")
    page.fill("#token", token)
    page.click("#login button[type=submit]")
    page.wait_for_selector("body[data-state='signed-in']")
    return tab
