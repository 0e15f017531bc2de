"""The page at `/` in a real browser: Debian's chromium, driven by Playwright for Python
(Playwright's own browser download is not reachable here). It types a sentence, presses
Speak, and checks that audio starts playing and the console shows no errors."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

from http_helpers import make_engine  # noqa: E402

from s2core.http.app import create_app  # noqa: E402
from s2core.http.local import local_server  # noqa: E402

CHROMIUM = os.environ.get("S2CORE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "http-page.png"


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(),
                    reason="no chromium here (apt install chromium)")
def test_page_speaks_in_headless_chromium(assets, tmp_path):
    engine = make_engine(assets, tmp_path)
    with local_server(create_app(engine)) as base, playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--autoplay-policy=no-user-gesture-required", "--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 900, "height": 900})
            problems = []
            page.on("console", lambda m: m.type == "error" and problems.append(m.text))
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(base + "/")
            page.wait_for_function("document.querySelectorAll('#voice option').length > 0")
            assert page.locator("#voice option").first.get_attribute("value") == "default"
            page.fill("#text", "Hello from a real browser.")
            page.fill("#seed", "5")
            page.fill("#max_new_tokens", "24")
            page.click("#speak")
            page.wait_for_function("window.s2core.firstAudioMs !== null", timeout=300_000)
            assert page.evaluate("window.s2core.playing") is True
            page.wait_for_function("window.s2core.done || window.s2core.error !== null",
                                   timeout=300_000)
            assert page.evaluate("window.s2core.error") is None
            assert page.evaluate("window.s2core.samples") > 0
            # the audio clock runs: the scheduled audio is being played
            assert page.evaluate("state.context.state") == "running"
            assert page.locator("#ttfa").inner_text().startswith("first audio after")
            assert page.locator("#download").is_visible()
            if os.environ.get("S2CORE_UPDATE_SCREENSHOT") or not SCREENSHOT.exists():
                page.screenshot(path=str(SCREENSHOT), full_page=True)
            assert problems == [], problems
        finally:
            browser.close()
