"""The default "share memory exceeded" rule: a holder of a time-sliced GPU (no memory isolation) or a
MIG instance using more than its share fires to the holder's team and staff, by real SMTP (aiosmtpd)."""
from __future__ import annotations

import importlib
import time
from datetime import timedelta

import pytest
from django.apps import apps
from django.utils import timezone

from monitoring.alerts import alerts_evaluate
from monitoring.models import Alert, AlertRule
from tests.monitoring.test_alerts import _wait_for, smtp  # noqa: F401 - the real SMTP server fixture
from tests.monitoring.test_shares import MEMORY, mig, proc, report, time_sliced  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rule(world):
    # Transactional tests flush what data migrations wrote: ship the rule again, as migration 0006 does.
    AlertRule.objects.all().delete()
    importlib.import_module("monitoring.migrations.0006_share_memory_rule").add_rule(apps, None)
    return AlertRule.objects.get()


def test_the_rule_ships_by_default_to_the_holders_team_and_staff(rule):
    assert (rule.name, rule.metric, rule.scope, rule.comparison, rule.threshold, rule.enabled) == (
        "GPU share memory exceeded", "share_memory", "gpu", ">", 100, True)
    assert rule.notify_team_managers and rule.notify_team_members and rule.notify_staff


def test_a_tenant_over_its_time_slicing_share_fires_once_to_its_team_and_staff_and_resolves(
        smtp, rule, host, world, time_sliced):  # noqa: F811
    mine, theirs = time_sliced
    t0 = timezone.now()
    # member stays inside a quarter of the card; outsider's two quarters are 40,779 MiB and it uses 50,000.
    report(host, [proc(101, 15000, "member"), proc(102, 50000, "outsider")], memory_used_mib=65000)
    alerts_evaluate(now=t0)
    alert = Alert.objects.get()
    assert alert.subject == f"share:{theirs.pk}:gpu:{host.gpus[0].pk}" and alert.state == "pending"
    assert alert.team == world.other_team and alert.pool == world.pool and alert.node == host.node
    assert alert.value == pytest.approx(100 * 50000 / (MEMORY // 2))
    assert f"reservation #{theirs.pk} of team infra" in alert.subject_label
    assert alerts_evaluate(now=t0 + timedelta(seconds=121))["fired"] == 1
    _wait_for(smtp, 1)

    report(host, [proc(101, 15000, "member"), proc(102, 30000, "outsider")], memory_used_mib=45000,
           t=time.time() + 1)  # the next second's sample (history keeps one per second)
    assert alerts_evaluate(now=t0 + timedelta(seconds=200))["resolved"] == 1
    _wait_for(smtp, 2)
    time.sleep(0.3)
    assert len(smtp.messages) == 2
    (to1, firing), (to2, resolved) = smtp.messages
    # infra's members (outsider manages it) and staff; not team ml, whose share is within bounds.
    assert sorted(to1) == sorted(to2) == ["outsider@example.test", "staff@example.test"]
    assert firing["Subject"].startswith("[FIRING warning] GPU share memory exceeded: lab/node-a GPU 0: reservation")
    assert resolved["Subject"].startswith("[RESOLVED warning] GPU share memory exceeded: ")
    assert "GPU memory a holder uses, % of its share > 100" in firing.get_body(("plain",)).get_content()


def test_a_mig_instance_used_beyond_its_memory_is_its_holders_alert(smtp, rule, host, world, mig):  # noqa: F811
    first, second = mig
    t0 = timezone.now()
    report(host, [proc(201, 4000, "member", "MIG-aaaa"), proc(202, 12000, "outsider", "MIG-bbbb")], gpu=1)
    alerts_evaluate(now=t0)
    alert = Alert.objects.get()
    assert alert.subject == f"share:{second.pk}:gpu:{host.gpus[1].pk}:mig:1" and alert.team == world.other_team
    assert "MIG 1g.10gb at slice 1" in alert.subject_label
    assert alert.value == pytest.approx(100 * 12000 / 9984)


def test_a_holder_running_nothing_or_within_its_share_raises_nothing(smtp, rule, host, world, time_sliced):  # noqa: F811
    report(host, [proc(101, 20389, "member")])
    alerts_evaluate(now=timezone.now())
    assert not Alert.objects.exists()
