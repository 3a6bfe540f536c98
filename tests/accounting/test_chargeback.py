"""Chargeback: which price is in force, the cost in GET /api/v1/usage/, the prices API's rules, and the
monthly statements (figures = ledger sums; a closed month frozen against later prices and ledger rewrites)."""
from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.db.models import Sum

from accounting.ledger import ledger_close, ledger_hour_close
from accounting.models import LedgerEntry, Price, Statement
from accounting.selectors import team_statement
from accounting.services import statements_close_due
from tests.accounting.history import grant, minutes

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)
H100 = "NVIDIA H100 80GB HBM3"  # every GPU of the world fixture
# The last day of March 2025: closing it, and the first hours of April, makes March final in a few runs.
T = datetime(2025, 3, 31, 10, tzinfo=UTC)
APRIL = datetime(2025, 4, 1, 6, tzinfo=UTC)  # after March's last hour and its late-telemetry grace


def _price(model, amount, currency, valid_from, pool=None) -> Price:
    # Straight into the table: a price for 2025 is "in force" long ago, which the API would refuse to add now.
    return Price.objects.create(gpu_model=model, pool=pool, price_per_ge_hour=Decimal(amount), currency=currency,
                                valid_from=valid_from)


@pytest.fixture
def priced(world):
    """ml: 2 GE for 3 h on a100 from T (busy its first hour) at 2 CNY, then 0.5 GE for 2 h on 1 April at 3 CNY
    (the model's new price from the 1st); infra: 1 GE for 1 h on l4, where l4 overrides the model at 1 USD."""
    a100 = list(world.pool.gpus.order_by("pk"))
    l4 = world.other_pool.gpus.order_by("pk").first()
    _price(H100, "2", "CNY", date(2025, 1, 1))
    _price(H100, "3", "CNY", date(2025, 4, 1))
    _price(H100, "1", "USD", date(2025, 1, 1), pool=world.other_pool)
    grant(world.team, world.pool, a100[0], T, T + 3 * HOUR, ge=2.0, user=world.member)
    minutes(a100[0], T, 60, util=80)
    grant(world.team, world.pool, a100[1], APRIL, APRIL + 2 * HOUR, ge=0.5, milli=500, mode="time_slicing",
          user=world.owner, share=(0, 500))
    grant(world.other_team, world.other_pool, l4, T, T + HOUR, ge=1.0, user=world.outsider)
    ledger_close(now=APRIL + timedelta(hours=6))
    return world


def _usage(client, **params) -> dict:
    response = client.get("/api/v1/usage/", params)
    assert response.status_code == 200, response.content
    return response.json()


def test_cost_is_booked_hours_at_the_price_in_force(priced, api):
    body = _usage(api(priced.staff), start="2025-03-01", end="2025-05-01", group_by="team,pool,month")
    got = {(r["team"], r["pool"], r["month"]): (r["cost"], r["currency"]) for r in body["rows"]}
    assert got == {("ml", "a100", "2025-03-01"): (12.0, "CNY"),   # 2 GE x 3 h x 2 CNY
                   ("ml", "a100", "2025-04-01"): (3.0, "CNY"),    # 0.5 GE x 2 h x 3 CNY, the April price
                   ("infra", "l4", "2025-03-01"): (1.0, "USD")}   # l4's own price overrides the model's
    # Across both currencies nothing is added up: the cost is empty and the currencies are named.
    assert (body["totals"]["cost"], body["totals"]["currency"]) == (None, "CNY,USD")
    by_model = _usage(api(priced.staff), start="2025-03-01", end="2025-05-01", group_by="model")["rows"]
    assert [(r["cost"], r["currency"]) for r in by_model] == [(None, "CNY,USD")]
    # Unpriced models cost nothing (empty), and a member sees only their team's cost.
    mine = _usage(api(priced.member), start="2025-03-01", end="2025-05-01")["totals"]
    assert (mine["cost"], mine["currency"]) == (15.0, "CNY")


