"""Requests that wait: POST /api/v1/reservations/ with a duration, the pass that starts them, the answers
that offer alternatives, and every kind of bad input. Pool a100: 2 nodes x 4 GPUs; ml's quota 6, infra's 8."""
from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from allocations import queue
from allocations.models import Allocation, QueueEntry, Reservation, ReservationEvent
from tests.conftest import _require_postgresql
from tests.factories import QuotaFactory, window

URL = "/api/v1/reservations/"


def errors_of(response) -> list[tuple[str, str]]:
    return [(e["field"], e["rule"]) for e in response.json()["errors"]]


def fill(world, api, gpus=8, hours=2.0, team="infra", who=None):
    """Book `gpus` of a100 for `hours` from now (infra, whose quota is 8)."""
    start, end = window(0, hours)
    response = api(who or world.staff).post(URL, {"pool": "a100", "team": team, "gpus": gpus,
                                                  "ends_at": end.isoformat()}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def ask(world, api, gpus=2, duration="1h", who=None, team="ml", **extra):
    return api(who or world.member).post(URL, {"pool": "a100", "team": team, "gpus": gpus, "duration": duration,
                                               **extra}, format="json")


def test_a_request_that_fits_starts_at_once_without_a_queue_entry(world, api):
    response = ask(world, api, gpus=2, duration="90m")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["state"] == "scheduled" and data["queue"] is None and len(data["grants"]) == 2
    reservation = Reservation.objects.get(pk=data["id"])
    assert reservation.ends_at - reservation.starts_at == timedelta(minutes=90)
    assert not QueueEntry.objects.exists()


def test_a_request_that_does_not_fit_waits_with_a_position_and_a_promise(world, api):
    busy = fill(world, api, gpus=8, hours=2)
    response = ask(world, api, gpus=2, duration="PT1H")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["state"] == "pending" and data["grants"] == [] and data["ge"] == 0
    q = data["queue"]
    assert q["position"] == 1 and q["reason"] == "not_enough" and q["reason_text"]
    busy_end = Reservation.objects.get(pk=busy["id"]).ends_at
    assert abs(timezone.datetime.fromisoformat(q["start_by"]) - busy_end) < timedelta(seconds=1)
    assert q["likely_start"] == q["start_by"]  # no history of early releases yet
    assert q["first_start_by"] == q["start_by"] and q["duration"] == 3600
    second = ask(world, api, gpus=1, duration="30m").json()
    assert second["queue"]["position"] == 2
    listed = {r["id"]: r for r in api(world.member).get(URL).json()["results"]}
    assert listed[data["id"]]["queue"]["position"] == 1


def test_a_release_lets_the_first_waiting_request_start_and_it_is_mailed(world, api, mailoutbox,
                                                                         django_capture_on_commit_callbacks):
    busy = fill(world, api, gpus=8, hours=2)
    waiting = ask(world, api, gpus=2, duration="1h").json()
    assert api(world.staff).post(f"{URL}{busy['id']}/release/").status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        counts = queue.queue_pass(pool_id=world.pool.pk)
    assert counts == {"started": 1, "failed": 0, "waiting": 0}
    started = Reservation.objects.get(pk=waiting["id"])
    assert started.state == "scheduled" and started.gpus == 2 and started.ge == 2.0
    assert Allocation.objects.filter(reservation=started).count() == 2
    assert started.ends_at - started.starts_at == timedelta(hours=1)
    assert "after waiting" in started.reason
    detail = api(world.member).get(f"{URL}{waiting['id']}/").json()
    assert detail["queue"]["position"] is None and detail["queue"]["first_start_by"]
    assert [m.subject for m in mailoutbox] == [f"[GPU Pool] Reservation #{waiting['id']} started"]


def test_backfill_starts_a_later_request_that_fits_around_the_promise(world, api):
    world.team.quotas.update(max_ge=8)
    fill(world, api, gpus=6, hours=2)  # infra: node-a and half of node-b for 2 h
    head = ask(world, api, gpus=8, duration="1h").json()  # the whole pool: promised in 2 h
    assert head["state"] == "pending"
    # infra's 2 free GPUs for 3 h would still run when the head is promised them.
    long = ask(world, api, gpus=2, duration="3h", who=world.staff, team="infra").json()
    assert long["state"] == "pending" and long["queue"]["reason"] == "held_for_queue"
    short = ask(world, api, gpus=2, duration="1h", who=world.staff, team="infra").json()
    assert short["state"] == "scheduled"  # ends before the head's promised start
    head_after = api(world.member).get(f"{URL}{head['id']}/").json()["queue"]
    assert head_after["start_by"] == head["queue"]["start_by"]


def test_strict_order_without_backfill(world, api):
    world.pool.backfill = False
    world.pool.save()
    fill(world, api, gpus=6, hours=2)
    head = ask(world, api, gpus=4, duration="1h").json()
    later = ask(world, api, gpus=1, duration="10m").json()
    assert head["state"] == "pending" and later["state"] == "pending"
    assert later["queue"]["reason"] == "behind"


def test_a_fixed_window_may_not_take_what_the_queue_was_promised(world, api):
    fill(world, api, gpus=8, hours=2)
    waiting = ask(world, api, gpus=4, duration="2h").json()
    start_by = timezone.datetime.fromisoformat(waiting["queue"]["start_by"])
    # infra books 8 GPUs from the promised start: only 4 are not promised.
    response = api(world.staff).post(URL, {"pool": "a100", "team": "infra", "gpus": 8,
                                           "starts_at": (start_by + timedelta(minutes=5)).isoformat(),
                                           "ends_at": (start_by + timedelta(hours=1)).isoformat()}, format="json")
    assert response.status_code == 409
    assert errors_of(response) == [("gpus", "promised_to_queue")]
    ok = api(world.staff).post(URL, {"pool": "a100", "team": "infra", "gpus": 4,
                                     "starts_at": (start_by + timedelta(minutes=5)).isoformat(),
                                     "ends_at": (start_by + timedelta(hours=1)).isoformat()}, format="json")
    assert ok.status_code == 201, ok.content


def test_a_refused_window_offers_alternatives_that_book_in_one_call(world, api):
    QuotaFactory(team=world.team, pool=world.other_pool, max_ge=2)
    fill(world, api, gpus=7, hours=2)
    start, end = window(0, 1)
    response = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 2, "ends_at": end.isoformat()},
                                      format="json")
    assert response.status_code == 409
    offers = {offer["kind"]: offer for offer in response.json()["alternatives"]}
    assert set(offers) == {"earliest_window", "smaller", "other_pool"}
    assert offers["smaller"]["request"]["gpus"] == 1
    assert offers["other_pool"]["request"]["pool"] == "l4"
    for kind in ("earliest_window", "smaller", "other_pool"):
        booked = api(world.member).post(URL, offers[kind]["request"], format="json")
        assert booked.status_code == 201, (kind, booked.content)


