"""Notification channels: webhooks signed with HMAC-SHA256 and the chat formats (Slack, DingTalk, WeCom,
Feishu) posted to a real local HTTP receiver, retried with a doubling wait, recorded per delivery, a
failing channel marked for its owners, and none of it ever in the way of the event itself."""
from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core import mail
from django.utils import timezone

from allocations import notices
from allocations.models import Reservation
from teams.models import Delivery, NotificationChannel
from teams.notify import delivery_attempt, notify, signature
from teams.services import channel_create
from tests.factories import window
from tests.webhooks import start_receiver

CHANNELS = "/api/v1/notification-channels/"
SECRET = "channel-signing-secret"


@pytest.fixture
def receiver(settings):
    settings.NOTIFY_ALLOW_PRIVATE_URLS = True  # the receiver listens on 127.0.0.1
    receiver = start_receiver()
    yield receiver
    receiver.stop()


def _book(api, world) -> Reservation:
    answer = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 1,
                                                             "ends_at": window(0, 2)[1].isoformat()}, format="json")
    return Reservation.objects.get(pk=answer.json()["id"])


def _attempt_all() -> list[str | None]:
    return [delivery_attempt(pk) for pk in Delivery.objects.order_by("pk").values_list("pk", flat=True)]


def test_a_signed_webhook_reaches_the_receiver_with_a_signature_it_can_check(world, api, receiver):
    made = api(world.owner).post(CHANNELS, {"name": "ml events", "kind": "webhook", "team": "ml",
                                            "url": f"{receiver.url}/hook", "secret": SECRET,
                                            "events": ["reservation.active"]}, format="json")
    assert made.status_code == 201, made.content
    assert "url" not in made.json() and "secret" not in made.json() and made.json()["url_host"] == "127.0.0.1"
    reservation = _book(api, world)
    notices.announce(reservation, "reservation.active", "Reservation is active", "Its GPUs are ready.")
    notices.announce(reservation, "reservation.expiring", "ends soon", "not subscribed")  # not listed: not sent
    assert _attempt_all() == ["sent"]
    (hook,) = receiver.received
    body = hook.json()
    assert hook.path == "/hook" and body["event"] == "reservation.active"
    assert body["subject"] == "Reservation is active" and body["data"]["reservation"] == reservation.pk
    expected = signature(SECRET, hook.headers["X-GpuPool-Timestamp"], hook.body)
    assert hmac.compare_digest(hook.headers["X-GpuPool-Signature"], expected)
    tampered = signature(SECRET, hook.headers["X-GpuPool-Timestamp"], hook.body + b" ")
    assert hook.headers["X-GpuPool-Signature"] != tampered
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("sent", 1, 200)


def test_a_failing_channel_is_retried_with_a_doubling_wait_marked_then_cleared(world, receiver, settings):
    settings.NOTIFY_RETRY_SECONDS, settings.NOTIFY_ATTEMPTS = 30, 3
    channel = channel_create(actor=world.owner, name="flaky", kind="webhook", team=world.team,
                             url=f"{receiver.url}/hook", events=["alert.firing"])
    receiver.statuses = [500, 503]
    assert notify(event="alert.firing", subject="GPU hot", text="95 °C", team_ids=[world.team.pk]) == 1
    delivery = Delivery.objects.get()
    assert delivery_attempt(delivery.pk) == "pending"
    delivery.refresh_from_db()
    channel.refresh_from_db()
    assert delivery.response_status == 500 and "HTTP 500" in channel.last_error and channel.failing_since
    wait = delivery.next_attempt_at - timezone.now()
    assert timedelta(seconds=25) < wait <= timedelta(seconds=30)
    assert delivery_attempt(delivery.pk) is None  # not due yet: nothing sent
    Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    assert delivery_attempt(delivery.pk) == "pending"
    delivery.refresh_from_db()
    assert timedelta(seconds=55) < delivery.next_attempt_at - timezone.now() <= timedelta(seconds=60)  # doubled
    Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    assert delivery_attempt(delivery.pk) == "sent"
    channel.refresh_from_db()
    assert channel.failing_since is None and channel.last_error == "" and len(receiver.received) == 3


def test_a_delivery_is_given_up_after_the_last_attempt(world, receiver, settings):
    settings.NOTIFY_ATTEMPTS = 2
    channel_create(actor=world.owner, name="down", kind="slack", team=world.team, url=f"{receiver.url}/slack",
                   events=["alert.firing"])
    receiver.statuses = [500, 500]
    notify(event="alert.firing", subject="s", text="t", team_ids=[world.team.pk])
    delivery = Delivery.objects.get()
    delivery_attempt(delivery.pk)
    Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    assert delivery_attempt(delivery.pk) == "given_up"
    assert Delivery.objects.get().next_attempt_at is None


