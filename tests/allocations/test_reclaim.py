"""Taking GPUs back (allocations/reclaim.py): which bookings may be taken and which are, the notice, the
release when it runs out, requeue, the budget given back, and reclaiming ahead of a future fixed window.
Pool a100: 2 nodes x 4 GPUs; ml's quota 6, infra's 8 (tests/conftest.py: world)."""
from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import IntegrityError, transaction
from django.test import Client
from django.utils import timezone, translation

from allocations import queue, quota_math, reclaim, selectors, services
from allocations.failover import node_failover
from allocations.models import Allocation, PriorityClass, QueueEntry, Quota, Reservation, ReservationEvent
from inventory.models import Node
from tests.factories import QuotaFactory, TeamFactory, add_node

URL = "/api/v1/reservations/"


def book(world, api, team="infra", gpus=1, hours=3.0, **extra):
    """Staff books `gpus` of a100 for `team`, from now (or `starts_at`) until `hours` from now."""
    body = {"pool": "a100", "team": team, "gpus": gpus,
            "ends_at": (timezone.now() + timedelta(hours=hours)).isoformat(), **extra}
    response = api(world.staff).post(URL, body, format="json")
    assert response.status_code == 201, response.content
    return Reservation.objects.get(pk=response.json()["id"])


def started_ago(reservation, minutes):
    """As if it had started `minutes` ago (its grants too)."""
    at = timezone.now() - timedelta(minutes=minutes)
    Reservation.objects.filter(pk=reservation.pk).update(starts_at=at)
    Allocation.objects.filter(reservation=reservation).update(starts_at=at)
    reservation.refresh_from_db()
    return reservation


def nodes_of(reservation):
    return set(Allocation.objects.filter(reservation=reservation).values_list("gpu__node__name", flat=True))


def gpus_of(reservation):
    return set(Allocation.objects.filter(reservation=reservation).values_list("gpu_id", flat=True))


@pytest.fixture
def classes(world):
    """low (10, preemptible), high (100, preemptible), batch (5, not preemptible); ml's quota grants high,
    infra's low."""
    made = {name: PriorityClass.objects.create(name=name, value=value, preemptible=preemptible)
            for name, value, preemptible in (("low", 10, True), ("high", 100, True), ("batch", 5, False))}
    Quota.objects.filter(team=world.team, pool=world.pool).update(priority_class=made["high"])
    Quota.objects.filter(team=world.other_team, pool=world.pool).update(priority_class=made["low"])
    return made


# --- choosing victims (pure) ------------------------------------------------------------------------

def _fits_when_free(sizes, need):
    return lambda ids: sum(sizes[i] for i in ids) >= need


def _ids(victims):
    return [v.pk for v in victims]


def test_one_victim_is_taken_when_one_alone_frees_the_room_rather_than_two_younger_ones_that_do_together():
    found = [SimpleNamespace(pk=k) for k in (1, 2, 3)]  # in the order they are tried (youngest first)
    # 1 and 2 free one GPU each, 3 frees two: the request needs two. The fewest: 3 alone.
    assert _ids(reclaim.choose(found, _fits_when_free({1: 1, 2: 1, 3: 2}, 2))) == [3]
    # 2 and 3 each free the two: the first of them (the youngest).
    assert _ids(reclaim.choose(found, _fits_when_free({1: 1, 2: 2, 3: 2}, 2))) == [2]


def test_when_no_one_victim_frees_the_room_the_first_that_do_are_taken_less_those_not_needed():
    found = [SimpleNamespace(pk=k) for k in (1, 2, 3)]
    # Needs 3: 1+2+3 free 4; without 2 (1+3) still 3, without 1 (2+3) not enough: 1 and 3.
    assert _ids(reclaim.choose(found, _fits_when_free({1: 1, 2: 1, 3: 2}, 3))) == [1, 3]
    assert reclaim.choose(found, _fits_when_free({1: 1, 2: 1, 3: 1}, 4)) == []
    assert reclaim.choose([], _fits_when_free({}, 1)) == []


# --- who may be taken ------------------------------------------------------------------------------

def test_borrowed_bookings_and_preemptible_ones_of_a_lower_priority_of_other_teams_may_be_taken(world, settings):
    settings.PREEMPTION_NOTICE = settings.PREEMPTION_MIN_RUNTIME = timedelta(minutes=10)
    vision = TeamFactory(slug="vision", name="Vision")
    QuotaFactory(team=vision, pool=world.pool, max_ge=8)
    now = timezone.now()

    def made(team, started, *, priority=10, preemptible=True, borrowed=0.0, state="active", ends=3.0, **extra):
        return Reservation.objects.create(
            team=team, pool=world.pool, gpus=1, state=state, priority=priority, preemptible=preemptible,
            borrowed_ge=borrowed, starts_at=now - timedelta(minutes=started), ends_at=now + timedelta(hours=ends),
            **extra)

    infra, ml = world.other_team, world.team
    borrowed_high = made(infra, 60, priority=100, preemptible=False, borrowed=1.0)  # borrowed: any priority
    low_old = made(infra, 180)
    low_young = made(vision, 25)
    made(infra, 5)  # ran 5 min: younger than the minimum runtime
    made(vision, 120, priority=50)  # preemptible, but of the waiter's own priority
    made(vision, 120, priority=100)  # preemptible, of a higher priority
    made(vision, 120, priority=5, preemptible=False)  # lower, but its class is not preemptible
    made(ml, 120)  # the waiter's own team
    made(infra, 120, preempt_at=now + timedelta(minutes=5))  # already under a notice
    made(infra, 120, ends=0.1)  # ends before the notice would
    future = made(infra, -60, state="scheduled")  # starts in an hour
    made(infra, 120, state="pending")

    at = reclaim.earliest_takeback(now)
    taken = reclaim.for_request(reclaim.candidates(world.pool.pk, at), team_id=ml.pk, priority=50)
    # Borrowed first, then the lowest priority, then the youngest.
    assert _ids(taken) == [borrowed_high.pk, low_young.pk, low_old.pk]
    # Ahead of a window that opens in 2 h, what will have run the minimum when its notice begins may be
    # told now: the booking that ran 5 min, and the one that starts in an hour, too.
    window = reclaim.for_request(reclaim.candidates(world.pool.pk, now + timedelta(hours=2)), team_id=ml.pk,
                                 priority=50)
    assert future.pk in _ids(window) and len(window) == 5