def test_earliest_books_the_first_window_that_fits(world, api):
    busy = fill(world, api, gpus=8, hours=2)
    response = ask(world, api, gpus=2, duration="1h", starts_at="earliest")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["state"] == "scheduled" and data["queue"] is None
    assert Reservation.objects.get(pk=data["id"]).starts_at == Reservation.objects.get(pk=busy["id"]).ends_at


def test_queue_false_refuses_at_once_with_alternatives(world, api):
    fill(world, api, gpus=8, hours=2)
    response = ask(world, api, gpus=2, duration="1h", queue=False)
    assert response.status_code == 409
    assert errors_of(response) == [("gpus", "insufficient_capacity")]
    assert response.json()["alternatives"][0]["kind"] == "earliest_window"
    assert not Reservation.objects.filter(team=world.team).exists()


def test_a_cancelled_waiting_request_leaves_no_trace_in_the_plan(world, api):
    fill(world, api, gpus=8, hours=2)
    first = ask(world, api, gpus=6, duration="2h").json()
    second = ask(world, api, gpus=4, duration="1h", who=world.owner).json()
    assert second["queue"]["position"] == 2
    released = api(world.member).post(f"{URL}{first['id']}/release/")
    assert released.status_code == 200 and released.json()["state"] == "released"
    queue.queue_pass(pool_id=world.pool.pk)
    after = api(world.member).get(f"{URL}{second['id']}/").json()["queue"]
    assert after["position"] == 1
    assert after["start_by"] <= second["queue"]["start_by"]
    assert not Allocation.objects.filter(reservation_id=first["id"]).exists()


