"""GET /api/v1/usage/: grouping, who sees what, CSV = JSON, and refusals naming field and rule."""
from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.db.models import Sum

from accounting.ledger import ledger_close
from teams.models import Membership
from teams.services import api_token_create
from tests.accounting.history import H, grant, minutes
from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)
URL = "/api/v1/usage/"
DAY0 = H.replace(hour=0)
WINDOW = {"start": "2025-03-01", "end": "2025-04-01"}


@pytest.fixture
def history(world):
    """ml: 2 GE for 3 h on a100 (busy its first hour) by `member`, and a 0.5 GE share for 2 h the next day
    by `owner`; infra: 1 GE for 1 h on l4."""
    a100 = list(world.pool.gpus.order_by("pk"))
    l4 = world.other_pool.gpus.order_by("pk").first()
    grant(world.team, world.pool, a100[0], H, H + 3 * HOUR, ge=2.0, user=world.member)
    minutes(a100[0], H, 60, util=80)
    next_day = H + timedelta(days=1)
    grant(world.team, world.pool, a100[1], next_day, next_day + 2 * HOUR, ge=0.5, milli=500, mode="time_slicing",
          user=world.owner, share=(0, 500))
    grant(world.other_team, world.other_pool, l4, H, H + HOUR, ge=1.0, user=world.outsider)
    ledger_close(now=H + timedelta(days=3))
    ledger_close(now=H + timedelta(days=3))  # the hours past the first run's 48
    return world


def _get(client, **params):
    return client.get(URL, params)


def test_totals_and_grouping_by_team_and_pool(history, api):
    body = _get(api(history.staff), **WINDOW, group_by="team,pool").json()
    assert body["columns"][:2] == ["team", "pool"]
    rows = {(r["team"], r["pool"]): r for r in body["rows"]}
    assert set(rows) == {("ml", "a100"), ("infra", "l4")}
    ml = rows[("ml", "a100")]
    assert ml["booked_ge_hours"] == pytest.approx(2 * 3 + 0.5 * 2)
    assert ml["used_ge_hours"] == pytest.approx(2.0)
    assert ml["no_data_ge_hours"] == pytest.approx(5.0)
    assert ml["gpu_hours"] == pytest.approx(3 + 1)
    assert ml["efficiency"] == pytest.approx(2 / 7, abs=1e-4)
    assert ml["measured_efficiency"] == pytest.approx(1.0)
    assert body["totals"]["booked_ge_hours"] == pytest.approx(8.0)


def test_grouping_by_user_mode_and_day(history, api):
    body = _get(api(history.staff), **WINDOW, group_by="user,mode,day").json()
    got = {(r["user"], r["mode"], r["day"]): r["booked_ge_hours"] for r in body["rows"]}
    assert got == {("member", "exclusive", "2025-03-03"): pytest.approx(6.0),
                   ("owner", "time_slicing", "2025-03-04"): pytest.approx(1.0),
                   ("outsider", "exclusive", "2025-03-03"): pytest.approx(1.0)}
    weekly = _get(api(history.staff), **WINDOW, group_by="week,model").json()["rows"]
    assert [(r["week"], r["booked_ge_hours"]) for r in weekly] == [("2025-03-03", pytest.approx(8.0))]
    monthly = _get(api(history.staff), start="2025-01-01", end="2026-01-01", group_by="month").json()["rows"]
    assert [(r["month"], r["booked_ge_hours"]) for r in monthly] == [("2025-03-01", pytest.approx(8.0))]


def test_a_window_of_hours_reads_the_hourly_entries(history, api):
    # 11:00 to 12:00 of the first day: one hour of ml's 2 GE (and nothing of infra's, which ended at 11:00).
    body = _get(api(history.staff), start="2025-03-03T11:00:00Z", end="2025-03-03T12:00+00:00",
                group_by="team").json()
    assert [(r["team"], r["booked_ge_hours"]) for r in body["rows"]] == [("ml", pytest.approx(2.0))]