# --- preemption for a waiting request -----------------------------------------------------------------

def test_a_waiting_request_of_a_higher_class_preempts_the_youngest_lower_preemptible_booking_that_frees_the_room(
        world, api, classes, settings, mailoutbox, django_capture_on_commit_callbacks):
    from allocations.tasks import sweep_reservations

    Quota.objects.filter(team=world.other_team, pool=world.pool).update(ge_hours_per_month=10_000)
    # infra (class low, preemptible) fills the pool: a whole node, then 2 + 1 + 1 on the other.
    whole = started_ago(book(world, api, gpus=4), 180)
    pair = started_ago(book(world, api, gpus=2, requeue=True), 60)
    singles = [started_ago(book(world, api, gpus=1), minutes) for minutes in (20, 25)]
    assert len(nodes_of(whole)) == 1
    assert nodes_of(pair) == nodes_of(singles[0]) == nodes_of(singles[1]) != nodes_of(whole)
    assert pair.preemptible and pair.priority == 10
    month = quota_math.months_between(timezone.now(), timezone.now())[0]
    booked_before = selectors.month_ge_hours(world.other_team.pk, world.pool.pk, month)
    old_end = pair.ends_at

    # ml (class high, 100) asks for 2 within its quota: the pool is full. The two single GPUs are the
    # youngest and together free the room, but the pair alone does (the fewest); the whole node does
    # too, but it is older.
    with django_capture_on_commit_callbacks(execute=True):
        asked = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 2, "duration": "1h"},
                                       format="json")
    assert asked.status_code == 201 and asked.json()["state"] == "pending"
    waiting = asked.json()["id"]
    noticed = {r.pk: r.preempt_at for r in Reservation.objects.filter(team=world.other_team)}
    pair.refresh_from_db()
    assert [pk for pk, at in noticed.items() if at is not None] == [pair.pk]
    at = pair.preempt_at
    assert abs(at - (timezone.now() + settings.PREEMPTION_NOTICE)) < timedelta(seconds=30)
    # Why and for whom (the team, never the person), on the booking and in its history; one mail.
    assert "priority class low (10)" in pair.preempt_reason and "team ML" in pair.preempt_reason
    assert "higher priority 100" in pair.preempt_reason and "member" not in pair.preempt_reason
    assert ReservationEvent.objects.filter(reservation=pair, reason__startswith="Reclaim notice").count() == 1
    assert [m.subject for m in mailoutbox] == [
        f"[GPU Pool] Reservation #{pair.pk}: preempted at {at:%H:%M} UTC for a higher priority"]
    shown = api(world.staff).get(f"{URL}{pair.pk}/").json()
    assert shown["preempt_at"] and shown["preemptible"] and shown["priority_class"] == "low"
    page = Client()
    page.force_login(world.outsider)  # infra's manager
    html = page.get(f"/reservations/{pair.pk}/").content.decode()
    assert 'id="reclaim-notice"' in html and "It is preempted: its GPUs are taken back" in html
    assert 'id="preemptible"' in html and "team ML" in html
    # Its grants end at the notice's end already: the waiter is promised them then, and the GE-hours it
    # loses are no longer booked against infra's budget.
    assert set(Allocation.objects.filter(reservation=pair).values_list("ends_at", flat=True)) == {at}
    entry = QueueEntry.objects.get(pk=waiting)
    assert abs(entry.start_by - at) < timedelta(seconds=1) and set(entry.planned_gpus) == gpus_of(pair)
    lost = 2 * quota_math.overlap_hours((at, old_end), month)
    after = selectors.month_ge_hours(world.other_team.pk, world.pool.pk, month)
    assert after == pytest.approx(booked_before - lost, abs=1e-3) and lost > 2
    # It cannot be extended meanwhile, and a second pass gives no second notice.
    extend = api(world.staff).post(f"{URL}{pair.pk}/extend/", {"ends_at": (old_end + timedelta(hours=1)).isoformat()},
                                   format="json")
    assert extend.status_code == 409 and extend.json()["errors"][0]["rule"] == "being_reclaimed"
    with django_capture_on_commit_callbacks(execute=True):
        queue.queue_pass(pool_id=world.pool.pk)
        assert sweep_reservations()["preempt"] == 0  # nothing is taken before the notice runs out
    assert len(mailoutbox) == 1

    # When it runs out: released through the undo path, the waiter placed on its GPUs, then it is
    # requeued at its old place (fcfs: ahead of the waiter) for the rest of its time, class kept.
    later = at + timedelta(seconds=1)
    assert services.reservation_preempt(reservation_id=pair.pk, now=later) == 1
    pair.refresh_from_db()
    assert pair.state in ("released", "releasing") and "GPUs taken back after the notice" in pair.reason
    placed = Reservation.objects.get(pk=waiting)
    assert placed.state == "scheduled" and gpus_of(placed) == gpus_of(pair)
    again = Reservation.objects.get(team=world.other_team, state="pending")
    assert again.priority_class == "low" and again.priority == 10 and again.preemptible and again.requeue
    assert again.ends_at - again.starts_at == old_end - later
    assert QueueEntry.objects.get(pk=again.pk).queued_at <= pair.created_at + timedelta(seconds=1)
    # The next pass does not hand the GPUs back to it: it waits, first in the queue.
    queue.queue_pass(pool_id=world.pool.pk, now=later + timedelta(seconds=1))
    assert Reservation.objects.get(pk=again.pk).state == "pending"
    assert QueueEntry.objects.get(pk=again.pk).position == 1
    assert Reservation.objects.get(pk=waiting).state == "scheduled"