def test_a_request_that_cannot_start_by_not_after_fails_and_is_mailed(world, api, mailoutbox,
                                                                      django_capture_on_commit_callbacks):
    fill(world, api, gpus=8, hours=3)
    soon = (timezone.now() + timedelta(hours=1)).isoformat()
    with django_capture_on_commit_callbacks(execute=True):
        data = ask(world, api, gpus=2, duration="1h", not_after=soon).json()
    assert data["state"] == "failed" and "not_after" in data["reason"]
    assert mailoutbox[-1].subject == f"[GPU Pool] Reservation #{data['id']} did not start"


def test_a_promise_moved_by_lost_capacity_is_explained_and_mailed(world, api, mailoutbox,
                                                                   django_capture_on_commit_callbacks):
    fill(world, api, gpus=4, hours=2)
    waiting = ask(world, api, gpus=4, duration="1h").json()
    assert waiting["state"] == "scheduled"  # node-b was free
    head = ask(world, api, gpus=4, duration="1h").json()
    assert head["state"] == "pending"
    world.pool.gpus.filter(node__name="node-b").update(healthy=False)  # where the head was promised
    mailoutbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        queue.queue_pass(pool_id=world.pool.pk)
    assert [m.subject for m in mailoutbox] == [f"[GPU Pool] Reservation #{head['id']}: its promised start moved later"]
    entry = QueueEntry.objects.get(pk=head["id"])
    assert entry.start_by > entry.previous_start_by and "lost capacity" in entry.moved_why
    assert ReservationEvent.objects.filter(reservation_id=head["id"], from_state="pending", to_state="pending",
                                           reason__contains="Promised start moved").exists()


@pytest.mark.parametrize("extra, error", [
    ({"duration": "0m"}, ("duration", "min_value")),
    ({"duration": 0}, ("duration", "min_value")),
    ({"duration": "31d"}, ("duration", "max_value")),
    ({"duration": "soon"}, ("duration", "invalid")),
    ({"duration": "1h", "starts_at": "2030-01-01T00:00:00Z"}, ("starts_at", "exclusive_with")),
    ({"duration": "1h", "ends_at": "2030-01-01T00:00:00Z"}, ("duration", "exclusive_with")),
    ({"duration": "1h", "not_before": "2030-01-02T00:00:00Z", "not_after": "2030-01-01T00:00:00Z"},
     ("not_after", "after_not_before")),
    ({"duration": "1h", "not_after": "2020-01-01T00:00:00Z"}, ("not_after", "in_past")),
    ({"starts_at": "earliest", "ends_at": "2030-01-01T00:00:00Z"}, ("duration", "required")),
    ({"ends_at": "2030-01-01T00:00:00Z", "not_before": "2029-01-01T00:00:00Z"}, ("not_before", "needs_duration")),
    ({"starts_at": "tomorrow", "duration": "1h"}, ("starts_at", "invalid")),
])
def test_bad_timing_is_a_400_naming_the_field_and_the_rule(world, api, extra, error):
    response = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 1, **extra}, format="json")
    assert response.status_code == 400, response.content
    assert error in errors_of(response)
    assert not Reservation.objects.exists()


def test_queue_true_on_a_pool_that_does_not_queue_is_a_400(world, api):
    world.pool.queueing = False
    world.pool.save()
    response = ask(world, api, queue=True)
    assert response.status_code == 400 and errors_of(response) == [("queue", "queueing_off")]
    fill(world, api, gpus=8)
    refused = ask(world, api)  # without `queue`: refused at once, as the pool does not queue
    assert refused.status_code == 409 and "alternatives" in refused.json()