@pytest.mark.parametrize(("start", "end"), [("2025-01-01", "2026-01-01"), ("2025-03-31T11:00Z", "2025-04-01T07:00Z")])
def test_a_price_from_mid_month_splits_the_month_sums(priced, api, start, end):
    """A price starting on the 15th: the months read from the month sums would mix both prices, so the report
    reads that month from the days; whether months, days or hours are read, the cost is the same."""
    _price(H100, "10", "CNY", date(2025, 3, 31))  # from T's day on, inside March
    rows = _usage(api(priced.staff), start=start, end=end, group_by="team")["rows"]
    hours = LedgerEntry.objects.filter(team=priced.team, hour__gte=max(T, datetime.fromisoformat(start.replace(
        "Z", "+00:00")).replace(tzinfo=UTC)))
    expected = sum(e.booked_ge_hours * (10 if e.hour < APRIL else 3) for e in hours
                   if e.hour < datetime.fromisoformat(end.replace("Z", "+00:00")).replace(tzinfo=UTC))
    ml = next(r for r in rows if r["team"] == "ml")
    assert (ml["cost"], ml["currency"]) == (pytest.approx(expected, abs=0.01), "CNY")


def test_cost_in_csv_is_the_json(priced, api):
    params = {"start": "2025-03-01", "end": "2025-05-01", "group_by": "team,model,day"}
    body = _usage(api(priced.staff), **params)
    response = api(priced.staff).get("/api/v1/usage/", {**params, "format": "csv"})
    lines = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert lines[0] == body["columns"] and lines[0][-2:] == ["cost", "currency"]
    assert lines[1:] == [["" if v is None else str(v) for v in r.values()] for r in body["rows"]]


# --- the prices API ------------------------------------------------------------------------

PRICES = "/api/v1/prices/"


