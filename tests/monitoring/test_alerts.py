"""Alerts against a real SMTP server (aiosmtpd): pending, one firing mail, one resolved mail; silences; repeats."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from allocations.models import Allocation, Reservation
from monitoring.alerts import alerts_evaluate
from monitoring.models import Alert, AlertRule, Silence
from tests.monitoring.conftest import batch, payload, post, sample
from tests.smtp import Inbox

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def smtp(smtp, settings):
    """The package's mail server, with links in the mails pointing at a known portal address."""
    settings.PORTAL_BASE_URL = "https://gpupool.example.test"
    return smtp


def _wait_for(inbox: Inbox, n: int) -> None:
    deadline = time.monotonic() + 5
    while len(inbox.messages) < n and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def rule(world, host):
    AlertRule.objects.update(enabled=False)  # the shipped defaults stay out of this test's way
    gpu = host.gpus[0]
    now = timezone.now()
    reservation = Reservation.objects.create(team=world.team, pool=world.pool, requested_by=world.member, gpus=1,
                                             starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=5),
                                             state="active")
    Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=reservation.starts_at,
                              ends_at=reservation.ends_at)
    return AlertRule.objects.create(name="Overload", metric="gpu_util", scope="gpu", comparison=">=", threshold=95,
                                    for_seconds=300, repeat_seconds=0, severity="warning", notify_team_managers=True,
                                    extra_emails="ops@example.test")


def _report(host, util: float) -> None:
    response = post(host, payload(batch([sample(host.uuids[0], util=util)] +
                                        [sample(u, util=50) for u in host.uuids[1:]])))
    assert response.status_code == 200


def test_an_alert_goes_pending_fires_once_and_resolves_once(smtp, rule, host, world):
    t0 = timezone.now()
    _report(host, 99)
    alerts_evaluate(now=t0)
    alert = Alert.objects.get()
    assert alert.state == "pending" and alert.subject == f"gpu:{host.gpus[0].pk}" and alert.team == world.team
    alerts_evaluate(now=t0 + timedelta(seconds=200))
    assert Alert.objects.get().state == "pending" and smtp.messages == []

    assert alerts_evaluate(now=t0 + timedelta(seconds=301))["fired"] == 1
    alerts_evaluate(now=t0 + timedelta(seconds=400))
    alerts_evaluate(now=t0 + timedelta(seconds=500))
    _wait_for(smtp, 1)
    assert Alert.objects.get().state == "firing"

    _report(host, 10)
    assert alerts_evaluate(now=t0 + timedelta(seconds=600))["resolved"] == 1
    alerts_evaluate(now=t0 + timedelta(seconds=700))
    _wait_for(smtp, 2)
    time.sleep(0.3)

    assert len(smtp.messages) == 2, [m["Subject"] for _, m in smtp.messages]
    (to1, firing), (to2, resolved) = smtp.messages
    assert sorted(to1) == sorted(to2) == ["ops@example.test", "owner@example.test"]
    assert firing["Subject"].startswith("[FIRING warning] Overload: ")
    assert resolved["Subject"].startswith("[RESOLVED warning] Overload: ")
    text = firing.get_body(("plain",)).get_content()
    html = firing.get_body(("html",)).get_content()
    assert "https://gpupool.example.test/pools/a100/" in text and 'href="https://gpupool.example.test/pools/a100/"' in html
    assert "99.0" in text
    alert = Alert.objects.get()
    assert alert.state == "resolved" and alert.notifications == 2 and alert.resolved_at is not None
    # The next breach is a new alert (history keeps the old one).
    _report(host, 100)
    alerts_evaluate(now=t0 + timedelta(seconds=800))
    assert list(Alert.objects.order_by("id").values_list("state", flat=True)) == ["resolved", "pending"]


def test_a_condition_that_clears_before_its_for_duration_sends_nothing(smtp, rule, host):
    t0 = timezone.now()
    _report(host, 99)
    alerts_evaluate(now=t0)
    _report(host, 20)
    alerts_evaluate(now=t0 + timedelta(seconds=60))
    assert not Alert.objects.exists()
    time.sleep(0.3)
    assert smtp.messages == []


