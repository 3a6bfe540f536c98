"""The teams app in Simplified Chinese (issue 23): API refusals speak the request's language while their
`field` and `rule` stay the same codes, a person's notification channel speaks that person's saved
language and a team's channel the portal's default, and the admin's labels are translated."""
from __future__ import annotations

import pytest
from django.core import mail
from django.test import Client
from django.utils.translation import gettext
from rest_framework.test import APIClient

from teams.models import Delivery, NotificationChannel, Preference
from teams.notify import delivery_attempt, notify, send_test
from teams.services import api_token_create, channel_create
from tests.webhooks import start_receiver

pytestmark = pytest.mark.django_db
ZH = {"HTTP_ACCEPT_LANGUAGE": "zh-hans"}
EN = {"HTTP_ACCEPT_LANGUAGE": "en"}


def _token_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.mark.parametrize(("headers", "message"), [
    (ZH, "此 API 令牌为只读：不能做任何更改。"),
    (EN, "This API token is read-only: it cannot change anything."),
    ({}, "This API token is read-only: it cannot change anything."),
])
def test_a_read_only_tokens_write_is_refused_in_the_requests_language(world, headers, message):
    _, key = api_token_create(user=world.owner, scope="read")
    client = _token_client(key)
    assert client.get("/api/v1/teams/", **headers).status_code == 200
    refused = client.post("/api/v1/tokens/", {"name": "more"}, format="json", **headers)
    assert refused.status_code == 403
    assert refused.json()["errors"] == [{"field": "token", "rule": "token_read_only", "message": message}]


@pytest.mark.parametrize(("headers", "message"), [
    (ZH, "没有名为 'nobody' 的有效用户。"),
    (EN, "No active user named 'nobody'."),
])
def test_adding_an_unknown_member_is_refused_in_the_requests_language(world, api, headers, message):
    refused = api(world.owner).post("/api/v1/teams/ml/members/", {"username": "nobody"}, format="json", **headers)
    assert refused.status_code == 400
    assert refused.json()["errors"] == [{"field": "username", "rule": "does_not_exist", "message": message}]


def test_a_tokens_limits_and_the_sign_in_refusal_in_chinese(world, api):
    too_long = api(world.member).post("/api/v1/tokens/", {"expires_at": "2999-01-01T00:00:00Z"}, format="json", **ZH)
    (error,) = too_long.json()["errors"]
    assert (error["field"], error["rule"]) == ("expires_at", "too_long")
    assert error["message"].startswith("令牌的有效期最长为 ") and error["message"].endswith(" 天。")
    bad = APIClient().post("/api/v1/auth/token/", {"username": "member", "password": "wrong"}, format="json", **ZH)
    assert bad.json()["errors"] == [{"field": "password", "rule": "invalid_credentials",
                                     "message": "无法使用所给的用户名和密码登录。"}]


def test_a_persons_channel_speaks_their_language_and_a_teams_channel_the_portals(world, settings):
    settings.LANGUAGE_CODE = "en"
    Preference.objects.create(user=world.member, language="zh-hans")
    mine = channel_create(actor=world.member, name="mine", kind="email", email="member@example.com",
                          events=["reservation.failed"])
    ours = channel_create(actor=world.owner, name="ours", kind="email", team=world.team, email="ml@example.com",
                          events=["reservation.failed"])
    made = notify(event="reservation.failed", subject=lambda: gettext("A reservation failed"),
                  text=lambda: gettext("GPUs of a reservation are being taken back (borrowed or preempted)"),
                  team_ids=[world.team.pk], user_ids=[world.member.pk])
    assert made == 2
    payloads = {d.channel_id: d.payload for d in Delivery.objects.all()}
    assert (payloads[mine.pk]["subject"], payloads[mine.pk]["text"]) == ("预约失败", "预约的 GPU 正在被收回（借用或被抢占）")
    assert (payloads[ours.pk]["subject"], payloads[ours.pk]["text"]) == (
        "A reservation failed", "GPUs of a reservation are being taken back (borrowed or preempted)")
    assert all(delivery_attempt(pk) == "sent" for pk in Delivery.objects.values_list("pk", flat=True))
    by_address = {message.to[0]: message for message in mail.outbox}
    assert by_address["member@example.com"].subject == "[GPU Pool] 预约失败"
    assert by_address["ml@example.com"].subject == "[GPU Pool] A reservation failed"
    # A plain str is sent as it is, to everyone: callers that build no callable keep working.
    Delivery.objects.all().delete()
    notify(event="reservation.failed", subject="as given", text="as given", user_ids=[world.member.pk])
    assert Delivery.objects.get().payload["subject"] == "as given"


def test_a_test_message_and_a_slack_link_in_the_owners_language(world, settings):
    settings.NOTIFY_ALLOW_PRIVATE_URLS = True
    receiver = start_receiver()
    try:
        Preference.objects.create(user=world.member, language="zh-hans")
        channel = channel_create(actor=world.member, name="我的 Slack", kind=NotificationChannel.Kind.SLACK,
                                 url=f"{receiver.url}/slack", events=["alert.firing"])
        delivery = send_test(channel)
        assert delivery.payload["subject"] == "渠道 我的 Slack 的测试消息"
        assert delivery_attempt(delivery.pk) == "sent"
        (hook,) = receiver.received
        assert "如果你看到这条消息，说明 GPU Pool Portal 可以连通此渠道。" in hook.json()["text"]
        assert "|在 GPU Pool Portal 中打开>" in hook.json()["text"]
    finally:
        receiver.stop()


def test_the_teams_admin_changelists_in_chinese(world):
    api_token_create(user=world.member, name="laptop")
    client = Client()
    client.force_login(world.staff)
    teams = client.get("/admin/teams/team/", **ZH).content.decode()
    assert "团队与成员" in teams and "GE 上限" in teams and "创建时间" in teams
    tokens = client.get("/admin/teams/apitoken/", **ZH).content.decode()
    assert "API 令牌" in tokens and "结束时间" in tokens and "读写" in tokens and "权限范围" in tokens
    memberships = client.get("/admin/teams/membership/", **ZH).content.decode()
    assert "管理者" in memberships and "加入时间" in memberships
    english = client.get("/admin/teams/team/", **EN).content.decode()
    assert "Teams and members" in english and "Max GE" in english and "团队" not in english