def test_equal_priority_and_non_preemptible_bookings_are_never_preempted(world, api, classes,
                                                                         django_capture_on_commit_callbacks):
    Quota.objects.filter(team=world.other_team, pool=world.pool).update(priority_class=classes["high"])
    # infra fills the pool at high (preemptible, but equal to ml's) and at batch (lower, not preemptible).
    equal = [started_ago(book(world, api, gpus=4), 60)]
    lower = [started_ago(book(world, api, gpus=4, priority_class="batch"), 60)]
    with django_capture_on_commit_callbacks(execute=True):
        asked = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 2, "duration": "1h"},
                                       format="json")
    assert asked.json()["state"] == "pending"
    assert not Reservation.objects.filter(pk__in=[r.pk for r in equal + lower], preempt_at__isnull=False).exists()


def test_a_booking_younger_than_the_minimum_runtime_is_not_preempted_until_it_has_run_it(world, api, classes,
                                                                                        settings):
    settings.PREEMPTION_MIN_RUNTIME = timedelta(minutes=30)
    old = started_ago(book(world, api, gpus=4), 120)
    young = started_ago(book(world, api, gpus=4), 5)
    # ml asks for the whole pool: both would have to go, and one is too young.
    asked = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 6, "duration": "1h"}, format="json")
    assert asked.json()["state"] == "pending"
    assert Reservation.objects.filter(pk__in=[old.pk, young.pk], preempt_at__isnull=False).count() == 0
    # 25 minutes on it has run the minimum: both get their notice.
    later = timezone.now() + timedelta(minutes=26)
    queue.queue_pass(pool_id=world.pool.pk, now=later)
    assert Reservation.objects.filter(pk__in=[old.pk, young.pk], preempt_at__isnull=False).count() == 2
    assert abs(Reservation.objects.get(pk=young.pk).preempt_at - (later + settings.PREEMPTION_NOTICE)) \
        < timedelta(seconds=1)


# --- ahead of a future fixed window --------------------------------------------------------------------

def _borrow(world, api, gpus, hours=6.0):
    """ml holds 6 (its quota) and borrows `gpus` more on idle GPUs of the lending pool."""
    world.pool.borrowing = True
    world.pool.save()
    within = book(world, api, team="ml", gpus=6, hours=hours)
    borrowed = book(world, api, team="ml", gpus=gpus, hours=hours, requeue=True)
    assert borrowed.borrowed_ge == gpus and within.borrowed_ge == 0
    return within, borrowed


def test_a_future_window_within_quota_gives_borrowers_notice_ending_when_it_opens(
        world, api, settings, mailoutbox, django_capture_on_commit_callbacks):
    within, borrowed = _borrow(world, api, 2)
    start = timezone.now() + timedelta(hours=2)
    end = start + timedelta(hours=1)
    with django_capture_on_commit_callbacks(execute=True):
        response = api(world.outsider).post(URL, {"pool": "a100", "team": "infra", "gpus": 2,
                                                  "starts_at": start.isoformat(), "ends_at": end.isoformat()},
                                            format="json")
    assert response.status_code == 201, response.content
    window = Reservation.objects.get(pk=response.json()["id"])
    borrowed.refresh_from_db()
    # The notice runs from now (longer than PREEMPTION_NOTICE) to the window's start, on the GPUs it gets.
    assert borrowed.preempt_at == window.starts_at == start
    assert gpus_of(window) == gpus_of(borrowed)
    assert set(Allocation.objects.filter(reservation=borrowed).values_list("ends_at", flat=True)) == {start}
    assert Reservation.objects.get(pk=within.pk).preempt_at is None  # within quota: never taken
    assert "a booking of team Infra within its quota from" in borrowed.preempt_reason
    assert [m.subject for m in mailoutbox] == [
        f"[GPU Pool] Reservation #{borrowed.pk}: borrowed GPUs taken back at {start:%H:%M} UTC"]
    # The database still refuses two grants of one GPU at once: the victim's row cannot grow back.
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.filter(reservation=borrowed).update(ends_at=borrowed.ends_at)
    # At the window's start the borrower goes (and waits again for the rest of its time), the window starts.
    assert services.reservation_preempt(reservation_id=borrowed.pk, now=start) == 1
    assert services.reservation_activate(reservation_id=window.pk, now=start)
    borrowed.refresh_from_db()
    assert borrowed.state == "released"
    again = Reservation.objects.get(team=world.team, state="pending")
    assert again.ends_at - again.starts_at == borrowed.ends_at - start


def test_a_window_that_opens_sooner_than_a_full_notice_takes_nothing_and_is_refused(world, api, settings):
    _within, borrowed = _borrow(world, api, 2)
    start = timezone.now() + settings.PREEMPTION_NOTICE - timedelta(minutes=1)
    response = api(world.outsider).post(URL, {"pool": "a100", "team": "infra", "gpus": 2,
                                              "starts_at": start.isoformat(),
                                              "ends_at": (start + timedelta(hours=1)).isoformat()}, format="json")
    assert response.status_code == 409 and response.json()["errors"][0]["rule"] == "insufficient_capacity"
    assert Reservation.objects.get(pk=borrowed.pk).preempt_at is None


def test_a_future_window_over_its_quota_takes_nothing(world, api):
    _within, borrowed = _borrow(world, api, 2)
    Quota.objects.filter(team=world.other_team, pool=world.pool).update(max_ge=1)
    start = timezone.now() + timedelta(hours=2)
    response = api(world.outsider).post(URL, {"pool": "a100", "team": "infra", "gpus": 2,
                                              "starts_at": start.isoformat(),
                                              "ends_at": (start + timedelta(hours=1)).isoformat()}, format="json")
    assert response.status_code == 409
    assert Reservation.objects.get(pk=borrowed.pk).preempt_at is None