def test_staff_write_prices_members_read_them(world, api):
    new = {"gpu_model": H100, "price_per_ge_hour": 4.5, "currency": "CNY", "valid_from": "2099-01-01"}
    assert api(world.member).post(PRICES, new, format="json").status_code == 403
    created = api(world.staff).post(PRICES, {**new, "pool": "a100"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["pool"] == "a100" and created.json()["created_by"] == "staff"
    assert [p["price_per_ge_hour"] for p in api(world.member).get(PRICES).json()["results"]] == [4.5]
    assert api(None).get(PRICES).status_code in (401, 403)
    # A price not yet in force may be corrected; a price in force is history.
    url = f"{PRICES}{created.json()['id']}/"
    assert api(world.staff).patch(url, {"price_per_ge_hour": 5}, format="json").json()["price_per_ge_hour"] == 5
    Price.objects.filter(pk=created.json()["id"]).update(valid_from=date(2020, 1, 1))
    refused = api(world.staff).patch(url, {"price_per_ge_hour": 6}, format="json")
    assert refused.status_code == 409 and refused.json()["errors"][0]["rule"] == "in_force"
    # ... and a new price may not start inside that history.
    back = api(world.staff).post(PRICES, {**new, "pool": "a100", "valid_from": "2019-06-01"}, format="json")
    assert back.status_code == 409 and back.json()["errors"][0]["rule"] == "before_price_in_force"
    assert Price.objects.get(pk=created.json()["id"]).price_per_ge_hour == 5
    # Each change of a price is in the audit log, with who made it.
    from tests.audit.test_audit_log import entries_for

    audited = entries_for(Price, created.json()["id"])
    assert [e.action for e in audited][:2] == [0, 1] and audited[0].actor == world.staff  # created, then changed


@pytest.mark.parametrize(("change", "field", "rule"), [
    ({"price_per_ge_hour": -1}, "price_per_ge_hour", "min_value"),
    ({"currency": "XYZ"}, "currency", "invalid_choice"),
    ({"currency": "cny"}, "currency", "invalid_choice"),
    ({"gpu_model": "NVIDIA Z9"}, "gpu_model", "does_not_exist"),
    ({"pool": "nowhere"}, "pool", "does_not_exist"),
    ({"valid_from": "soon"}, "valid_from", "invalid"),
    ({"discount": 5}, "discount", "unknown_field"),
])
def test_bad_prices_are_refused_naming_field_and_rule(world, api, change, field, rule):
    body = {"gpu_model": H100, "price_per_ge_hour": "1.5", "currency": "USD", "valid_from": "2099-01-01", **change}
    response = api(world.staff).post(PRICES, body, format="json")
    assert response.status_code == 400, response.content
    assert {(e["field"], e["rule"]) for e in response.json()["errors"]} >= {(field, rule)}
    assert not Price.objects.exists()


# --- statements ------------------------------------------------------------------------------

def test_statement_figures_are_the_ledger_sums(priced):
    statement = team_statement(priced.team, date(2025, 3, 1))
    assert statement.status == "provisional"  # not closed yet (no closing run since March became final)
    entries = LedgerEntry.objects.filter(team=priced.team, hour__lt=APRIL.replace(hour=0))
    sums = entries.aggregate(b=Sum("booked_ge_hours"), u=Sum("used_ge_hours"), g=Sum("gpu_hours"))
    [line] = statement.lines
    assert (line["pool"], line["gpu_model"], line["mode"]) == ("a100", H100, "exclusive")
    assert line["booked_ge_hours"] == pytest.approx(sums["b"]) == pytest.approx(6.0)
    assert line["used_ge_hours"] == pytest.approx(sums["u"]) == pytest.approx(2.0)
    assert line["idle_ge_hours"] == pytest.approx(4.0)
    assert line["gpu_hours"] == pytest.approx(sums["g"]) == pytest.approx(3.0)
    assert (statement.totals["cost"], statement.totals["currency"]) == (12.0, "CNY")


def test_a_closed_month_is_frozen(priced, api):
    assert statements_close_due(now=APRIL + timedelta(hours=6)) == 2  # March, for both teams; April is open
    assert statements_close_due(now=APRIL + timedelta(hours=7)) == 0  # once
    url = "/api/v1/teams/ml/statements/2025-03/"
    before = api(priced.member).get(url).json()
    assert before["status"] == "closed" and before["totals"]["cost"] == 12.0
    assert api(priced.member).get("/api/v1/teams/ml/statements/2025-04/").json()["status"] == "provisional"
    # A price change for March, and a late rewrite of March's ledger (a grant found late, its hour re-closed).
    _price(H100, "50", "CNY", date(2025, 3, 15))
    a100 = list(priced.pool.gpus.order_by("pk"))
    grant(priced.team, priced.pool, a100[2], T + 5 * HOUR, T + 6 * HOUR, ge=4.0)
    ledger_hour_close(hour=T + 5 * HOUR, final=True, now=APRIL + timedelta(days=1))
    live = _usage(api(priced.member), start="2025-03-01", end="2025-04-01")["totals"]
    assert live["booked_ge_hours"] == pytest.approx(10.0) and live["cost"] == pytest.approx(500.0)
    assert api(priced.member).get(url).json() == before
    assert Statement.objects.filter(month=date(2025, 3, 1)).count() == 2


def test_statement_visibility_and_month_format(priced, api):
    url = "/api/v1/teams/ml/statements/2025-03/"
    assert api(priced.owner).get(url).status_code == 200
    assert api(priced.staff).get(url).status_code == 200
    assert api(priced.outsider).get(url).status_code == 404  # not their team: it does not exist for them
    assert api(None).get(url).status_code in (401, 403)
    bad = api(priced.member).get("/api/v1/teams/ml/statements/2025-13/")
    assert bad.status_code == 400 and bad.json()["errors"][0] == {
        "field": "month", "rule": "invalid", "message": bad.json()["errors"][0]["message"]}
