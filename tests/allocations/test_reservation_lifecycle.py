"""Release, cancel, extend, and the time-driven steps (activate, expire, sweep)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from allocations import services
from allocations.apply import jobs
from allocations.models import Allocation, ApplyJob, Reservation
from allocations.tasks import sweep_reservations
from tests.factories import window

URL = "/api/v1/reservations/"
State = Reservation.State


def reserve(client, team="ml", gpus=1, hours_from_now=0.0, hours=2.0):
    start, end = window(hours_from_now, hours)
    data = {"pool": "a100", "team": team, "gpus": gpus, "ends_at": end.isoformat()}
    if hours_from_now:
        data["starts_at"] = start.isoformat()
    response = client.post(URL, data, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def run_open_jobs() -> list[str]:
    """What a worker would do with the queued apply jobs (on_commit never fires inside a test transaction)."""
    return [jobs.job_run(job_id=pk) for pk in ApplyJob.objects.filter(status=ApplyJob.Status.QUEUED)
            .order_by("pk").values_list("pk", flat=True)]


def states(reservation_id: int) -> list[tuple[str, str]]:
    return list(Reservation.objects.get(pk=reservation_id).events.values_list("from_state", "to_state"))


def test_activation_moves_a_due_reservation_to_active_through_applying(world, api):
    r = reserve(api(world.member))
    assert services.reservation_activate(reservation_id=r["id"]) is True
    assert Reservation.objects.get(pk=r["id"]).state == State.APPLYING
    job = ApplyJob.objects.get(reservation_id=r["id"])
    assert (job.action, job.status, job.backend) == ("apply", "queued", "agent")
    assert run_open_jobs() == ["succeeded"]
    assert Reservation.objects.get(pk=r["id"]).state == State.ACTIVE
    assert states(r["id"]) == [("", "scheduled"), ("scheduled", "applying"), ("applying", "active")]
    job.refresh_from_db()
    assert job.attempts == 1 and job.finished_at is not None


def test_activation_is_safe_to_run_twice(world, api):
    r = reserve(api(world.member))
    assert services.reservation_activate(reservation_id=r["id"]) is True
    assert services.reservation_activate(reservation_id=r["id"]) is False
    assert run_open_jobs() == ["succeeded"]
    assert jobs.job_run(job_id=ApplyJob.objects.get(reservation_id=r["id"]).pk) == ""  # already done: not claimed
    assert len(states(r["id"])) == 3


def test_activation_waits_for_the_start(world, api):
    r = reserve(api(world.member), hours_from_now=1)
    assert services.reservation_activate(reservation_id=r["id"]) is False
    assert Reservation.objects.get(pk=r["id"]).state == State.SCHEDULED


def test_release_of_an_active_reservation_frees_its_gpus_at_once(world, api):
    client = api(world.member)
    r = reserve(client, gpus=4)
    services.reservation_activate(reservation_id=r["id"])
    run_open_jobs()
    response = client.post(f"{URL}{r['id']}/release/")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "releasing"
    assert run_open_jobs() == ["succeeded"]
    assert run_open_jobs() == []
    reservation = Reservation.objects.get(pk=r["id"])
    assert reservation.state == State.RELEASED and reservation.ended_at is not None
    assert all(a.ends_at <= timezone.now() for a in reservation.allocations.all())
    # The quota and the GPUs are free again for the same window.
    assert client.post(URL, {"pool": "a100", "team": "ml", "gpus": 6,
                             "ends_at": r["ends_at"]}, format="json").status_code == 201


def test_cancel_of_a_future_reservation_releases_it_without_a_release_step(world, api):
    client = api(world.member)
    r = reserve(client, hours_from_now=5)
    response = client.post(f"{URL}{r['id']}/release/")
    assert response.json()["state"] == "released"
    assert "Cancelled before its start by member" in response.json()["reason"]
    allocation = Allocation.objects.get(reservation_id=r["id"])
    assert allocation.starts_at == allocation.ends_at  # an empty window: blocks nobody


def test_release_twice_is_refused_with_the_state(world, api):
    client = api(world.member)
    r = reserve(client, hours_from_now=5)
    client.post(f"{URL}{r['id']}/release/")
    response = client.post(f"{URL}{r['id']}/release/")
    assert response.status_code == 409
    assert response.json()["errors"][0] == {
        "field": "state", "rule": "not_live", "message": "A released reservation cannot be released."
    }


def test_extend_keeps_the_same_gpus_and_records_it(world, api):
    client = api(world.member)
    r = reserve(client, gpus=2, hours=2)
    new_end = timezone.now() + timedelta(hours=5)
    response = client.post(f"{URL}{r['id']}/extend/", {"ends_at": new_end.isoformat()}, format="json")
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["allocated_gpus"] and all(g["ends_at"] == data["ends_at"] for g in data["allocated_gpus"])
    assert [g["uuid"] for g in data["allocated_gpus"]] == [g["uuid"] for g in r["allocated_gpus"]]
    assert "Extended from" in data["events"][-1]["reason"]


def test_extend_is_refused_when_another_reservation_holds_the_gpus_later(world, api):
    member, outsider = api(world.member), api(world.outsider)
    r = reserve(member, gpus=4, hours=2)
    reserve(outsider, team="infra", gpus=4, hours=2)  # the other node, now
    # Later, infra takes all 8 GPUs from hour 3: the extension to hour 4 clashes.
    reserve(outsider, team="infra", gpus=8, hours_from_now=3, hours=1)
    response = member.post(f"{URL}{r['id']}/extend/",
                           {"ends_at": (timezone.now() + timedelta(hours=4)).isoformat()}, format="json")
    assert response.status_code == 409
    assert response.json()["errors"][0]["rule"] == "gpus_busy"
    assert "latest possible end" in response.json()["detail"]


def test_extend_is_refused_over_quota(world, api):
    client = api(world.member)
    reserve(api(world.outsider), team="infra", gpus=4, hours=2)  # node-a now
    r = reserve(client, gpus=4, hours=2)  # node-b now
    reserve(client, gpus=3, hours_from_now=3, hours=2)  # node-a later: no GPU clash, but 4 + 3 > 6
    response = client.post(f"{URL}{r['id']}/extend/",
                           {"ends_at": (timezone.now() + timedelta(hours=4)).isoformat()}, format="json")
    assert response.status_code == 409
    assert response.json()["errors"][0]["rule"] == "quota_exceeded"


def test_extend_must_move_the_end_later(world, api):
    client = api(world.member)
    r = reserve(client, hours=2)
    response = client.post(f"{URL}{r['id']}/extend/",
                           {"ends_at": (timezone.now() + timedelta(hours=1)).isoformat()}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"][0]["rule"] == "after_current_end"


def test_extend_rejects_a_malformed_end(world, api):
    client = api(world.member)
    r = reserve(client)
    response = client.post(f"{URL}{r['id']}/extend/", {"ends_at": "soon"}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"][0]["field"] == "ends_at"


def test_expiry_ends_an_active_reservation_at_the_end_of_its_window(world, api):
    r = reserve(api(world.member))
    services.reservation_activate(reservation_id=r["id"])
    run_open_jobs()
    later = timezone.now() + timedelta(hours=3)
    assert services.reservation_expire(reservation_id=r["id"], now=later) is True
    assert Reservation.objects.get(pk=r["id"]).state == State.RELEASING
    assert ApplyJob.objects.get(reservation_id=r["id"], action="undo").final_state == "expired"
    run_open_jobs()
    reservation = Reservation.objects.get(pk=r["id"])
    assert reservation.state == State.EXPIRED
    assert states(r["id"])[-2:] == [("active", "releasing"), ("releasing", "expired")]


def test_expiry_does_nothing_before_the_end(world, api):
    r = reserve(api(world.member))
    services.reservation_activate(reservation_id=r["id"])
    assert services.reservation_expire(reservation_id=r["id"]) is False


def test_the_sweep_activates_due_and_expires_ended_reservations(world, api):
    client = api(world.member)
    due = reserve(client)
    ended = reserve(client, hours=1)
    Reservation.objects.filter(pk=ended["id"]).update(
        starts_at=timezone.now() - timedelta(hours=2), ends_at=timezone.now() - timedelta(minutes=1)
    )
    future = reserve(client, hours_from_now=4)
    result = sweep_reservations()
    assert result == {"activate": 1, "expire": 1, "undo_again": 0, "warn_expiry": 0, "preempt": 0, "apply_jobs": 0,
                      "failover": 0}
    assert Reservation.objects.get(pk=due["id"]).state == State.APPLYING
    never_applied = Reservation.objects.get(pk=ended["id"])
    assert never_applied.state == State.FAILED and "before it could be applied" in never_applied.reason
    assert Reservation.objects.get(pk=future["id"]).state == State.SCHEDULED
    # The apply job's message is lost: once it is overdue, the sweep runs it itself.
    ApplyJob.objects.update(created_at=timezone.now() - timedelta(minutes=1))
    assert sweep_reservations() == {"activate": 0, "expire": 0, "undo_again": 0, "warn_expiry": 0, "preempt": 0,
                                    "apply_jobs": 1, "failover": 0}
    assert Reservation.objects.get(pk=due["id"]).state == State.ACTIVE


def test_the_sweep_queues_an_undo_for_a_release_whose_job_was_lost(world, api):
    client = api(world.member)
    r = reserve(client)
    services.reservation_activate(reservation_id=r["id"])
    run_open_jobs()
    client.post(f"{URL}{r['id']}/release/")
    ApplyJob.objects.filter(action="undo").delete()  # as if it never got written
    assert sweep_reservations()["undo_again"] == 1
    run_open_jobs()
    assert Reservation.objects.get(pk=r["id"]).state == State.RELEASED


def test_a_lost_undo_of_an_expiry_still_ends_expired_whatever_its_reason_says(world, api):
    client = api(world.member)
    r = reserve(client, hours=1)
    services.reservation_activate(reservation_id=r["id"])
    run_open_jobs()
    Reservation.objects.filter(pk=r["id"]).update(starts_at=timezone.now() - timedelta(hours=2),
                                                  ends_at=timezone.now() - timedelta(seconds=1))
    assert services.reservation_expire(reservation_id=r["id"]) is True
    # The undo job vanished (its cluster row was deleted, say) and someone reworded the reason.
    ApplyJob.objects.filter(action="undo").delete()
    Reservation.objects.filter(pk=r["id"]).update(reason="Ended; undo pending.")
    assert services.reservation_undo_again(reservation_id=r["id"]) is True
    run_open_jobs()
    assert Reservation.objects.get(pk=r["id"]).state == State.EXPIRED


def test_a_state_change_outside_the_table_is_refused_and_not_written(world, api):
    from allocations.transitions import TransitionNotAllowed, move

    r = reserve(api(world.member))
    reservation = Reservation.objects.get(pk=r["id"])
    with pytest.raises(TransitionNotAllowed):
        move(reservation, State.ACTIVE)  # scheduled cannot become active without being applied
    assert Reservation.objects.get(pk=r["id"]).state == State.SCHEDULED
    assert states(r["id"]) == [("", "scheduled")]