@pytest.mark.parametrize("group_by", ["team", "team,pool,user,month", "mode,day", "model,week"])
@pytest.mark.parametrize(("start", "end"), [
    ("2025-01-31T05:00Z", "2025-03-03T12:00Z"),  # hours, days, a month, a day, hours
    ("2025-02-01", "2025-05-01"),                # months only
    ("2025-03-03T11:00Z", "2025-03-05T00:00Z"),  # hours, then days
])
def test_any_window_sums_what_the_hourly_entries_sum(history, api, group_by, start, end):
    """However a window is cut (months, days and hours at the edges, each read from its own table), the report
    is what the entries of its hours add up to."""
    from accounting.models import LedgerEntry
    from accounting.selectors import UsageQuery, usage_rows, segments
    from accounting.api.views import _instant

    lo, hi = _instant("start", start, []), _instant("end", end, [])
    names = tuple(group_by.split(","))
    cut = list(usage_rows(UsageQuery(lo, hi, names, None)))
    only_hours = LedgerEntry.objects.filter(hour__gte=lo, hour__lt=hi).aggregate(s=Sum("booked_ge_hours"))["s"] or 0
    assert sum(row[len(names)] for row in cut) == pytest.approx(only_hours, abs=1e-3)
    body = _get(api(history.staff), start=start, end=end, group_by=group_by).json()
    assert [list(r.values()) for r in body["rows"]] == cut
    assert len(segments(UsageQuery(lo, hi, names, None))) >= 1


def test_members_see_their_teams_and_staff_every_team(history, api):
    def teams(user):
        return {r["team"] for r in _get(api(user), **WINDOW, group_by="team").json()["rows"]}

    assert teams(history.member) == {"ml"}
    assert teams(history.outsider) == {"infra"}
    assert teams(history.staff) == {"ml", "infra"}
    loner = UserFactory(username="loner")
    assert teams(loner) == set()
    assert _get(api(loner), **WINDOW).json()["totals"]["booked_ge_hours"] == 0
    assert _get(api(), **WINDOW).status_code in (401, 403)


def test_a_team_limited_token_sees_only_its_teams(history, client):
    both = UserFactory(username="both")
    MembershipFactory(user=both, team=history.team)
    MembershipFactory(user=both, team=history.other_team, role=Membership.Role.MEMBER)
    _, key = api_token_create(user=both, team_slugs=["infra"])
    rows = client.get(URL, {**WINDOW, "group_by": "team"}, HTTP_AUTHORIZATION=f"Token {key}").json()["rows"]
    assert {r["team"] for r in rows} == {"infra"}
    # A staff key limited to a team acts as a plain member of it (teams/tokens.py): staff, not in `ml`, read none.
    _, staff_key = api_token_create(user=history.staff, team_slugs=["ml"])
    rows = client.get(URL, {**WINDOW, "group_by": "team"}, HTTP_AUTHORIZATION=f"Token {staff_key}").json()["rows"]
    assert rows == []


@pytest.mark.parametrize("group_by", ["", "team,pool,model,user,mode,month", "day,pool"])
def test_csv_and_json_agree(history, api, group_by):
    client = api(history.staff)
    body = _get(client, **WINDOW, group_by=group_by).json()
    answer = _get(client, **WINDOW, group_by=group_by, format="csv")
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/csv")
    assert answer.streaming
    lines = list(csv.reader(io.StringIO(b"".join(answer.streaming_content).decode())))
    assert lines[0] == body["columns"]
    as_text = [["" if v is None else str(v) for v in (row[c] for c in body["columns"])] for row in body["rows"]]
    assert lines[1:] == as_text
    assert len(lines) > 1


@pytest.mark.parametrize(("params", "field", "rule"), [
    ({"start": "yesterday"}, "start", "invalid"),
    ({"start": "2025-03-01T10:30:00Z"}, "start", "whole_hour"),
    ({"start": "2025-03-02", "end": "2025-03-01"}, "end", "not_after_start"),
    ({"start": "2020-01-01", "end": "2025-01-01"}, "end", "max_range"),
    ({"group_by": "team,colour"}, "group_by", "invalid_choice"),
    ({"group_by": "team,team"}, "group_by", "repeated"),
    ({"group_by": "day,month"}, "group_by", "one_period"),
    ({"format": "xml"}, "format", "invalid_choice"),
    ({"tema": "ml"}, "tema", "unknown_field"),
])
def test_bad_input_is_refused_naming_field_and_rule_in_english_and_chinese(world, api, params, field, rule):
    client = api(world.member)
    english = client.get(URL, params)
    chinese = client.get(URL, params, HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert english.status_code == chinese.status_code == 400
    for answer in (english, chinese):
        assert [(e["field"], e["rule"]) for e in answer.json()["errors"]] == [(field, rule)]
    message_en, message_zh = english.json()["errors"][0]["message"], chinese.json()["errors"][0]["message"]
    assert message_en != message_zh
    assert any("\u4e00" <= ch <= "\u9fff" for ch in message_zh), message_zh
    assert not any("\u4e00" <= ch <= "\u9fff" for ch in message_en)


def test_a_csv_refusal_is_json(world, api):
    answer = api(world.member).get(URL, {"format": "csv", "start": "nope"})
    assert answer.status_code == 400
    assert answer.json()["errors"][0]["field"] == "start"
