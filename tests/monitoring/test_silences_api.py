"""Staff manage silences over the API; a silence must end after it starts."""
from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from monitoring.models import Silence
from tests.factories import AlertRuleFactory


def test_staff_silence_a_rule_for_a_while_and_lift_it(world, api):
    staff = api(world.staff)
    rule = AlertRuleFactory()
    ends = timezone.now() + timedelta(hours=2)
    created = staff.post("/api/v1/silences/", {"rule": rule.pk, "pool": "a100", "comment": "maintenance",
                                               "ends_at": ends.isoformat()}, format="json")
    assert created.status_code == 201, created.content
    data = created.json()
    assert data["created_by"] == "staff" and data["pool"] == "a100" and data["starts_at"]
    assert Silence.objects.get(pk=data["id"]).rule == rule
    assert staff.delete(f"/api/v1/silences/{data['id']}/").status_code == 204


def test_a_silence_that_ends_before_it_starts_is_refused_and_members_may_not(world, api):
    start = timezone.now() + timedelta(hours=3)
    refused = api(world.staff).post("/api/v1/silences/", {"starts_at": start.isoformat(),
                                                          "ends_at": (start - timedelta(hours=1)).isoformat()},
                                    format="json")
    assert refused.status_code == 400 and refused.json()["errors"][0]["field"] == "ends_at"
    assert api(world.member).post("/api/v1/silences/", {"ends_at": start.isoformat()},
                                  format="json").status_code == 403
    assert api(world.member).get("/api/v1/silences/").status_code == 403


def test_a_refused_silence_is_explained_in_chinese_with_the_same_field_and_rule(world, api):
    start = timezone.now() + timedelta(hours=3)
    body = {"starts_at": start.isoformat(), "ends_at": (start - timedelta(hours=1)).isoformat()}
    english = api(world.staff).post("/api/v1/silences/", body, format="json").json()["errors"][0]
    chinese = api(world.staff).post("/api/v1/silences/", body, format="json",
                                    HTTP_ACCEPT_LANGUAGE="zh-hans").json()["errors"][0]
    assert english["message"] == "A silence must end after it starts."
    assert chinese["message"] == "静默的结束时间必须晚于开始时间。"
    assert english["field"] == "ends_at" and (chinese["field"], chinese["rule"]) == (english["field"], english["rule"])