def test_a_silence_suppresses_both_mails_but_not_the_state(smtp, rule, host, world):
    t0 = timezone.now()
    Silence.objects.create(rule=rule, starts_at=t0 - timedelta(minutes=1), ends_at=t0 + timedelta(hours=1),
                           created_by=world.staff)
    _report(host, 99)
    alerts_evaluate(now=t0)
    alerts_evaluate(now=t0 + timedelta(seconds=301))
    assert Alert.objects.get().state == "firing"
    _report(host, 5)
    alerts_evaluate(now=t0 + timedelta(seconds=400))
    assert Alert.objects.get().state == "resolved"
    time.sleep(0.5)
    assert smtp.messages == []


def test_a_long_firing_alert_mails_again_after_the_repeat_interval(smtp, rule, host):
    rule.repeat_seconds = 600
    rule.save()
    t0 = timezone.now()
    _report(host, 99)
    alerts_evaluate(now=t0)
    alerts_evaluate(now=t0 + timedelta(seconds=301))
    alerts_evaluate(now=t0 + timedelta(seconds=700))  # 399 s after the mail: not yet
    alerts_evaluate(now=t0 + timedelta(seconds=902))  # 601 s after: again
    _wait_for(smtp, 2)
    time.sleep(0.3)
    assert [m["Subject"].split("]")[0] for _, m in smtp.messages] == ["[FIRING warning", "[FIRING warning"]


def test_the_default_rules_ship_with_the_database():
    import importlib

    from django.apps import apps

    # Transactional tests flush what the data migration wrote; run it again on an empty table.
    AlertRule.objects.all().delete()
    importlib.import_module("monitoring.migrations.0002_brin_and_default_rules").add_rules(apps, None)
    rules = {r.name: r for r in AlertRule.objects.all()}
    assert (rules["GPU overloaded"].metric, rules["GPU overloaded"].threshold, rules["GPU overloaded"].for_seconds) == (
        "gpu_util", 95, 300)
    assert rules["GPU too hot"].threshold == 85 and rules["GPU too hot"].for_seconds == 120
    assert rules["GPU allocated but idle"].comparison == "<=" and rules["GPU allocated but idle"].for_seconds == 1800
    assert rules["GPU allocated but idle"].notify_team_members
    assert {"host_silent", "pool_allocation", "gpu_memory"} <= {r.metric for r in rules.values()}


def test_pool_allocation_and_silent_hosts_are_measured(smtp, world, host):
    AlertRule.objects.all().delete()
    AlertRule.objects.create(name="Pool full", metric="pool_allocation", scope="pool", threshold=90, for_seconds=300)
    AlertRule.objects.create(name="Silent", metric="host_silent", scope="node", threshold=120, for_seconds=0)
    now = timezone.now()
    host.node.last_seen_at = now - timedelta(minutes=10)
    host.node.save()
    reservation = Reservation.objects.create(team=world.other_team, pool=world.other_pool, gpus=2, state="active",
                                             starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1))
    for gpu in world.other_pool.gpus.all():
        Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=reservation.starts_at,
                                  ends_at=reservation.ends_at)
    alerts_evaluate(now=now)
    alerts_evaluate(now=now + timedelta(seconds=301))
    firing = {a.subject: a for a in Alert.objects.filter(state="firing")}
    assert firing[f"pool:{world.other_pool.pk}"].value == 100
    assert firing[f"node:{host.node.pk}"].value >= 600
    assert f"pool:{world.pool.pk}" not in firing


def test_staff_manage_rules_and_members_see_only_their_alerts(api, world, rule, host):
    body = {"name": "Hot", "metric": "gpu_temperature", "scope": "gpu", "comparison": ">=", "threshold": 80,
            "for_seconds": 60, "severity": "critical"}
    assert api(world.member).post("/api/v1/alert-rules/", body, format="json").status_code == 403
    created = api(world.staff).post("/api/v1/alert-rules/", body, format="json")
    assert created.status_code == 201, created.content
    bad = api(world.staff).post("/api/v1/alert-rules/", {**body, "name": "x", "metric": "host_silent"}, format="json")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "scope"
    _report(host, 99)
    alerts_evaluate(now=timezone.now())
    assert api(world.member).get("/api/v1/alerts/").json()["count"] == 1
    assert api(world.staff).get("/api/v1/alerts/").json()["count"] == 1
    stranger = __import__("tests.factories", fromlist=["UserFactory"]).UserFactory(username="stranger")
    assert api(stranger).get("/api/v1/alerts/").json()["count"] == 0