def test_the_chat_formats_and_their_signatures(world, receiver):
    for kind in ("slack", "dingtalk", "wecom", "feishu"):
        channel_create(actor=world.owner, name=kind, kind=kind, team=world.team, url=f"{receiver.url}/{kind}",
                       secret=SECRET if kind in ("dingtalk", "feishu") else "", events=["alert.firing"])
    notify(event="alert.firing", subject="GPU 3 at 95 °C", text="Over 90 for 5 minutes.",
           link="http://portal/pools/a100/", team_ids=[world.team.pk])
    assert _attempt_all() == ["sent"] * 4
    by_kind = {r.path.split("?")[0].strip("/"): r for r in receiver.received}
    assert by_kind["slack"].json()["text"].startswith("*GPU 3 at 95 °C*\nOver 90 for 5 minutes.")
    assert by_kind["wecom"].json() == {"msgtype": "text", "text": {
        "content": "GPU 3 at 95 °C\nOver 90 for 5 minutes.\nhttp://portal/pools/a100/"}}
    ding = by_kind["dingtalk"]
    query = parse_qs(urlsplit(ding.path).query)
    millis, sign = query["timestamp"][0], query["sign"][0]
    expected = base64.b64encode(hmac.new(SECRET.encode(), f"{millis}\n{SECRET}".encode(), hashlib.sha256).digest())
    assert sign == expected.decode() and ding.json()["msgtype"] == "text"
    feishu = by_kind["feishu"].json()
    mac = hmac.new(f"{feishu['timestamp']}\n{SECRET}".encode(), b"", hashlib.sha256).digest()
    assert feishu["sign"] == base64.b64encode(mac).decode() and feishu["msg_type"] == "text"


def test_a_chat_robot_that_refuses_in_its_body_counts_as_failed(world, receiver):
    channel_create(actor=world.owner, name="ding", kind="dingtalk", team=world.team, url=f"{receiver.url}/d",
                   events=["alert.firing"])
    receiver.answer_body = b'{"errcode": 310000, "errmsg": "sign not match"}'
    notify(event="alert.firing", subject="s", text="t", team_ids=[world.team.pk])
    assert _attempt_all() == ["pending"]
    assert "sign not match" in NotificationChannel.objects.get().last_error


def test_private_addresses_are_refused_unless_allowed(world, receiver, settings):
    settings.NOTIFY_ALLOW_PRIVATE_URLS = False
    channel_create(actor=world.member, name="mine", kind="webhook", url=f"{receiver.url}/x",
                   events=["reservation.active"])
    notify(event="reservation.active", subject="s", text="t", user_ids=[world.member.pk])
    assert _attempt_all() == ["pending"]
    assert "private address" in Delivery.objects.get().last_error and not receiver.received


def test_an_email_channel_mails_its_address(world, settings):
    channel_create(actor=world.member, name="pager", kind="email", email="pager@example.com",
                   events=["reservation.failed"])
    notify(event="reservation.failed", subject="Reservation #1 failed", text="node down",
           user_ids=[world.member.pk])
    assert _attempt_all() == ["sent"]
    assert mail.outbox[-1].to == ["pager@example.com"] and "failed" in mail.outbox[-1].subject


def test_who_may_make_see_and_test_channels(world, api, receiver):
    member, owner = api(world.member), api(world.owner)
    refused = member.post(CHANNELS, {"name": "x", "kind": "slack", "team": "ml", "url": f"{receiver.url}/s",
                                     "events": []}, format="json")
    assert refused.status_code == 403  # a member is not the team's manager
    own = member.post(CHANNELS, {"name": "mine", "kind": "slack", "url": f"{receiver.url}/s",
                                 "events": ["reservation.active"]}, format="json")
    assert own.status_code == 201 and own.json()["team"] is None
    team = owner.post(CHANNELS, {"name": "team", "kind": "wecom", "team": "ml", "url": f"{receiver.url}/w",
                                 "events": ["alert.firing"]}, format="json").json()
    assert {c["name"] for c in member.get(CHANNELS).json()["results"]} == {"mine", "team"}  # sees the team's
    assert {c["name"] for c in api(world.outsider).get(CHANNELS).json()["results"]} == set()
    assert member.post(f"{CHANNELS}{team['id']}/test/").status_code == 403
    tested = owner.post(f"{CHANNELS}{team['id']}/test/")
    assert tested.status_code == 202 and tested.json()["event"] == "test"
    assert owner.get(f"{CHANNELS}{team['id']}/deliveries/").json()["count"] == 1
    assert member.delete(f"{CHANNELS}{team['id']}/").status_code == 403


@pytest.mark.parametrize(("body", "field", "rule"), [
    ({"name": "x", "kind": "webhook", "events": []}, "url", "required"),
    ({"name": "x", "kind": "email", "events": []}, "email", "required"),
    ({"name": "x", "kind": "slack", "url": "ftp://example.com/x", "events": []}, "url", "invalid_url"),
    ({"name": "x", "kind": "slack", "url": "https://example.com/x", "events": ["reservation.exploded"]}, "events",
     "unknown_event"),
    ({"name": "x", "kind": "pigeon", "url": "https://example.com/x", "events": []}, "kind", "invalid_choice"),
])
def test_bad_channels_are_refused_naming_the_field_and_rule(world, api, body, field, rule):
    answer = api(world.member).post(CHANNELS, body, format="json")
    assert answer.status_code == 400, answer.content
    assert (answer.json()["errors"][0]["field"], answer.json()["errors"][0]["rule"]) == (field, rule)
    assert not NotificationChannel.objects.exists()