def test_a_future_window_of_a_higher_class_preempts_a_lower_preemptible_booking_but_not_its_own_team(
        world, api, classes, mailoutbox, django_capture_on_commit_callbacks):
    own = started_ago(book(world, api, team="ml", gpus=4, hours=6, priority_class="low"), 60)
    theirs = started_ago(book(world, api, gpus=4, hours=6), 60)
    start = timezone.now() + timedelta(hours=1)
    with django_capture_on_commit_callbacks(execute=True):
        response = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 2,
                                                "starts_at": start.isoformat(),
                                                "ends_at": (start + timedelta(hours=1)).isoformat()}, format="json")
    assert response.status_code == 201, response.content
    assert Reservation.objects.get(pk=theirs.pk).preempt_at == start
    assert Reservation.objects.get(pk=own.pk).preempt_at is None
    assert [m.subject for m in mailoutbox] == [
        f"[GPU Pool] Reservation #{theirs.pk}: preempted at {start:%H:%M} UTC for a higher priority"]


def test_priority_classes_say_whether_they_are_preemptible_and_a_booking_keeps_it(world, api, classes):
    listed = {c["name"]: c["preemptible"] for c in api(world.member).get("/api/v1/priority-classes/").json()["results"]}
    assert listed == {"low": True, "high": True, "batch": False}
    made = api(world.staff).post("/api/v1/priority-classes/", {"name": "spot", "value": 1, "preemptible": True},
                                 format="json")
    assert made.status_code == 201 and made.json()["preemptible"] is True
    low = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 1, "priority_class": "low",
                                       "ends_at": (timezone.now() + timedelta(hours=1)).isoformat()}, format="json")
    batch = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 1, "priority_class": "batch",
                                         "ends_at": (timezone.now() + timedelta(hours=1)).isoformat()}, format="json")
    assert low.json()["preemptible"] is True and batch.json()["preemptible"] is False
    PriorityClass.objects.filter(name="low").update(preemptible=False)  # a later change binds new bookings only
    assert Reservation.objects.get(pk=low.json()["id"]).preemptible


def test_two_windows_reclaiming_the_same_borrowed_gpus_at_once_never_both_get_them(world, api, transactional_db):
    import threading

    from django.db import connection

    from tests.conftest import _require_postgresql

    _require_postgresql()
    _within, borrowed = _borrow(world, api, 2)
    vision = TeamFactory(slug="vision", name="Vision")
    QuotaFactory(team=vision, pool=world.pool, max_ge=8)
    start = timezone.now() + timedelta(hours=2)
    body = {"pool": "a100", "gpus": 2, "starts_at": start.isoformat(),
            "ends_at": (start + timedelta(hours=1)).isoformat()}
    barrier, answers = threading.Barrier(2), []

    def create(team):
        try:
            barrier.wait(timeout=5)
            answers.append(api(world.staff).post(URL, {**body, "team": team}, format="json").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=create, args=(team,)) for team in ("infra", "vision")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(answers) == [201, 409]
    assert ReservationEvent.objects.filter(reservation=borrowed, reason__startswith="Reclaim notice").count() == 1
    won = Reservation.objects.get(team__slug__in=["infra", "vision"], state="scheduled")
    assert gpus_of(won) == gpus_of(borrowed)


# --- calling a notice off -----------------------------------------------------------------------------------

WITHDRAWN = "GPUs no longer taken back"


@pytest.fixture
def kicked(monkeypatch):
    """The passes kicks send to the broker (pool ids), recorded instead of sent: the test runs them."""
    sent = []
    monkeypatch.setattr(queue.dispatch, "enqueue", lambda name, *args, **kw: sent.append(args[0])
                        if name == "allocations.tasks.run_queue" else None)
    return sent


def _preempted_for_a_waiter(world, api, capture):
    """infra (class low) fills the pool: a node for 3 h (started 3 h ago), 2 and 2 on the other (an hour
    ago; the second pair of class batch, not preemptible). ml (class high) asks for 2: the younger low booking
    (the first pair) gets the notice. Returns (victim, its other-node neighbour, the waiter's id)."""
    started_ago(book(world, api, gpus=4), 180)
    victim = started_ago(book(world, api, gpus=2), 60)
    neighbour = started_ago(book(world, api, gpus=2, priority_class="batch"), 60)
    assert nodes_of(victim) == nodes_of(neighbour)
    with capture(execute=True):
        asked = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 2, "duration": "1h"},
                                       format="json")
    assert asked.json()["state"] == "pending"
    victim.refresh_from_db()
    assert victim.preempt_at is not None and victim.preempted_for_id == asked.json()["id"]
    return victim, neighbour, asked.json()["id"]


def _withdrawn_events(reservation):
    return list(ReservationEvent.objects.filter(reservation=reservation, reason__startswith="Reclaim notice withdrawn")
                .values_list("reason", flat=True))