def test_what_could_never_start_is_refused_at_once(world, api):
    too_big = ask(world, api, gpus=8, duration="1h")  # ml's quota is 6 GE
    assert too_big.status_code == 409 and errors_of(too_big) == [("gpus", "quota_exceeded")]
    assert not Reservation.objects.exists()


def test_two_passes_at_once_never_start_the_same_request_twice(world, api, transactional_db):
    _require_postgresql()
    busy = fill(world, api, gpus=8, hours=2)
    waiting = [ask(world, api, gpus=2, duration="1h").json()["id"] for _ in range(3)]
    Reservation.objects.filter(pk=busy["id"]).update(state="released")
    Allocation.objects.filter(reservation_id=busy["id"]).update(ends_at=timezone.now())
    barrier, outcomes = threading.Barrier(2), []

    def run():
        try:
            barrier.wait(timeout=5)
            outcomes.append(queue.queue_pass(pool_id=world.pool.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sum(o["started"] for o in outcomes) == 3
    for rid in waiting:
        assert Allocation.objects.filter(reservation_id=rid).count() == 2
    assert Reservation.objects.filter(pk__in=waiting, state="scheduled").count() == 3


def test_the_expiry_warning_is_mailed_once_with_a_link_to_extend(world, api, mailoutbox, settings,
                                                                  django_capture_on_commit_callbacks):
    from allocations.tasks import sweep_reservations

    settings.EXPIRY_WARNING = timedelta(minutes=30)
    short = fill(world, api, gpus=2, hours=0.4)  # shorter than the warning: never warned
    long = fill(world, api, gpus=2, hours=3)
    Reservation.objects.filter(pk=long["id"]).update(starts_at=timezone.now() - timedelta(hours=3),
                                                     ends_at=timezone.now() + timedelta(minutes=20))
    with django_capture_on_commit_callbacks(execute=True):
        assert sweep_reservations()["warn_expiry"] == 1
        assert sweep_reservations()["warn_expiry"] == 0
    assert [m.subject for m in mailoutbox] == [f"[GPU Pool] Reservation #{long['id']} ends in 20 min"]
    assert f"/reservations/{long['id']}/" in mailoutbox[0].body and "extend" in mailoutbox[0].body
    assert Reservation.objects.get(pk=short["id"]).expiry_warned_at is None


def test_priority_classes_order_the_queue_and_a_request_may_only_ask_down(world, api):
    from allocations.models import PriorityClass

    world.pool.queue_ordering = "priority"
    world.pool.save()
    high = api(world.staff).post("/api/v1/priority-classes/", {"name": "high", "value": 100}, format="json")
    assert high.status_code == 201, high.content
    api(world.staff).post("/api/v1/priority-classes/", {"name": "low", "value": 10}, format="json")
    quota = api(world.staff).get("/api/v1/quotas/?team=ml").json()["results"][0]
    patched = api(world.staff).patch(f"/api/v1/quotas/{quota['id']}/", {"priority_class": "high"}, format="json")
    assert patched.status_code == 200 and patched.json()["priority_class"] == "high"
    fill(world, api, gpus=8, hours=2)
    # infra (no class: priority 0) asks first; ml at low (10) then at its quota's high (100) overtake it.
    first = ask(world, api, gpus=2, who=world.staff, team="infra").json()
    low = ask(world, api, gpus=2, priority_class="low").json()
    top = ask(world, api, gpus=2).json()
    assert top["priority_class"] == "high" and low["priority_class"] == "low"
    positions = {r: QueueEntry.objects.get(pk=r).position for r in (first["id"], low["id"], top["id"])}
    assert positions == {top["id"]: 1, low["id"]: 2, first["id"]: 3}
    # The request that was overtaken is told why its promise moved.
    moved = QueueEntry.objects.get(pk=first["id"])
    assert moved.start_by >= moved.previous_start_by
    above = ask(world, api, who=world.staff, team="infra", priority_class="low")
    assert above.status_code == 400 and errors_of(above) == [("priority_class", "above_quota_class")]
    unknown = ask(world, api, priority_class="urgent")
    assert unknown.status_code == 400 and errors_of(unknown) == [("priority_class", "does_not_exist")]
    in_use = api(world.staff).delete("/api/v1/priority-classes/high/")
    assert in_use.status_code == 409 and PriorityClass.objects.filter(name="high").exists()


def test_the_timeline_counts_what_the_queue_was_promised_as_taken(world, api):
    from urllib.parse import urlencode

    fill(world, api, gpus=8, hours=2)
    waiting = ask(world, api, gpus=4, duration="2h").json()
    start_by = timezone.datetime.fromisoformat(waiting["queue"]["start_by"])

    def slot(gpus):
        query = urlencode({"start": start_by.isoformat(), "end": (start_by + timedelta(hours=1)).isoformat(),
                           "slot": 3600, "gpus": gpus})
        answer = api(world.member).get(f"/api/v1/pools/a100/availability/?{query}")
        assert answer.status_code == 200, answer.content
        return answer.json()[0]

    assert slot(4)["free"] == 4 and slot(4)["fits"]  # 8 free from then, 4 of them promised
    assert not slot(5)["fits"]


def test_borrowed_gpus_are_taken_back_after_a_notice_for_a_request_within_quota(
        world, api, settings, mailoutbox, django_capture_on_commit_callbacks):
    from allocations import services
    from allocations.tasks import sweep_reservations

    world.pool.borrowing = True
    world.pool.save()
    # ml (quota 6) borrows 2 GE beyond its quota on idle GPUs, and asks to be requeued if reclaimed.
    old = ask(world, api, gpus=6, duration="3h").json()
    # Borrowing stops at the team's cap.
    from allocations.models import Quota
    Quota.objects.filter(team=world.team, pool=world.pool).update(max_borrow_ge=1)
    capped = ask(world, api, gpus=2, duration="1h", queue=False)
    assert capped.status_code == 409 and errors_of(capped) == [("gpus", "quota_exceeded")]
    Quota.objects.filter(team=world.team, pool=world.pool).update(max_borrow_ge=None)
    borrower = ask(world, api, gpus=2, duration="3h", requeue=True).json()
    assert borrower["state"] == "scheduled" and borrower["borrowed_ge"] == 2.0 and old["borrowed_ge"] == 0
    # The borrower ran long enough to be reclaimable.
    long_ago = timezone.now() - settings.PREEMPTION_MIN_RUNTIME - timedelta(minutes=1)
    Reservation.objects.filter(pk__in=[old["id"], borrower["id"]]).update(starts_at=long_ago)
    Allocation.objects.filter(reservation_id__in=[old["id"], borrower["id"]]).update(starts_at=long_ago)
    # infra asks for 2 within its quota: the pool is full, so the borrowed 2 are reclaimed after the notice.
    with django_capture_on_commit_callbacks(execute=True):
        waiting = ask(world, api, gpus=2, who=world.staff, team="infra").json()
    assert waiting["state"] == "pending"
    victim = Reservation.objects.get(pk=borrower["id"])
    assert victim.preempt_at is not None and "team Infra" in victim.preempt_reason
    assert Reservation.objects.get(pk=old["id"]).preempt_at is None  # within quota: never a victim
    entry = QueueEntry.objects.get(pk=waiting["id"])
    assert abs(entry.start_by - victim.preempt_at) < timedelta(seconds=1)
    assert [m.subject for m in mailoutbox] == [
        f"[GPU Pool] Reservation #{victim.pk}: borrowed GPUs taken back at {victim.preempt_at:%H:%M} UTC"]
    shown = api(world.member).get(f"{URL}{victim.pk}/").json()
    assert shown["preempt_at"] and any("Reclaim notice" in e["reason"] for e in shown["events"])

    # Before the notice runs out nothing is taken; after it, the victim goes and the waiter starts.
    with django_capture_on_commit_callbacks(execute=True):
        assert sweep_reservations()["preempt"] == 0
    later = victim.preempt_at + timedelta(seconds=1)
    assert services.reservation_preempt(reservation_id=victim.pk, now=later)
    victim.refresh_from_db()
    assert victim.state in ("released", "releasing") and "taken back" in victim.reason
    assert not Allocation.objects.filter(reservation=victim, ends_at__gt=later).exists()
    again = Reservation.objects.get(team=world.team, state="pending")
    assert QueueEntry.objects.get(pk=again.pk).queued_at <= victim.created_at + timedelta(seconds=1)
    assert again.ends_at - again.starts_at == victim.ends_at - later
    queue.queue_pass(pool_id=world.pool.pk, now=later)
    assert Reservation.objects.get(pk=waiting["id"]).state == "scheduled"


def test_fair_share_puts_the_team_that_used_less_of_its_quota_first(world, api, settings):
    from allocations.models import Quota

    settings.QUEUE_FAIRSHARE_HALF_LIFE = timedelta(hours=24)
    world.pool.queue_ordering = "fairshare"
    world.pool.save()
    Quota.objects.filter(team=world.team, pool=world.pool).update(max_ge=8)
    # ml held 6 GPUs for the last 10 hours; infra held 2.
    then = timezone.now() - timedelta(hours=10)
    for team, gpus, order in ((world.team, 6, "pk"), (world.other_team, 2, "-pk")):
        past = Reservation.objects.create(team=team, pool=world.pool, gpus=gpus, starts_at=then,
                                          ends_at=timezone.now() - timedelta(minutes=1), state="expired")
        for gpu in world.pool.gpus.order_by(order)[:gpus]:
            Allocation.objects.create(reservation=past, gpu=gpu, starts_at=then, ends_at=past.ends_at)
    shares = queue.fair_shares(world.pool.pk, timezone.now(), {world.team.pk: 8.0, world.other_team.pk: 8.0})
    assert shares[world.team.pk] > 2.5 * shares[world.other_team.pk] > 0
    fill(world, api, gpus=8, hours=2, team="infra")
    first = ask(world, api, gpus=2).json()  # ml asks first
    second = ask(world, api, gpus=2, who=world.staff, team="infra").json()
    positions = {r: QueueEntry.objects.get(pk=r).position for r in (first["id"], second["id"])}
    assert positions == {second["id"]: 1, first["id"]: 2}


def test_the_pass_keeps_the_gpus_it_promised_and_the_next_pass_holds_them(world, api):
    fill(world, api, gpus=8, hours=2)
    waiting = ask(world, api, gpus=2, duration="1h").json()
    entry = QueueEntry.objects.get(pk=waiting["id"])
    assert entry.start_by is not None and len(entry.planned_gpus) == 2
    queue.queue_pass(pool_id=world.pool.pk)
    again = QueueEntry.objects.get(pk=waiting["id"])
    assert again.start_by == entry.start_by and again.planned_gpus == entry.planned_gpus


def test_a_create_leaves_the_quota_its_teams_promises_need(world, api):
    """ml's quota is 6: 4 GPUs are promised to its waiting request from +1 h, so 3 more now for 2 h would
    hold 7 then. The new request waits instead of starting, and the promise holds."""
    fill(world, api, gpus=1, hours=3)
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    promised = ask(world, api, gpus=4, duration="1h", not_before=later).json()
    assert promised["state"] == "pending"
    start_by = QueueEntry.objects.get(pk=promised["id"]).start_by
    now = ask(world, api, gpus=3, duration="2h").json()
    assert now["state"] == "pending"
    assert QueueEntry.objects.get(pk=promised["id"]).start_by == start_by


def test_the_windows_of_every_team_read_at_once_are_each_teams_own(world, api):
    """teams_window_micros (one query for a pass's teams) reads for each team what team_windows reads for it alone,
    in the pool and across pools, sorted by start, but a window per reservation (team_windows sums those of one window
    into one); a team holding nothing gets empty columns."""
    from allocations import selectors
    from teams.models import Team

    fill(world, api, gpus=3, hours=2)  # infra, in a100
    fill(world, api, gpus=1, hours=1)
    api(world.staff).post(URL, {"pool": "l4", "team": "infra", "gpus": 1, "ends_at": window(0, 3)[1].isoformat()},
                          format="json")  # infra elsewhere
    ask(world, api, gpus=2, duration="90m")  # ml, starts now
    idle = Team.objects.create(slug="idle", name="Idle")
    start, end = timezone.now() - timedelta(hours=1), timezone.now() + timedelta(days=2)
    teams = [world.team.pk, world.other_team.pk, idle.pk]
    for pool_id in (world.pool.pk, None):
        together = selectors.teams_window_micros(teams, pool_id, start, end)
        assert set(together) == set(teams)
        for team_id in teams:
            alone = sorted((queue.micro(a), queue.micro(b), ge) for a, b, ge in
                           selectors.team_windows(team_id, pool_id, start, end))
            assert list(zip(*together[team_id], strict=True)) == alone
        assert together[idle.pk] == ([], [], [])
    assert len(together[world.other_team.pk][0]) == 3 and len(together[world.team.pk][0]) == 1
    assert selectors.teams_window_micros([], None, start, end) == {}
    # Two reservations of one window (tomorrow, on two GPUs): a row each, where team_windows has one of their sum.
    from inventory.models import Gpu

    user = Reservation.objects.filter(team=world.team).first().requested_by
    begins = timezone.now() + timedelta(days=1)
    for gpu in Gpu.objects.filter(pool=world.pool).order_by("pk")[:2]:
        twin = Reservation.objects.create(team=world.team, pool=world.pool, requested_by=user, gpus=1, ge=1.0,
                                          starts_at=begins, ends_at=begins + timedelta(hours=1), state="scheduled")
        Allocation.objects.create(reservation=twin, gpu=gpu, starts_at=begins, ends_at=begins + timedelta(hours=1),
                                  ge=1.0)
    rows = selectors.teams_window_micros([world.team.pk], world.pool.pk, start, end)[world.team.pk]
    tomorrow = [ge for at, ge in zip(rows[0], rows[2], strict=True) if at == queue.micro(begins)]
    assert tomorrow == [1.0, 1.0]
    summed = selectors.team_windows(world.team.pk, world.pool.pk, start, end)
    assert [ge for at, _, ge in summed if at == begins] == [2.0]


def test_a_pass_that_keeps_a_promise_leaves_its_reservation_row_as_the_last_pass_wrote_it(world, api):
    """The reservation's window follows the plan; a pass that plans it where the last did writes its entry, not its
    reservation's row again, and the row still reads the promise (and the reason's words)."""
    from django.test.utils import CaptureQueriesContext

    fill(world, api, gpus=8, hours=2)
    waiting = ask(world, api, gpus=2, duration="1h").json()
    entry = QueueEntry.objects.get(pk=waiting["id"])
    before = Reservation.objects.get(pk=waiting["id"])
    assert (before.starts_at, before.ends_at) == (entry.start_by, entry.start_by + timedelta(hours=1))
    with CaptureQueriesContext(connection) as queries:
        queue.queue_pass(pool_id=world.pool.pk)
    written = [q["sql"] for q in queries.captured_queries]  # (executemany's as "N times: <statement>")
    assert not [sql for sql in written if "UPDATE allocations_reservation SET starts_at" in sql]
    assert [sql for sql in written if "UPDATE allocations_queueentry SET position" in sql]
    after = Reservation.objects.get(pk=waiting["id"])
    again = QueueEntry.objects.get(pk=waiting["id"])
    assert again.start_by == entry.start_by and again.reason == entry.reason
    assert (after.starts_at, after.ends_at, after.reason) == (before.starts_at, before.ends_at, before.reason)
