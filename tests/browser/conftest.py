"""Headless Debian Chromium driven by Playwright (no browser download: executable_path)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.db import connections

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


@pytest.fixture
def page(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"browser tests need Debian's chromium at {CHROMIUM} (scripts/test-services installs it)")
    # Playwright's sync API runs an event loop in this thread; the test still talks to the
    # database directly (fixtures, assertions), which Django would otherwise refuse.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(15000)
        yield page
        if os.environ.get("SCREENSHOTS"):
            page.screenshot(path=str(Path(os.environ["SCREENSHOTS"]) / "last.png"), full_page=True)
        context.close()
        browser.close()
        # Connections opened while Playwright's loop ran would outlive the test database.
        connections.close_all()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
