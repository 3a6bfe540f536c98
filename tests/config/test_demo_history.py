"""The demo's past months: booked, measured and closed by the ledger's own code, statements frozen."""
from __future__ import annotations

import random
from datetime import UTC, date, datetime

import pytest
from django.db.models import Sum

from accounting.models import LedgerEntry, LedgerMonth, Price, Statement
from accounting.reports import ReportFilter, chart_table
from config.demo import load_demo
from config.demo_history import SEED, load_demo_history, plan

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 10, 15, 20, tzinfo=UTC)


def test_the_demo_has_three_closed_months_of_history_from_the_ledger():
    load_demo()
    made = load_demo_history(NOW)
    assert made["reservations"] > 20 and made["entries"] > 0
    months = [date(2025, 12, 1), date(2026, 1, 1), date(2026, 2, 1)]
    assert sorted(set(Statement.objects.values_list("month", flat=True))) == months
    # Each frozen statement is what the ledger's entries of its month add up to (no hand-written sums).
    for statement in Statement.objects.all():
        start = datetime(statement.month.year, statement.month.month, 1, tzinfo=UTC)
        following = datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)
        entries = LedgerEntry.objects.filter(team=statement.team, hour__gte=start, hour__lt=following)
        assert sum(line.booked_ge_hours for line in statement.lines.all()) == pytest.approx(
            entries.aggregate(b=Sum("booked_ge_hours"))["b"] or 0.0)
    assert LedgerMonth.objects.filter(month=date(2026, 3, 1)).exists()  # this month so far, open
    assert Price.objects.filter(gpu_model="NVIDIA H100 80GB HBM3").count() == 2  # a price change, kept
    stacked = chart_table("ge_hours_by_team", ReportFilter(date(2025, 12, 1), date(2026, 4, 1), None))
    assert {row[0] for row in stacked.rows} == {"2025-12", "2026-01", "2026-02", "2026-03"}


def test_the_history_is_the_same_for_the_same_seed():
    start, end = datetime(2025, 12, 1, tzinfo=UTC), datetime(2026, 3, 10, 12, tzinfo=UTC)
    assert plan(start, end, random.Random(SEED)) == plan(start, end, random.Random(SEED))
    assert plan(start, end, random.Random(SEED)) != plan(start, end, random.Random(SEED + 1))