def _fire_while_silenced(rule, host, world):
    """The rule's alert fires under a silence that ends at t0 + 400 s; returns t0."""
    t0 = timezone.now()
    Silence.objects.create(rule=rule, starts_at=t0 - timedelta(minutes=1), ends_at=t0 + timedelta(seconds=400),
                           created_by=world.staff)
    _report(host, 99)
    alerts_evaluate(now=t0)
    alerts_evaluate(now=t0 + timedelta(seconds=301))  # fires, silenced: no mail
    return t0


def test_an_alert_that_fired_while_silenced_is_mailed_once_the_silence_ends(smtp, rule, host, world):
    t0 = _fire_while_silenced(rule, host, world)
    time.sleep(0.3)
    assert smtp.messages == []
    _report(host, 99)
    alerts_evaluate(now=t0 + timedelta(seconds=500))  # the silence is over and it still fires
    alerts_evaluate(now=t0 + timedelta(seconds=600))  # told once, not on every evaluation
    _report(host, 5)
    alerts_evaluate(now=t0 + timedelta(seconds=700))
    _wait_for(smtp, 2)
    time.sleep(0.3)
    assert [m["Subject"].split("]")[0] for _, m in smtp.messages] == ["[FIRING warning", "[RESOLVED warning"]


def test_disabling_a_rule_resolves_its_alerts_with_the_resolved_mail(smtp, rule, host):
    t0 = timezone.now()
    _report(host, 99)
    alerts_evaluate(now=t0)
    alerts_evaluate(now=t0 + timedelta(seconds=301))
    rule.enabled = False
    rule.save()
    alerts_evaluate(now=t0 + timedelta(seconds=400))
    assert Alert.objects.get().state == "resolved"
    _wait_for(smtp, 2)
    time.sleep(0.3)
    assert [m["Subject"].split("]")[0] for _, m in smtp.messages] == ["[FIRING warning", "[RESOLVED warning"]
    assert alerts_evaluate(now=t0 + timedelta(seconds=500)) == {}  # nothing left to do for it


def test_an_idle_gpu_that_changes_hands_starts_a_new_for_duration_for_the_new_holder(world, host):
    AlertRule.objects.update(enabled=False)
    idle = AlertRule.objects.create(name="Idle (test)", metric="gpu_idle_allocated", scope="gpu", comparison="<=",
                                    threshold=1, for_seconds=1800, notify_team_members=True)
    t0 = timezone.now()
    gpu = host.gpus[0]
    for team, start, end in ((world.team, t0 - timedelta(minutes=1), t0 + timedelta(minutes=25)),
                             (world.other_team, t0 + timedelta(minutes=25), t0 + timedelta(hours=5))):
        reservation = Reservation.objects.create(team=team, pool=world.pool, requested_by=world.member, gpus=1,
                                                 starts_at=start, ends_at=end, state="active")
        Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=start, ends_at=end)
    for minutes in (0, 20, 31):  # infra has held it 6 minutes at the last one
        _report(host, 0)
        alerts_evaluate(now=t0 + timedelta(minutes=minutes))
    [alert] = Alert.objects.filter(rule=idle, state__in=Alert.OPEN_STATES)
    assert alert.state == "pending" and alert.team == world.other_team
    _report(host, 0)
    alerts_evaluate(now=t0 + timedelta(minutes=31 + 30))  # 30 minutes after infra's alert went pending
    assert Alert.objects.get(rule=idle, state="firing").team == world.other_team


def test_deleting_a_rule_while_it_fires_sends_the_resolved_mail(smtp, rule, host, api, world):
    t0 = timezone.now()
    _report(host, 99)
    alerts_evaluate(now=t0)
    alerts_evaluate(now=t0 + timedelta(seconds=301))
    assert api(world.staff).delete(f"/api/v1/alert-rules/{rule.pk}/").status_code == 204
    assert not Alert.objects.exists()
    _wait_for(smtp, 2)
    time.sleep(0.3)
    assert [m["Subject"].split("]")[0] for _, m in smtp.messages] == ["[FIRING warning", "[RESOLVED warning"]


