"""A team manager adds a WeCom channel on the notifications page; a failing one shows why; the page fits
a phone."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.utils import timezone

from teams.models import NotificationChannel
from tests.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_add_a_team_channel_and_see_a_failing_one(world, live_server, page):
    sign_in(page, live_server.url, "owner")
    page.click("nav >> text=Notifications")
    page.fill("input[name=name]", "ML room")
    page.select_option("select[name=owner]", "ml")
    page.select_option("select[name=kind]", "wecom")
    page.fill("input[name=url]", "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=abc")
    page.check("#channel-events input[value='alert.firing']")
    page.click("#channel-form button.primary")
    page.wait_for_selector(".flash")
    channel = NotificationChannel.objects.get()
    assert channel.team == world.team and channel.events == ["alert.firing"]
    NotificationChannel.objects.filter(pk=channel.pk).update(failing_since=timezone.now(), last_error="HTTP 404")
    for width, height in ((1440, 900), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"{live_server.url}/notifications/")
        assert "failing since" in page.locator(f"#channel-{channel.pk}").inner_text()
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        if os.environ.get("SCREENSHOTS"):
            page.screenshot(path=str(Path(os.environ["SCREENSHOTS"]) / f"channels-{width}.png"), full_page=True)