def test_a_notice_is_withdrawn_when_its_waiter_is_cancelled_and_the_booking_keeps_its_gpus(
        world, api, classes, mailoutbox, kicked, django_capture_on_commit_callbacks):
    from allocations.tasks import run_queue

    Quota.objects.filter(team=world.other_team, pool=world.pool).update(ge_hours_per_month=10_000)
    victim, _neighbour, waiter = _preempted_for_a_waiter(world, api, django_capture_on_commit_callbacks)
    at, end = victim.preempt_at, victim.ends_at
    assert set(Allocation.objects.filter(reservation=victim).values_list("ends_at", flat=True)) == {at}
    month = quota_math.months_between(timezone.now(), timezone.now())[0]
    under_notice = selectors.month_ge_hours(world.other_team.pk, world.pool.pk, month)
    mailoutbox.clear()
    kicked.clear()

    # ml withdraws its request before the notice runs out: the cancel kicks a pass, though nobody waits now.
    with django_capture_on_commit_callbacks(execute=True):
        assert api(world.member).post(f"{URL}{waiter}/release/").status_code == 200
    assert kicked == [world.pool.pk]
    with django_capture_on_commit_callbacks(execute=True):
        assert run_queue(world.pool.pk)["called_off"] == 1
    victim.refresh_from_db()
    assert victim.preempt_at is None and victim.preempt_reason == "" and victim.preempted_for_id is None
    # Its grants end at its own end again, and their GE-hours count against infra's budget again.
    assert set(Allocation.objects.filter(reservation=victim).values_list("ends_at", flat=True)) == {end}
    given_back = 2 * quota_math.overlap_hours((at, end), month)
    assert selectors.month_ge_hours(world.other_team.pk, world.pool.pk, month) == pytest.approx(
        under_notice + given_back, abs=1e-3) and given_back > 2
    # Why, in its history (the team, never the person), and one mail to its holders.
    [why] = _withdrawn_events(victim)
    assert "team ML" in why and "has ended without needing them" in why and "member" not in why
    assert [m.subject for m in mailoutbox] == [f"[GPU Pool] Reservation #{victim.pk}: {WITHDRAWN}"]
    # The API and its page no longer show a notice; its history shows the withdrawal.
    assert api(world.staff).get(f"{URL}{victim.pk}/").json()["preempt_at"] is None
    page = Client()
    page.force_login(world.outsider)  # infra's manager
    html = page.get(f"/reservations/{victim.pk}/").content.decode()
    assert 'id="reclaim-notice"' not in html and "Reclaim notice withdrawn" in html
    # Another pass, and the sweep after the old notice's end, change nothing: it is not taken back.
    with django_capture_on_commit_callbacks(execute=True):
        assert "called_off" not in queue.queue_pass(pool_id=world.pool.pk)
        assert services.reservation_preempt(reservation_id=victim.pk, now=at + timedelta(seconds=1)) == 0
    victim.refresh_from_db()
    assert victim.is_live and len(mailoutbox) == 1 and len(_withdrawn_events(victim)) == 1
    # And it may be extended again.
    extend = api(world.staff).post(f"{URL}{victim.pk}/extend/", {"ends_at": (end + timedelta(hours=1)).isoformat()},
                                   format="json")
    assert extend.status_code == 200, extend.content


def test_a_notice_whose_request_is_not_known_stands_as_one_given_before_notices_named_it(
        world, api, classes, mailoutbox, django_capture_on_commit_callbacks):
    # A notice given before migration 0019 has no request: the first pass after the upgrade must not
    # hand its GPUs back while the request it was given for may still be waiting for them.
    victim, _neighbour, waiter = _preempted_for_a_waiter(world, api, django_capture_on_commit_callbacks)
    Reservation.objects.filter(pk=victim.pk).update(preempted_for=None)
    with django_capture_on_commit_callbacks(execute=True):
        assert api(world.member).post(f"{URL}{waiter}/release/").status_code == 200
        assert "called_off" not in queue.queue_pass(pool_id=world.pool.pk)
    victim.refresh_from_db()
    assert victim.preempt_at is not None and not _withdrawn_events(victim)
    assert set(Allocation.objects.filter(reservation=victim).values_list("ends_at", flat=True)) == {victim.preempt_at}


def test_a_notice_is_withdrawn_when_its_waiter_starts_on_other_gpus(world, api, classes, mailoutbox,
                                                                     django_capture_on_commit_callbacks):
    victim, neighbour, waiter = _preempted_for_a_waiter(world, api, django_capture_on_commit_callbacks)
    end = victim.ends_at
    # The batch pair beside it is released early: the waiter starts there at once.
    with django_capture_on_commit_callbacks(execute=True):
        assert api(world.staff).post(f"{URL}{neighbour.pk}/release/").status_code == 200
        counts = queue.queue_pass(pool_id=world.pool.pk)
    assert counts["started"] == 1 and counts["called_off"] == 1
    placed = Reservation.objects.get(pk=waiter)
    assert placed.state == "scheduled" and gpus_of(placed) == gpus_of(neighbour)
    assert "placed on other GPUs" in _withdrawn_once(victim, end, mailoutbox)