def _race_the_next_evaluation(monkeypatch, now) -> None:
    """The next evaluation reads its rule's open alerts, then a rival evaluation at the same time runs whole
    (in its own connection and transaction, as a second Celery worker or a beat run overlapping a slow one
    would) before it goes on with the rows as it read them."""
    from django.db import connection

    holds, raced = AlertRule.holds, []

    def rival() -> None:
        try:
            alerts_evaluate(now=now)
        finally:
            connection.close()

    def holds_after_a_rival(self, value):
        if not raced:
            raced.append(True)
            thread = threading.Thread(target=rival)
            thread.start()
            thread.join()
        return holds(self, value)

    monkeypatch.setattr(AlertRule, "holds", holds_after_a_rival)


def test_two_evaluations_at_once_send_a_repeat_mail_once(smtp, rule, host, monkeypatch):
    rule.repeat_seconds = 600
    rule.save()
    t0 = timezone.now()
    _report(host, 99)
    alerts_evaluate(now=t0)
    alerts_evaluate(now=t0 + timedelta(seconds=301))  # fires: the first mail
    _report(host, 99)
    _race_the_next_evaluation(monkeypatch, t0 + timedelta(seconds=902))
    alerts_evaluate(now=t0 + timedelta(seconds=902))  # the repeat is due for both evaluations
    _wait_for(smtp, 3)
    time.sleep(0.3)
    assert [m["Subject"].split("]")[0] for _, m in smtp.messages] == ["[FIRING warning", "[FIRING warning"]
    assert Alert.objects.get().notifications == 2


def test_two_evaluations_at_once_mail_an_alert_that_fired_while_silenced_once(smtp, rule, host, world, monkeypatch):
    t0 = _fire_while_silenced(rule, host, world)
    _report(host, 99)
    _race_the_next_evaluation(monkeypatch, t0 + timedelta(seconds=500))
    alerts_evaluate(now=t0 + timedelta(seconds=500))  # the silence is over: both see a firing mail owed
    _wait_for(smtp, 2)
    time.sleep(0.3)
    assert [m["Subject"].split("]")[0] for _, m in smtp.messages] == ["[FIRING warning"]
    assert Alert.objects.get().notifications == 1


def test_each_recipient_reads_the_alert_mail_in_their_own_language_and_zone(smtp, rule, host, world):
    from teams.models import Preference

    # The team's manager chose Chinese and Shanghai; the rule's extra address has no account: the defaults.
    Preference.objects.create(user=world.owner, language="zh-hans", time_zone="Asia/Shanghai")
    AlertRule.objects.filter(name="GPU overloaded").delete()  # the shipped one (disabled here)
    rule.name = "GPU overloaded"  # a rule the portal ships: its name is translated too
    rule.save()
    t0 = timezone.now().replace(hour=12, minute=0, second=0, microsecond=0)
    _report(host, 99)
    alerts_evaluate(now=t0)
    assert alerts_evaluate(now=t0 + timedelta(seconds=301))["mails"] == 1
    _wait_for(smtp, 2)
    time.sleep(0.3)

    assert len(smtp.messages) == 2, smtp.subjects()
    mails = {tuple(to): message for to, message in smtp.messages}
    chinese, english = mails[("owner@example.test",)], mails[("ops@example.test",)]
    # The bracketed state and severity stay Alertmanager's codes (mail filters); the rule's name is the reader's.
    # (A subject with Chinese in it is folded as an encoded word: Python's parser keeps the fold's space.)
    assert chinese["Subject"].strip().startswith("[FIRING warning] GPU 过载: ")
    assert english["Subject"].startswith("[FIRING warning] GPU overloaded: ")
    text, html = chinese.get_body(("plain",)).get_content(), chinese.get_body(("html",)).get_content()
    assert text.startswith("告警中 [警告] GPU 过载") and "条件： GPU 利用率（%） >= 95，持续 300 秒" in text
    assert "值：     99.0" in text and "查看实时数据： https://gpupool.example.test/pools/a100/" in text
    assert "告警中：GPU 过载</h2>" in html and "在门户中查看实时数据" in html and "Firing" not in html
    assert "20:00:00 CST" in text  # 12:00 UTC, in the reader's zone
    text, html = english.get_body(("plain",)).get_content(), english.get_body(("html",)).get_content()
    assert text.startswith("FIRING [Warning] GPU overloaded") and "Condition: GPU utilization (%) >= 95 for 300 s" in text
    assert "Value:     99.0" in text and "12:00:00 UTC" in text and "Firing: GPU overloaded</h2>" in html
    assert "告警" not in text + html
