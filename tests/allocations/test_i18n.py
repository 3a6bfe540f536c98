"""allocations in Simplified Chinese: the API's refusals, the stored reasons (written once, read in each
reader's language) and the mails (each recipient in their own language), with the English unchanged."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone, translation

from allocations import notices, queue, services
from allocations.messages import Msg
from allocations.models import Reservation, ReservationEvent
from teams.models import Preference
from tests.factories import window

URL = "/api/v1/reservations/"
ZH = {"HTTP_ACCEPT_LANGUAGE": "zh-hans"}
EN = {"HTTP_ACCEPT_LANGUAGE": "en"}


def _post(client, data, **headers):
    return client.post(URL, data, format="json", **headers)


@pytest.mark.parametrize("headers, words", [
    (ZH, "结束时间必须晚于开始时间"),
    (EN, "The end must come after the start"),
])
def test_a_refused_window_names_the_same_field_and_rule_in_either_language(world, api, headers, words):
    start, _end = window(1, 2)
    response = _post(api(world.member), {"pool": "a100", "team": "ml", "gpus": 1, "starts_at": start.isoformat(),
                                         "ends_at": (start - timedelta(hours=1)).isoformat()}, **headers)
    assert response.status_code == 400
    error = response.json()["errors"][0]
    assert (error["field"], error["rule"]) == ("ends_at", "after_starts_at")
    assert words in error["message"] and words in response.json()["detail"]


@pytest.mark.parametrize("headers, words", [
    (ZH, "团队 ML 在资源池 L4 中没有配额。"),
    (EN, "Team ML has no quota in pool L4."),
])
def test_no_quota_is_refused_in_the_readers_language(world, api, headers, words):
    _start, end = window(0, 2)
    response = _post(api(world.member), {"pool": "l4", "team": "ml", "gpus": 1, "ends_at": end.isoformat()},
                     **headers)
    assert response.status_code == 403
    error = response.json()["errors"][0]
    assert (error["field"], error["rule"], error["message"]) == ("pool", "no_quota", words)


@pytest.mark.parametrize("headers, words", [
    (ZH, "共有 2 个 GPU 空闲，但没有节点有 2 个空闲（单个节点最多 1 个）。"),
    (EN, "2 GPUs are free in total but no node has 2 free (the most on one node is 1)."),
])
def test_no_room_is_refused_in_the_readers_language_with_the_engines_numbers(world, api, headers, words):
    client = api(world.outsider)  # team infra: quota 8 in a100
    _start, end = window(0, 2)
    for _ in range(2):  # 3 GPUs on each node: one left on each
        assert _post(client, {"pool": "a100", "team": "infra", "gpus": 3, "ends_at": end.isoformat()}).status_code == 201
    response = _post(client, {"pool": "a100", "team": "infra", "gpus": 2, "ends_at": end.isoformat()}, **headers)
    assert response.status_code == 409
    error = response.json()["errors"][0]
    assert (error["field"], error["rule"], error["message"]) == ("gpus", "fragmented", words)


def test_a_stored_reason_reads_in_each_readers_language(world, api):
    client = api(world.member)
    start, end = window(3, 2)
    created = _post(client, {"pool": "a100", "team": "ml", "gpus": 2, "starts_at": start.isoformat(),
                             "ends_at": end.isoformat()})
    assert created.status_code == 201, created.content
    rid = created.json()["id"]
    assert client.post(f"{URL}{rid}/release/", format="json").status_code == 200
    row = Reservation.objects.get(pk=rid)
    # The column keeps the English sentence (the audit log and SQL readers see what they always saw).
    assert Reservation.objects.filter(pk=rid).values_list("reason", flat=True)[0] == \
        "Cancelled before its start by member."
    assert row.reason_message["id"] == "Cancelled before its start by %(who)s."

    english = client.get(f"{URL}{rid}/", **EN).json()
    chinese = client.get(f"{URL}{rid}/", **ZH).json()
    assert english["reason"] == "Cancelled before its start by member."
    assert chinese["reason"] == "已由 member 在开始前取消。"
    assert english["state"] == chinese["state"] == "released"  # codes stay codes
    first = ReservationEvent.objects.filter(reservation_id=rid).order_by("at", "id").first()
    with translation.override("zh-hans"):
        assert str(first.reason) == "已放置 2 个 GPU（2.00 GE）"
        assert row.get_state_display() == "已释放"
    with translation.override("en"):
        assert first.reason == "2 GPUs placed (2.00 GE)"

    # A row written before the message column (or by hand) is shown as written, in any language.
    Reservation.objects.filter(pk=rid).update(reason="Freed by hand.", reason_message=None)
    assert client.get(f"{URL}{rid}/", **ZH).json()["reason"] == "Freed by hand."
    # And one whose text was changed without its message: the text, never a stale translation.
    Reservation.objects.filter(pk=rid).update(reason="Edited.", reason_message=Msg("Window ended.").data())
    assert client.get(f"{URL}{rid}/", **ZH).json()["reason"] == "Edited."


def test_the_queue_says_why_a_request_waits_in_chinese(world, api):
    world.pool.queueing = True
    world.pool.save()
    client = api(world.member)
    _start, end = window(0, 3)
    assert _post(client, {"pool": "a100", "team": "ml", "gpus": 4, "ends_at": end.isoformat()}).status_code == 201
    assert _post(api(world.outsider), {"pool": "a100", "team": "infra", "gpus": 4,
                                       "ends_at": end.isoformat()}).status_code == 201
    waiting = _post(client, {"pool": "a100", "team": "ml", "gpus": 1, "duration": "1h"})
    assert waiting.status_code == 201, waiting.content
    rid = waiting.json()["id"]
    english = client.get(f"{URL}{rid}/", **EN).json()
    chinese = client.get(f"{URL}{rid}/", **ZH).json()
    assert english["state"] == chinese["state"] == "pending"
    assert english["queue"]["reason"] == chinese["queue"]["reason"]  # the code
    assert english["queue"]["reason_text"] == queue.reason_words(english["queue"]["reason"]).english()
    with translation.override("zh-hans"):
        assert chinese["queue"]["reason_text"] == str(queue.reason_words(chinese["queue"]["reason"]))
    assert chinese["queue"]["reason_text"] != english["queue"]["reason_text"]
    assert chinese["reason"] == chinese["queue"]["reason_text"]


def test_a_span_and_a_shape_read_in_chinese():
    with translation.override("zh-hans"):
        assert str(queue.span(timedelta(hours=3, minutes=5))) == "3 小时 05 分钟"
        assert str(queue.span(timedelta(days=2, hours=4))) == "2 天 4 小时"
    assert queue.span(timedelta(hours=3, minutes=5)).english() == "3 h 05 min"


def test_each_recipient_reads_the_mail_in_their_language(world, api, django_capture_on_commit_callbacks):
    Preference.objects.create(user=world.owner, language="zh-hans", time_zone="Asia/Shanghai")
    world.member.email = "member@example.com"
    world.member.save()
    _start, end = window(0, 2)
    rid = _post(api(world.member), {"pool": "a100", "team": "ml", "gpus": 1, "ends_at": end.isoformat()}).json()["id"]
    reservation = Reservation.objects.select_related("team", "pool", "requested_by").get(pk=rid)
    with django_capture_on_commit_callbacks(execute=True):
        assert notices.notify_owners(
            reservation, Msg("Reservation #%(id)s ends in %(span)s", id=rid, span=queue.span(timedelta(minutes=30))),
            Msg("Window ended."), event="reservation.expiring") is True
    by_address = {message.to[0]: message for message in mail.outbox}
    assert sorted(by_address) == sorted([world.owner.email, "member@example.com"])
    chinese, english = by_address[world.owner.email], by_address["member@example.com"]
    assert chinese.subject == f"[GPU Pool] 预约 #{rid} 将在 30 分钟 后结束"
    assert "时间窗口已结束。" in chinese.body and "打开预约" in chinese.alternatives[0][0]
    assert "使用中" in chinese.alternatives[0][0] or "已排期" in chinese.alternatives[0][0]
    assert "CST" in chinese.body  # the window in the recipient's zone
    assert english.subject == f"[GPU Pool] Reservation #{rid} ends in 30 min"
    assert "Window ended." in english.body and "Open the reservation" in english.alternatives[0][0]


def test_the_expiry_warning_goes_to_a_chinese_reader_in_chinese(world, api, django_capture_on_commit_callbacks,
                                                                 settings):
    settings.EXPIRY_WARNING = timedelta(hours=1)
    Preference.objects.create(user=world.member, language="zh-hans")
    now = timezone.now()
    _start, end = window(0, 0.5)
    rid = _post(api(world.member), {"pool": "a100", "team": "ml", "gpus": 1, "ends_at": end.isoformat()}).json()["id"]
    Reservation.objects.filter(pk=rid).update(starts_at=now - timedelta(hours=2))
    with django_capture_on_commit_callbacks(execute=True):
        assert services.reservation_warn_expiry(reservation_id=rid, now=now) is True
    subjects = {message.to[0]: message.subject for message in mail.outbox}
    assert subjects[world.member.email].startswith(f"[GPU Pool] 预约 #{rid} 将在 ")
    assert subjects[world.owner.email].startswith(f"[GPU Pool] Reservation #{rid} ends in ")


def test_the_reservation_page_shows_its_reason_and_history_in_the_readers_language(world, api, client):
    start, end = window(3, 2)
    rid = _post(api(world.member), {"pool": "a100", "team": "ml", "gpus": 2, "starts_at": start.isoformat(),
                                    "ends_at": end.isoformat()}).json()["id"]
    assert api(world.member).post(f"{URL}{rid}/release/", format="json").status_code == 200
    client.force_login(world.member)
    chinese = client.get(f"/reservations/{rid}/", **ZH).content.decode()
    english = client.get(f"/reservations/{rid}/", **EN).content.decode()
    assert "已由 member 在开始前取消。" in chinese and "已放置 2 个 GPU（2.00 GE）" in chinese
    assert "Cancelled before its start by member." in english and "2 GPUs placed (2.00 GE)" in english
    assert "Cancelled before its start" not in chinese


def test_a_persons_channel_is_told_in_their_language_and_the_teams_in_the_portals(world, api):
    from teams.models import Delivery, NotificationChannel
    from teams.services import channel_create

    Preference.objects.create(user=world.member, language="zh-hans")
    _start, end = window(0, 2)
    rid = _post(api(world.member), {"pool": "a100", "team": "ml", "gpus": 1, "ends_at": end.isoformat()}).json()["id"]
    reservation = Reservation.objects.get(pk=rid)
    mine = channel_create(actor=world.member, name="mine", kind=NotificationChannel.Kind.EMAIL,
                          email="member@example.com", events=["reservation.expiring"])
    teams = channel_create(actor=world.owner, name="team", kind=NotificationChannel.Kind.EMAIL, team=world.team,
                           email="ml@example.com", events=["reservation.expiring"])
    assert notices.announce(reservation, "reservation.expiring", Msg("Window ended."), Msg("Window ended.")) == 2
    assert Delivery.objects.get(channel=mine).payload["subject"] == "时间窗口已结束。"
    assert Delivery.objects.get(channel=teams).payload["subject"] == "Window ended."
