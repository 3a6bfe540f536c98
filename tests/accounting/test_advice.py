"""Right-sizing advice (accounting.advice) on hand-made telemetry whose right answer is known: whole 80 GB A100s
that peaked at 9 GiB and 15 % get a MIG profile (with its GE saving), busy ones get none, and too few
bookings give none. The API shows members their teams' advice only."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import translation

from accounting.advice import advice
from allocations.models import Allocation, Reservation
from teams.models import Membership, Team
from tests.accounting.history import H, minutes
from tests.factories import A100, MembershipFactory, QuotaFactory, UserFactory, add_shared_pool

pytestmark = pytest.mark.django_db

GIB = 1024


@pytest.fixture
def fleet():
    whole = add_shared_pool("a100-whole", "exclusive", {}, team="vision", gpus=2)
    mig = add_shared_pool("a100-mig", "mig", {"mig_layout": "all-balanced"}, team="nlp", gpus=1)
    vision = Team.objects.get(slug="vision")
    QuotaFactory(team=vision, pool=mig, max_ge=4)  # vision may use the MIG pool too
    user = UserFactory(username="ana")
    MembershipFactory(user=user, team=vision, role=Membership.Role.MEMBER)
    return whole, mig, vision, user


def _bookings(pool, team, user, count, *, util, memory_mib, hours=4, gpus=1):
    """`count` ended bookings of `gpus` whole GPUs, a day apart, each `hours` long, at `util` % and `memory_mib`."""
    cards = list(pool.gpus.order_by("index"))[:gpus]
    made = []
    for i in range(count):
        start = H + timedelta(days=i)
        end = start + timedelta(hours=hours)
        r = Reservation.objects.create(team=team, pool=pool, requested_by=user, gpus=gpus, state="released",
                                       ge=float(gpus), starts_at=start, ends_at=end, ended_at=end)
        for card in cards:
            Allocation.objects.create(reservation=r, gpu=card, starts_at=start, ends_at=end, ge=1.0)
            minutes(card, start, hours * 60, util=util, mem_used=memory_mib)
        made.append(r)
    return made


def test_a_whole_gpu_used_at_9_gib_and_15_percent_is_advised_a_mig_profile(fleet):
    whole, mig, vision, user = fleet
    _bookings(whole, vision, user, 5, util=15, memory_mib=9 * GIB)
    with translation.override("en"):
        (found,) = advice(teams=Team.objects.filter(slug="vision"))
    assert (found.pool, found.suggest_pool, found.suggest_mode) == ("a100-whole", "a100-mig", "mig")
    # 9 GiB with 20 % headroom is 10.8 GiB: over 1g.10gb's 10 GiB; 15 % x 1.2 is over 1g's 1/7 of compute.
    assert found.suggest == "1 × 2g.20gb" and found.suggest_ge == round(2 / 7, 3) == 0.286
    assert (found.reservations, found.peak_memory_mib, found.p95_util_pct, found.held_ge) == (5, 9 * GIB, 15.0, 1.0)
    # 5 bookings of 4 h over 4 days and 4 hours (span) → 20 GE-h / 4.17 d x 30 = 144 GE-h a month booked.
    assert found.ge_hours_booked_per_month == 144.0
    assert found.ge_hours_saved_per_month == round(144 * (1 - 0.286), 1)
    with translation.override("en"):  # read in the reader's language; these tests read English
        words = found.explanation
    assert "9 GiB of 80 GiB" in words and "15%" in words and "2g.20gb" in words and "The last 5 bookings" in words


def test_two_gpus_of_which_one_sat_idle_are_advised_one(fleet):
    whole, mig, vision, user = fleet
    made = _bookings(whole, vision, user, 3, util=90, memory_mib=70 * GIB, gpus=1)
    for r in made:  # each also held the second card, which ran nothing
        second = whole.gpus.get(index=1)
        Allocation.objects.create(reservation=r, gpu=second, starts_at=r.starts_at, ends_at=r.ends_at, ge=1.0)
        minutes(second, r.starts_at, 240, util=0, mem_used=3)
        Reservation.objects.filter(pk=r.pk).update(gpus=2, ge=2.0)
    with translation.override("en"):
        (found,) = advice(teams=Team.objects.filter(slug="vision"))
    assert (found.suggest, found.suggest_ge, found.busy_gpus, found.held) == ("1 whole GPU(s)", 1.0, 1, "2 whole GPU(s)")


def test_busy_bookings_get_no_advice(fleet):
    whole, mig, vision, user = fleet
    _bookings(whole, vision, user, 5, util=85, memory_mib=60 * GIB)
    assert advice(teams=Team.objects.filter(slug="vision")) == []


def test_too_few_bookings_or_no_telemetry_give_no_advice(fleet):
    whole, mig, vision, user = fleet
    _bookings(whole, vision, user, 2, util=15, memory_mib=9 * GIB)
    assert advice(teams=Team.objects.filter(slug="vision")) == []
    for i in range(3):  # three more, without telemetry
        start = H + timedelta(days=10 + i)
        r = Reservation.objects.create(team=vision, pool=whole, requested_by=user, gpus=1, state="released", ge=1.0,
                                       starts_at=start, ends_at=start + timedelta(hours=4),
                                       ended_at=start + timedelta(hours=4))
        Allocation.objects.create(reservation=r, gpu=whole.gpus.first(), starts_at=r.starts_at, ends_at=r.ends_at)
    assert advice(teams=Team.objects.filter(slug="vision")) == []


def test_the_api_shows_members_their_teams_and_staff_all(fleet, api):
    whole, mig, vision, user = fleet
    _bookings(whole, vision, user, 4, util=10, memory_mib=5 * GIB)
    mine = api(user).get("/api/v1/advice/", {"team": "vision", "user": "ana"})
    assert mine.status_code == 200, mine.content
    (item,) = mine.json()["advice"]
    assert item["suggest"] == "1 × 1g.10gb" and item["user"] == "ana" and item["explanation"]
    assert api(user).get("/api/v1/advice/", {"team": "nlp"}).status_code == 404
    assert api(user).get("/api/v1/advice/", {"tema": "vision"}).json()["errors"][0]["rule"] == "unknown_field"
    assert len(api(UserFactory(username="boss", is_staff=True)).get("/api/v1/advice/").json()["advice"]) == 1
    assert api(UserFactory(username="stranger")).get("/api/v1/advice/").json()["advice"] == []


def test_the_team_page_and_a_bookings_page_show_the_advice(fleet, client):
    whole, mig, vision, user = fleet
    made = _bookings(whole, vision, user, 3, util=15, memory_mib=9 * GIB)
    client.force_login(user)
    team_page = client.get("/teams/vision/").content.decode()
    section = team_page.split('id="advice"')[1].split("</section>")[0]
    assert "2g.20gb" in section and "a100-mig" in section
    assert "2g.20gb" in client.get(f"/reservations/{made[0].pk}/").content.decode()


def test_the_rollups_are_read_in_one_query_however_many_grants(fleet):
    """The team and reservation pages ask for advice on every visit: reading each grant's rollups on its own
    cost two queries a grant (119 on the team page at fleet size)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    whole, _mig, vision, user = fleet
    _bookings(whole, vision, user, 9, util=15, memory_mib=9 * GIB, gpus=2)  # 18 grants
    with CaptureQueriesContext(connection) as captured:
        (found,) = advice(teams=Team.objects.filter(slug="vision"))
    assert found.reservations == 9
    assert len([q for q in captured.captured_queries if "monitoring_minuterollup" in q["sql"]]) == 1