def test_a_withdrawal_is_its_own_event_for_notification_channels_and_old_subscriptions_keep_hearing_it(
        world, api, classes, django_capture_on_commit_callbacks):
    import importlib

    from django.apps import apps

    from teams.models import Delivery, NotificationChannel
    from teams.services import channel_create

    def channel(name, events):
        return channel_create(actor=world.outsider, team=world.other_team, name=name, kind="email",
                              email=f"{name}@example.com", events=events)

    notices_only = channel("notices", ["reservation.preempted"])
    withdrawals_only = channel("withdrawals", ["reservation.notice_withdrawn"])
    victim, _neighbour, waiter = _preempted_for_a_waiter(world, api, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        assert api(world.member).post(f"{URL}{waiter}/release/").status_code == 200
        assert queue.queue_pass(pool_id=world.pool.pk)["called_off"] == 1
    told = sorted(Delivery.objects.values_list("channel__name", "event"))
    assert told == [("notices", "reservation.preempted"), ("withdrawals", "reservation.notice_withdrawn")]
    # A channel that listed the notice's event when withdrawals were sent under it is given the new one.
    migration = importlib.import_module("teams.migrations.0009_notice_withdrawn_event")
    migration.forwards(apps, None)
    assert NotificationChannel.objects.get(pk=notices_only.pk).events == [
        "reservation.preempted", "reservation.notice_withdrawn"]
    assert NotificationChannel.objects.get(pk=withdrawals_only.pk).events == ["reservation.notice_withdrawn"]

def _window_cancelled_and_the_notice_stands(world, api, borrowed, window, start, mailoutbox, capture) -> None:
    with capture(execute=True):
        assert api(world.outsider).post(f"{URL}{window['id']}/release/").status_code == 200
        queue.queue_pass(pool_id=world.pool.pk)
    borrowed.refresh_from_db()
    assert borrowed.preempt_at == start and not _withdrawn_events(borrowed)
    assert set(Allocation.objects.filter(reservation=borrowed).values_list("ends_at", flat=True)) == {start}
    assert not [m for m in mailoutbox if WITHDRAWN in m.subject]


def _withdrawn_once(reservation, end, mailoutbox) -> str:
    """Its notice is gone, its grants run to `end` again and its holders were mailed once: the reason recorded."""
    reservation.refresh_from_db()
    assert reservation.preempt_at is None
    assert set(Allocation.objects.filter(reservation=reservation).values_list("ends_at", flat=True)) == {end}
    [why] = _withdrawn_events(reservation)
    assert [m.subject for m in mailoutbox if WITHDRAWN in m.subject] == [
        f"[GPU Pool] Reservation #{reservation.pk}: {WITHDRAWN}"]
    return why


def _window_ahead_of_borrowed(world, api):
    """ml borrows 2 GPUs; infra books a window of 2 in two hours that needs them: (the borrower, read after the
    window's notice, the window as the API gave it, its start)."""
    _within, borrowed = _borrow(world, api, 2)
    start = timezone.now() + timedelta(hours=2)
    window = api(world.outsider).post(URL, {"pool": "a100", "team": "infra", "gpus": 2, "starts_at": start.isoformat(),
                                            "ends_at": (start + timedelta(hours=1)).isoformat()}, format="json").json()
    borrowed.refresh_from_db()
    return borrowed, window, start


def test_a_notice_given_ahead_of_a_window_is_withdrawn_when_the_window_is_cancelled(
        world, api, mailoutbox, kicked, django_capture_on_commit_callbacks):
    from allocations.tasks import run_queue

    borrowed, window, start = _window_ahead_of_borrowed(world, api)
    end = borrowed.ends_at
    assert borrowed.preempt_at == start and borrowed.preempted_for_id == window["id"]
    kicked.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert api(world.outsider).post(f"{URL}{window['id']}/release/").status_code == 200
    assert kicked == [world.pool.pk]  # nobody waits in the pool: the notice alone is worth a pass
    with django_capture_on_commit_callbacks(execute=True):
        run_queue(world.pool.pk)
    assert "team Infra" in _withdrawn_once(borrowed, end, mailoutbox)


def test_a_notice_stands_when_another_booking_took_the_gpus_it_frees_and_the_booking_is_taken_back(
        world, api, mailoutbox, django_capture_on_commit_callbacks):
    borrowed, window, start = _window_ahead_of_borrowed(world, api)
    # Vision books the borrower's GPUs after the window: the only ones free then.
    vision = TeamFactory(slug="vision", name="Vision")
    QuotaFactory(team=vision, pool=world.pool, max_ge=8)
    later = book(world, api, team="vision", gpus=2, hours=5, starts_at=(start + timedelta(hours=2)).isoformat())
    borrowed.refresh_from_db()
    assert gpus_of(later) == gpus_of(borrowed)
    _window_cancelled_and_the_notice_stands(world, api, borrowed, window, start, mailoutbox,
                                            django_capture_on_commit_callbacks)
    # When it runs out, it is taken back as before.
    assert services.reservation_preempt(reservation_id=borrowed.pk, now=start) == 1
    assert Reservation.objects.get(pk=borrowed.pk).state == "released"


def test_a_notice_stands_when_the_gpus_back_would_take_the_team_over_its_monthly_budget(
        world, api, mailoutbox, django_capture_on_commit_callbacks):
    borrowed, window, start = _window_ahead_of_borrowed(world, api)
    # Meanwhile ml's budget is all used (as if it had booked more, counting on losing these GPUs).
    month = quota_math.months_between(start, start)[0]
    used = selectors.month_ge_hours(world.team.pk, world.pool.pk, month)
    Quota.objects.filter(team=world.team, pool=world.pool).update(ge_hours_per_month=int(used))
    _window_cancelled_and_the_notice_stands(world, api, borrowed, window, start, mailoutbox,
                                            django_capture_on_commit_callbacks)


def test_a_notice_stands_for_another_waiter_promised_the_gpus_that_could_have_taken_them_itself(
        world, api, classes, mailoutbox, django_capture_on_commit_callbacks):
    # infra: a node and a pair at class batch (not preemptible), a pair at low (the only possible victim).
    started_ago(book(world, api, gpus=4, priority_class="batch"), 180)
    victim = started_ago(book(world, api, gpus=2), 60)
    started_ago(book(world, api, gpus=2, priority_class="batch"), 60)
    asked = [api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 2, "duration": "1h"},
                                    format="json").json()["id"] for _ in range(2)]
    victim.refresh_from_db()
    assert victim.preempted_for_id == asked[0]
    # The first waiter goes; the pass promises the second the victim's GPUs from the notice's end, and ml's
    # class could have taken them for it: the notice stands, and is carried out when it runs out.
    with django_capture_on_commit_callbacks(execute=True):
        assert api(world.member).post(f"{URL}{asked[0]}/release/").status_code == 200
        assert "called_off" not in queue.queue_pass(pool_id=world.pool.pk)
    entry = QueueEntry.objects.get(pk=asked[1])
    assert entry.start_by == Reservation.objects.get(pk=victim.pk).preempt_at
    assert set(entry.planned_gpus) == gpus_of(victim)
    assert not _withdrawn_events(victim) and not [m for m in mailoutbox if WITHDRAWN in m.subject]
    assert services.reservation_preempt(reservation_id=victim.pk, now=entry.start_by) == 1
    assert gpus_of(Reservation.objects.get(pk=asked[1], state="scheduled")) == gpus_of(victim)


