"""benchmarks.page_cost calls every page and API call of the fleet benchmark's users as a member would, and
each answers 200 with its cost beside the /api/v1/me/ baseline."""
from __future__ import annotations

import pytest

from allocations import services
from benchmarks.page_cost import BASELINE, measure
from tests.factories import MembershipFactory, PoolFactory, QuotaFactory, TeamFactory, add_node, window

pytestmark = pytest.mark.django_db


def test_every_call_answers_and_is_measured_against_the_baseline():
    team = TeamFactory(slug="ml")
    member = MembershipFactory(team=team).user
    pool = PoolFactory(slug="a100")
    add_node(pool, "node-a", 2)
    QuotaFactory(team=team, pool=pool, max_ge=2)
    start, end = window(1, 2)
    services.reservation_create(actor=member, request=services.ReservationRequest(
        team="ml", pool="a100", gpus=1, starts_at=start, ends_at=end))

    found = measure(calls_per_url=1)

    results = found["results"]
    assert {"page /", "page pool", "page reservation", "page team", BASELINE} <= set(results)
    assert all(row["status"] == 200 for row in results.values()), results
    assert all(row["median_ms"] > 0 and row["queries"] > 0 for row in results.values())
    assert results[BASELINE]["x_baseline"] == 1.0
