"""The notifications page: add a channel (a manager for their team, anyone for themselves), see which
fail and why, test one, remove one after a question (a page without JavaScript)."""
from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from teams.models import Delivery, NotificationChannel
from teams.services import channel_create


@pytest.fixture
def login(world):
    def make(user) -> Client:
        client = Client()
        client.force_login(user)
        return client
    return make


def test_a_manager_adds_a_team_channel_and_a_member_only_their_own(world, login):
    owner = login(world.owner)
    page = owner.get("/notifications/").content.decode()
    assert 'value="ml"' in page  # a team the owner manages
    added = owner.post("/notifications/", {"name": "ml room", "owner": "ml", "kind": "wecom",
                                           "url": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=k",
                                           "events": ["reservation.active", "alert.firing"]})
    assert added.status_code == 302
    channel = NotificationChannel.objects.get()
    assert channel.team == world.team and channel.events == ["reservation.active", "alert.firing"]
    assert "qyapi" not in login(world.member).get("/notifications/").content.decode()  # the URL is never shown
    member_page = login(world.member).get("/notifications/").content.decode()
    assert 'value="ml"' not in member_page and "ml room" in member_page  # sees it, may not add for the team
    refused = login(world.member).post("/notifications/", {"name": "x", "owner": "ml", "kind": "slack",
                                                         "url": "https://hooks.slack.com/x", "events": ["alert.firing"]})
    assert refused.status_code == 400 and NotificationChannel.objects.count() == 1
    missing = owner.post("/notifications/", {"name": "x", "owner": "", "kind": "slack", "events": ["alert.firing"]})
    assert missing.status_code == 400 and "needs its webhook URL" in missing.content.decode()


def test_a_failing_channel_shows_why_and_can_be_tested_and_removed(world, login):
    channel = channel_create(actor=world.member, name="pager", kind="webhook", url="https://example.com/hook",
                             events=["reservation.failed"])
    NotificationChannel.objects.filter(pk=channel.pk).update(failing_since=timezone.now(),
                                                              last_error="HTTP 503: unavailable")
    member = login(world.member)
    page = member.get("/notifications/").content.decode()
    assert "failing since" in page and "HTTP 503: unavailable" in page
    assert member.post(f"/notifications/{channel.pk}/test/").status_code == 302
    assert Delivery.objects.get().event == "test"
    asked = member.post(f"/notifications/{channel.pk}/remove/")
    assert asked.status_code == 200 and "Remove channel pager?" in asked.content.decode()
    assert member.post(f"/notifications/{channel.pk}/remove/", {"confirm": "yes"}).status_code == 302
    assert not NotificationChannel.objects.exists()
    assert login(world.outsider).post(f"/notifications/{channel.pk}/test/").status_code == 404