def test_a_notice_kept_for_another_waiter_names_that_waiters_team_in_its_reason(
        world, api, classes, mailoutbox, django_capture_on_commit_callbacks):
    vision = TeamFactory(slug="vision", name="Vision")
    QuotaFactory(team=vision, pool=world.pool, max_ge=8, priority_class=classes["high"])
    # infra: a node and a pair at class batch (not preemptible), a pair at low (the only possible victim).
    started_ago(book(world, api, gpus=4, priority_class="batch"), 180)
    victim = started_ago(book(world, api, gpus=2), 60)
    started_ago(book(world, api, gpus=2, priority_class="batch"), 60)
    first = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 2, "duration": "1h"},
                                   format="json").json()["id"]
    second = api(world.staff).post(URL, {"pool": "a100", "team": "vision", "gpus": 2, "duration": "1h"},
                                   format="json").json()["id"]
    victim.refresh_from_db()
    assert victim.preempted_for_id == first and "needed by team ML" in victim.preempt_reason
    at = victim.preempt_at
    mailoutbox.clear()
    # ML's request goes; the pass promises Vision's the victim's GPUs from the notice's end, and Vision could
    # have taken them itself: the notice stands, for Vision's request now, and says so.
    with django_capture_on_commit_callbacks(execute=True):
        assert api(world.member).post(f"{URL}{first}/release/").status_code == 200
        assert "called_off" not in queue.queue_pass(pool_id=world.pool.pk)
    victim.refresh_from_db()
    assert victim.preempted_for_id == second and victim.preempt_at == at
    assert "needed by team Vision" in victim.preempt_reason and "ML" not in victim.preempt_reason
    [event] = ReservationEvent.objects.filter(reservation=victim, reason__startswith="Reclaim notice kept")
    assert "team ML that it was given for has ended without needing them" in event.reason
    assert "needed by team Vision" in event.reason and "member" not in event.reason and "staff" not in event.reason
    with translation.override("zh-hans"):
        assert "团队 Vision" in Reservation.objects.get(pk=victim.pk).preempt_reason
        assert "团队 Vision" in ReservationEvent.objects.get(pk=event.pk).reason
    page = Client()
    page.force_login(world.outsider)  # infra's manager
    html = page.get(f"/reservations/{victim.pk}/").content.decode()
    assert 'id="reclaim-notice"' in html and "team Vision" in html
    # The time it is taken back did not change: no mail; and the next pass changes nothing more.
    with django_capture_on_commit_callbacks(execute=True):
        queue.queue_pass(pool_id=world.pool.pk)
    assert ReservationEvent.objects.filter(reservation=victim, reason__startswith="Reclaim notice kept").count() == 1
    assert not mailoutbox

def test_two_callers_at_once_withdraw_a_notice_once(world, api, classes, mailoutbox, monkeypatch, transactional_db):
    from contextlib import nullcontext

    from tests.races import race_past_the_check

    # Transactional: each commit runs its callbacks itself.
    victim, _neighbour, waiter = _preempted_for_a_waiter(world, api, lambda execute: nullcontext())
    # The waiter goes without a pass after it; then two (a pass's and the sweep's, say) find the notice at once.
    Reservation.objects.filter(pk=waiter).update(state="failed")
    mailoutbox.clear()
    outcomes = race_past_the_check(monkeypatch, Reservation, lambda: transaction.atomic(reclaim.call_off_needless)(
        world.pool.pk, timezone.now()))
    assert outcomes == ["written", "written"]
    victim.refresh_from_db()
    assert victim.preempt_at is None and len(_withdrawn_events(victim)) == 1
    assert [m.subject for m in mailoutbox] == [f"[GPU Pool] Reservation #{victim.pk}: {WITHDRAWN}"]


# --- a victim whose node fails while under notice ---------------------------------------------------------

def _victim_on_a_node_that_dies(world, api, capture):
    """infra holds node-a (class batch) and node-b (class low, `requeue`); ml (class high) asks for 4: the low
    booking gets the notice. node-x (4 GPUs, cordoned until now) comes back, then node-b dies and the failover
    moves the victim to node-x. Returns (the victim, its old GPUs, the waiter's id)."""
    Quota.objects.filter(team=world.other_team, pool=world.pool).update(ge_hours_per_month=10_000)
    spare = add_node(world.pool, "node-x", 4)
    Node.objects.filter(pk=spare.pk).update(schedulable=False)
    started_ago(book(world, api, gpus=4, priority_class="batch"), 180)
    victim = started_ago(book(world, api, gpus=4, requeue=True), 60)
    assert nodes_of(victim) == {"node-b"}
    with capture(execute=True):
        asked = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 4, "duration": "1h"},
                                       format="json")
    waiter = asked.json()["id"]
    victim.refresh_from_db()
    assert asked.json()["state"] == "pending" and victim.preempted_for_id == waiter
    old_gpus = gpus_of(victim)
    Node.objects.filter(pk=spare.pk).update(schedulable=True)
    Node.objects.filter(name="node-b").update(healthy=False)
    with capture(execute=True):
        assert node_failover(node_id=Node.objects.get(name="node-b").pk)["moved"] == [victim.pk]
    return victim, old_gpus, waiter


def _held_after(reservation, at):
    """Its grants that hold a GPU after `at`: {gpu id: end}."""
    return dict(Allocation.objects.filter(reservation=reservation, ends_at__gt=at).values_list("gpu_id", "ends_at"))


