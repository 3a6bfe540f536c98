"""A member makes a read-only token in the browser, sees its key once, and revokes it after the dialog,
at desktop and phone widths without the page running wider than the phone."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from teams.models import ApiToken
from tests.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_make_and_revoke_a_token_in_the_browser(world, live_server, page):
    sign_in(page, live_server.url)
    page.click("nav >> text=Tokens")
    for width, height in ((1440, 900), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.fill("input[name=name]", f"laptop-{width}")
        page.select_option("select[name=scope]", "read")
        page.click("#token-form button.primary")
        key = page.locator("#new-token-key").inner_text()
        token = ApiToken.objects.get(name=f"laptop-{width}")
        assert key.startswith(token.prefix) and token.scope == "read"
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        if os.environ.get("SCREENSHOTS"):
            page.screenshot(path=str(Path(os.environ["SCREENSHOTS"]) / f"tokens-{width}.png"), full_page=True)
        page.once("dialog", lambda dialog: dialog.accept())
        page.click(f"#tokens tr:has-text('laptop-{width}') button.danger")
        page.wait_for_selector(".flash")
        assert f"Token {token.prefix}… revoked" in page.locator(".flash").inner_text()
        assert not ApiToken.objects.filter(pk=token.pk).exists()