def test_a_victim_that_fails_over_holds_its_new_gpus_only_until_its_notice_ends_and_the_waiter_gets_them_then(
        world, api, classes, mailoutbox, django_capture_on_commit_callbacks):
    victim, old_gpus, waiter = _victim_on_a_node_that_dies(world, api, django_capture_on_commit_callbacks)
    at, end = victim.preempt_at, victim.ends_at
    now = timezone.now()
    # The new grants, on node-x, end when the notice does, as the old ones had been cut to: the notice stands,
    # and its holders are told they hold them only until then.
    new = _held_after(victim, now)
    assert set(new.values()) == {at} and not set(new) & old_gpus and nodes_of(victim) == {"node-b", "node-x"}
    victim.refresh_from_db()
    assert victim.preempt_at == at and victim.preempted_for_id == waiter
    assert "when its reclaim notice takes them back" in ReservationEvent.objects.filter(
        reservation=victim, reason__startswith="Moved from node-b").get().reason
    # The waiter is promised them from the notice's end (node-b is dead), and starts on them then; the victim
    # waits again for the rest of its time.
    queue.queue_pass(pool_id=world.pool.pk)
    entry = QueueEntry.objects.get(pk=waiter)
    assert entry.start_by == at and set(entry.planned_gpus) == set(new)
    assert services.reservation_preempt(reservation_id=victim.pk, now=at) == 1
    placed = Reservation.objects.get(pk=waiter)
    assert placed.state == "scheduled" and placed.starts_at == at and gpus_of(placed) == set(new)
    again = Reservation.objects.get(team=world.other_team, state="pending")
    assert again.requeue and again.ends_at - again.starts_at == end - at


def test_a_victim_that_asked_requeue_waits_again_for_the_rest_when_its_node_dies_and_nothing_fits(
        world, api, classes, django_capture_on_commit_callbacks):
    Quota.objects.filter(team=world.other_team, pool=world.pool).update(ge_hours_per_month=10_000)
    started_ago(book(world, api, gpus=4, priority_class="batch"), 180)
    victim = started_ago(book(world, api, gpus=4, requeue=True), 60)
    with django_capture_on_commit_callbacks(execute=True):
        asked = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 4, "duration": "1h"},
                                       format="json")
    victim.refresh_from_db()
    assert victim.preempted_for_id == asked.json()["id"]
    # node-b dies before the notice ends, and no healthy GPUs are free: it fails, and its notice's promise
    # stands: it waits in the queue again, at its old place, for the rest of its time.
    Node.objects.filter(name="node-b").update(healthy=False)
    with django_capture_on_commit_callbacks(execute=True):
        assert node_failover(node_id=Node.objects.get(name="node-b").pk)["failed"] == [victim.pk]
    assert Reservation.objects.get(pk=victim.pk).state == "failed"
    again = Reservation.objects.get(team=world.other_team, state="pending")
    assert again.requeue and again.priority_class == "low" and again.gpus == 4
    assert abs((again.ends_at - again.starts_at) - (victim.ends_at - timezone.now())) < timedelta(seconds=30)
    assert "whose node node-b failed while it was under a reclaim notice" in again.events.get().reason

def test_a_notice_withdrawn_after_a_failover_gives_the_new_gpus_their_old_end_back(
        world, api, classes, mailoutbox, django_capture_on_commit_callbacks):
    victim, old_gpus, waiter = _victim_on_a_node_that_dies(world, api, django_capture_on_commit_callbacks)
    at, end = victim.preempt_at, victim.ends_at
    moved_at = timezone.now()
    new = set(_held_after(victim, moved_at))
    assert set(_held_after(victim, moved_at).values()) == {at}
    with django_capture_on_commit_callbacks(execute=True):
        assert api(world.member).post(f"{URL}{waiter}/release/").status_code == 200
        assert queue.queue_pass(pool_id=world.pool.pk)["called_off"] == 1
    # The GPUs on node-x run to its own end again (nothing holds them from the notice's end); those it left on
    # the dead node stay ended.
    assert _held_after(victim, moved_at) == {gpu: end for gpu in new}
    assert not Allocation.objects.filter(reservation=victim, gpu_id__in=old_gpus, ends_at__gt=moved_at).exists()
    [why] = _withdrawn_events(victim)
    assert "has ended without needing them" in why
    victim.refresh_from_db()
    assert victim.preempt_at is None


def test_a_notice_stands_after_a_failover_when_another_booking_took_the_new_gpus_from_its_end(
        world, api, classes, mailoutbox, django_capture_on_commit_callbacks):
    victim, _old_gpus, waiter = _victim_on_a_node_that_dies(world, api, django_capture_on_commit_callbacks)
    at = victim.preempt_at
    new = set(_held_after(victim, timezone.now()))
    # The waiter goes; before a pass runs, Vision books node-x from the notice's end (free then).
    assert api(world.member).post(f"{URL}{waiter}/release/").status_code == 200
    vision = TeamFactory(slug="vision", name="Vision")
    QuotaFactory(team=vision, pool=world.pool, max_ge=8)
    later = book(world, api, team="vision", gpus=4, hours=2, starts_at=at.isoformat())
    assert gpus_of(later) == new
    with django_capture_on_commit_callbacks(execute=True):
        assert "called_off" not in queue.queue_pass(pool_id=world.pool.pk)
    # Its new GPUs cannot run to its old end again: the notice stands, and is carried out when it runs out.
    victim.refresh_from_db()
    assert victim.preempt_at == at and not _withdrawn_events(victim)
    assert set(_held_after(victim, timezone.now()).values()) == {at}
    assert services.reservation_preempt(reservation_id=victim.pk, now=at) == 1

def test_a_notice_is_withdrawn_when_its_waiter_starts_on_the_gpus_its_victim_failed_over_from(
        world, api, classes, mailoutbox, django_capture_on_commit_callbacks):
    victim, old_gpus, waiter = _victim_on_a_node_that_dies(world, api, django_capture_on_commit_callbacks)
    end = victim.ends_at
    # node-b comes back before the notice ends: the waiter starts there at once, and needs nothing the victim
    # holds now (its GPUs on node-x).
    Node.objects.filter(name="node-b").update(healthy=True)
    with django_capture_on_commit_callbacks(execute=True):
        counts = queue.queue_pass(pool_id=world.pool.pk)
    placed = Reservation.objects.get(pk=waiter)
    assert counts["started"] == 1 and placed.state == "scheduled" and gpus_of(placed) == old_gpus
    assert counts["called_off"] == 1
    assert "placed on other GPUs" in _withdrawn_events(victim)[0]
    assert set(_held_after(victim, timezone.now()).values()) == {end}
    assert Reservation.objects.get(pk=victim.pk).preempt_at is None
