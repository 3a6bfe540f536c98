"""POST /api/v1/reservations/ with `gpu_models`: a request for "H100 only" in a pool of two models is booked,
queued, offered alternatives, charged and failed over on H100s alone; bad input is a 400 naming the rule.

Pool `mixed`: node-h1 and node-h2 with 2 H100s each (weight 2.0), node-x with 4 A100s (weight 1.0). Team ml
(member) has a quota of 12 GE in it, team infra (outsider) 12 GE."""
from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from allocations import queue
from allocations.failover import node_failover
from allocations.models import Allocation, PriorityClass, QueueEntry, Quota, Reservation
from inventory.models import GpuModel, Node
from tests.allocations.test_reclaim import started_ago
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, PoolFactory, QuotaFactory, window

URL = "/api/v1/reservations/"
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture
def mixed(world):
    pool = PoolFactory(slug="mixed", name="Mixed")
    cluster = ClusterFactory(slug="lab")
    for name, model, count in (("node-h1", H100, 2), ("node-h2", H100, 2), ("node-x", A100, 4)):
        node = NodeFactory(cluster=cluster, name=name)
        for index in range(count):
            GpuFactory(node=node, pool=pool, index=index, model_name=model, memory_mib=81920)
    GpuModel.objects.create(name=H100, weight=2)
    GpuModel.objects.create(name=A100, weight=1)
    QuotaFactory(team=world.team, pool=pool, max_ge=12)
    QuotaFactory(team=world.other_team, pool=pool, max_ge=12)
    return pool


def book(api, user, *, team="ml", gpus=1, hours=2.0, hours_from_now=0.0, **extra):
    start, end = window(hours_from_now, hours)
    body = {"pool": "mixed", "team": team, "gpus": gpus, "ends_at": end.isoformat(), **extra}
    if hours_from_now:
        body["starts_at"] = start.isoformat()
    return api(user).post(URL, body, format="json")


def ask(api, user, *, team="ml", gpus=1, duration="1h", **extra):
    return api(user).post(URL, {"pool": "mixed", "team": team, "gpus": gpus, "duration": duration, **extra},
                          format="json")


def models_held(reservation_id: int) -> set[str]:
    return set(Allocation.objects.filter(reservation_id=reservation_id, ends_at__gt=timezone.now())
               .values_list("gpu__model_name", flat=True))


def errors_of(response) -> list[tuple[str, str]]:
    return [(e["field"], e["rule"]) for e in response.json()["errors"]]


def test_pinned_requests_land_only_on_their_model_and_are_charged_its_weight(world, api, mixed):
    h100 = book(api, world.member, gpus=2, gpu_models=[H100])
    assert h100.status_code == 201, h100.content
    data = h100.json()
    assert data["gpu_models"] == [H100]
    assert {g["model_name"] for g in data["grants"]} == {H100} and data["ge"] == pytest.approx(4.0)
    a100 = book(api, world.member, gpus=2, gpu_models=[A100]).json()
    assert {g["model_name"] for g in a100["grants"]} == {A100} and a100["ge"] == pytest.approx(2.0)
    # The answer, the list and the detail show the restriction; an unpinned one shows none.
    assert api(world.member).get(f"{URL}{data['id']}/").json()["gpu_models"] == [H100]
    listed = {r["id"]: r for r in api(world.member).get(URL).json()["results"]}
    assert listed[data["id"]]["gpu_models"] == [H100]
    assert book(api, world.member).json()["gpu_models"] == []
    assert Reservation.objects.get(pk=data["id"]).gpu_models == [H100]


def test_two_models_named_are_kept_sorted_and_either_is_taken(world, api, mixed):
    response = book(api, world.member, gpus=4, gpu_models=[H100, A100])
    assert response.status_code == 201, response.content
    assert response.json()["gpu_models"] == [A100, H100]
    assert models_held(response.json()["id"]) <= {A100, H100}


def test_a_fixed_window_with_no_room_on_its_model_is_refused_with_alternatives_that_keep_the_pin(world, api, mixed):
    busy = book(api, world.outsider, team="infra", gpus=4, hours=1, gpu_models=[H100])  # every H100, 1 h
    assert busy.status_code == 201 and models_held(busy.json()["id"]) == {H100}
    response = book(api, world.member, gpus=2, hours=2, gpu_models=[H100])
    assert response.status_code == 409
    assert errors_of(response) == [("gpus", "no_gpu_model")]
    assert f"Counting only GPUs of the models it accepts ({H100})" in response.json()["detail"]
    offers = {offer["kind"]: offer for offer in response.json()["alternatives"]}
    earliest = offers["earliest_window"]["request"]
    assert earliest["gpu_models"] == [H100]
    busy_end = Reservation.objects.get(pk=busy.json()["id"]).ends_at
    # The A100s are free now: the earliest window is when the H100s are, not now.
    assert abs(datetime.fromisoformat(earliest["starts_at"]) - busy_end) < timedelta(seconds=1)
    assert "smaller" not in offers  # no H100 at all is free in the window
    taken = api(world.member).post(URL, earliest, format="json")
    assert taken.status_code == 201, taken.content
    assert models_held(taken.json()["id"]) == {H100}


def test_the_smaller_offer_counts_only_the_models_accepted(world, api, mixed):
    assert book(api, world.outsider, team="infra", gpus=3, gpu_models=[H100]).status_code == 201
    response = book(api, world.member, gpus=2, gpu_models=[H100])  # one H100 left, four A100s
    assert response.status_code == 409
    offers = {offer["kind"]: offer for offer in response.json()["alternatives"]}
    assert offers["smaller"]["request"]["gpus"] == 1 and offers["smaller"]["request"]["gpu_models"] == [H100]


def test_a_pinned_request_waits_for_its_model_and_starts_only_when_one_of_its_gpus_is_released(world, api, mixed):
    h100s = book(api, world.outsider, team="infra", gpus=4, hours=3, gpu_models=[H100]).json()
    a100s = book(api, world.outsider, team="infra", gpus=4, hours=1, gpu_models=[A100]).json()
    waiting = ask(api, world.member, gpus=2, duration="1h", gpu_models=[H100])
    assert waiting.status_code == 201, waiting.content
    data = waiting.json()
    assert data["state"] == "pending" and data["gpu_models"] == [H100]
    entry = data["queue"]
    assert entry["reason"] == "no_model"
    assert entry["reason_text"] == ("Not enough GPUs of the models it accepts are free for it now (or they are "
                                    "unhealthy or drained).")
    # Promised when the H100s free up (3 h), not when the A100s do (1 h).
    h100_end = Reservation.objects.get(pk=h100s["id"]).ends_at
    assert abs(datetime.fromisoformat(entry["start_by"]) - h100_end) < timedelta(seconds=1)
    assert QueueEntry.objects.get(pk=data["id"]).shape["gpu_models"] == [H100]
    # Releasing the A100s does not start it.
    assert api(world.outsider).post(f"{URL}{a100s['id']}/release/").status_code == 200
    queue.queue_pass(pool_id=mixed.pk)
    assert Reservation.objects.get(pk=data["id"]).state == "pending"
    # Releasing the H100s does, on H100s.
    assert api(world.outsider).post(f"{URL}{h100s['id']}/release/").status_code == 200
    assert queue.queue_pass(pool_id=mixed.pk)["started"] == 1
    started = Reservation.objects.get(pk=data["id"])
    assert started.state == "scheduled" and models_held(started.pk) == {H100}
    assert started.ge == pytest.approx(4.0)


def test_an_unpinned_request_behind_a_pinned_one_starts_on_the_other_model(world, api, mixed):
    book(api, world.outsider, team="infra", gpus=4, hours=3, gpu_models=[H100])
    pinned = ask(api, world.member, gpus=2, duration="1h", gpu_models=[H100]).json()
    assert pinned["state"] == "pending"
    anywhere = ask(api, world.member, gpus=2, duration="1h").json()
    assert anywhere["state"] == "scheduled" and models_held(anywhere["id"]) == {A100}


def test_the_quota_counts_the_weight_of_the_models_accepted(world, api, mixed):
    world.team.quotas.filter(pool=mixed).update(max_ge=3)
    # Two H100s weigh 4 GE: over the quota of 3 even in an empty pool, refused rather than queued for ever.
    refused = ask(api, world.member, gpus=2, duration="1h", gpu_models=[H100])
    assert refused.status_code == 409 and errors_of(refused)[0][1] == "quota_exceeded"
    assert not Reservation.objects.filter(team=world.team).exists()
    ok = ask(api, world.member, gpus=2, duration="1h", gpu_models=[A100])
    assert ok.status_code == 201 and ok.json()["ge"] == pytest.approx(2.0)


def test_failover_moves_a_pinned_reservation_only_onto_its_model(world, api, mixed):
    pinned = book(api, world.member, gpus=2, gpu_models=[H100]).json()
    dead = Allocation.objects.filter(reservation_id=pinned["id"]).values_list("gpu__node_id", flat=True)[0]
    Node.objects.filter(pk=dead).update(healthy=False)
    assert node_failover(node_id=dead)["moved"] == [pinned["id"]]
    now_held = Allocation.objects.filter(reservation_id=pinned["id"], ends_at__gt=timezone.now())
    assert {a.gpu.model_name for a in now_held} == {H100} and not now_held.filter(gpu__node_id=dead).exists()


def test_failover_fails_a_pinned_reservation_when_no_gpu_of_its_model_is_free(world, api, mixed):
    pinned = book(api, world.member, gpus=2, gpu_models=[H100]).json()
    on = Allocation.objects.filter(reservation_id=pinned["id"]).values_list("gpu__node__name", flat=True)[0]
    other = "node-h2" if on == "node-h1" else "node-h1"
    assert book(api, world.outsider, team="infra", gpus=2, gpu_models=[H100]).json()["grants"][0]["node"] == other
    Node.objects.filter(name=on).update(healthy=False)
    result = node_failover(node_id=Node.objects.get(name=on).pk)
    assert result["failed"] == [pinned["id"]]  # four A100s are free, but it does not accept them
    failed = Reservation.objects.get(pk=pinned["id"])
    assert failed.state == "failed" and f"GPUs of the models it accepts ({H100})" in failed.reason


@pytest.mark.parametrize("value, rule", [
    ("NVIDIA H100 80GB HBM3", "not_a_list"),
    ({"model": H100}, "not_a_list"),
    ([5], "not_a_string"),
    ([""], "not_a_string"),
    ([None], "not_a_string"),
    ([H100, H100], "duplicate"),
    ([f"model {k}" for k in range(17)], "max_length"),
    (["NVIDIA L4"], "not_in_pool"),
])
def test_bad_gpu_models_are_a_400_naming_the_field_and_the_rule_and_write_nothing(world, api, mixed, value, rule):
    response = book(api, world.member, gpu_models=value)
    assert response.status_code == 400, response.content
    assert errors_of(response) == [("gpu_models", rule)]
    assert not Reservation.objects.exists() and not Allocation.objects.exists()


def test_a_model_not_in_the_pool_is_named_with_the_pools_models(world, api, mixed):
    response = ask(api, world.member, gpu_models=[H100, "NVIDIA L4"])
    assert response.status_code == 400
    assert response.json()["errors"][0]["message"] == (
        f"Pool Mixed has no GPU of model NVIDIA L4 (its models: {A100}, {H100}).")


def test_more_gpus_than_the_models_have_is_refused_as_too_large_for_the_pool(world, api, mixed):
    response = ask(api, world.member, gpus=5, gpu_models=[H100])
    assert response.status_code == 400
    assert errors_of(response) == [("gpus", "exceeds_pool_size")]
    assert "4 GPUs of the models in gpu_models" in response.json()["detail"]


def test_an_empty_list_means_any_model(world, api, mixed):
    response = book(api, world.member, gpus=8, gpu_models=[])
    # 8 GPUs of 12 GE quota: 4 H100 (8 GE) + 4 A100 (4 GE) = 12 GE; it books the whole pool.
    assert response.status_code == 201, response.content
    assert response.json()["gpu_models"] == [] and models_held(response.json()["id"]) == {A100, H100}


def test_a_pinned_future_window_preempts_only_bookings_on_its_model(world, api, mixed, mailoutbox,
                                                                     django_capture_on_commit_callbacks):
    """infra (preemptible, low) fills the pool: the H100s with two older bookings, the A100s with the youngest
    one. ml (high) books two H100s from in an hour: the youngest booking alone would free the most, but only
    A100s; the notice goes to an H100 booking."""
    low = PriorityClass.objects.create(name="low", value=10, preemptible=True)
    high = PriorityClass.objects.create(name="high", value=100, preemptible=True)
    Quota.objects.filter(team=world.team, pool=mixed).update(priority_class=high)
    Quota.objects.filter(team=world.other_team, pool=mixed).update(priority_class=low)
    ids = []
    for model, gpus, minutes in ((H100, 2, 180), (H100, 2, 120), (A100, 4, 60)):
        made = book(api, world.staff, team="infra", gpus=gpus, hours=6, gpu_models=[model])
        assert made.status_code == 201, made.content
        started_ago(Reservation.objects.get(pk=made.json()["id"]), minutes)
        ids.append(made.json()["id"])
    start = timezone.now() + timedelta(hours=1)
    with django_capture_on_commit_callbacks(execute=True):
        response = api(world.member).post(URL, {"pool": "mixed", "team": "ml", "gpus": 2, "gpu_models": [H100],
                                                "starts_at": start.isoformat(),
                                                "ends_at": (start + timedelta(hours=1)).isoformat()}, format="json")
    assert response.status_code == 201, response.content
    noticed = [r.pk for r in Reservation.objects.filter(pk__in=ids, preempt_at__isnull=False)]
    assert noticed == [ids[1]]  # the younger of the H100 bookings; never the A100 one
    assert models_held(response.json()["id"]) == {H100}


# --- the availability timeline counts only the models asked -------------------------------------------------

def next_hour(n: int = 0) -> datetime:
    return timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=1 + n)


def booked_in_first_hour(api, user, **body):
    start = next_hour()
    response = api(user).post(URL, {"pool": "mixed", "team": "ml", "starts_at": start.isoformat(),
                                    "ends_at": (start + timedelta(hours=1)).isoformat(), **body}, format="json")
    assert response.status_code == 201, response.content


@pytest.fixture
def busy_first_hour(world, api, mixed):
    """In the first of three hours ml holds 2 of the 4 H100s and 3 of the 4 A100s."""
    booked_in_first_hour(api, world.member, gpus=2, gpu_models=[H100])
    booked_in_first_hour(api, world.member, gpus=3, gpu_models=[A100])
    return mixed


def availability(api, user, *pairs):
    query = [("start", next_hour().isoformat()), ("end", next_hour(3).isoformat()), *pairs]
    return api(user).get("/api/v1/pools/mixed/availability/", query)


def counted(api, user, *pairs) -> list[tuple[int, int, bool]]:
    response = availability(api, user, *pairs)
    assert response.status_code == 200, response.content
    return [(s["free"], s["most_together"], s["fits"]) for s in response.json()]


def test_availability_counts_only_the_gpus_of_the_models_asked(world, api, busy_first_hour):
    assert counted(api, world.member, ("gpu_models", H100)) == [(2, 2, True), (4, 2, True), (4, 2, True)]
    assert counted(api, world.member, ("gpu_models", A100)) == [(1, 1, True), (4, 4, True), (4, 4, True)]
    assert counted(api, world.member) == [(3, 2, True), (8, 4, True), (8, 4, True)]
    both = counted(api, world.member, ("gpu_models", H100), ("gpu_models", A100))
    assert both == counted(api, world.member)


def test_a_shape_that_fits_only_on_another_model_does_not_fit(world, api, busy_first_hour):
    # Two together: node-h2's H100s are free in the first hour, but only one A100 is.
    assert [fits for *_, fits in counted(api, world.member, ("gpus", 2), ("gpu_models", A100))] == [False, True, True]
    assert [fits for *_, fits in counted(api, world.member, ("gpus", 2), ("gpu_models", H100))] == [True, True, True]
    # Four H100s take both H100 nodes (no node has four), which the first hour does not have free.
    assert [fits for *_, fits in counted(api, world.member, ("gpus", 4), ("gpu_models", H100))] == [False, True, True]


def test_the_timeline_capacity_and_quota_count_the_models_asked(world, busy_first_hour):
    from allocations import quotas, selectors
    from allocations.shapes import Amounts

    limits = quotas.limits_for(team=world.team, pool=busy_first_hour)
    start = next_hour()

    def answer(models):
        return selectors.availability(busy_first_hour, start, start + timedelta(hours=2), timedelta(hours=1),
                                      Amounts(gpus=1), quota=limits, gpu_models=models)

    h100, a100 = answer([H100]), answer([A100])
    assert (h100.capacity, a100.capacity, answer(None).capacity) == (4, 4, 8)
    assert h100.shape.gpu_models == (H100,)
    # ml holds 7 of its 12 GE in the first hour: 2 H100s (2 GE each) or 5 A100s (1 GE each) more.
    assert [s.quota_left for s in h100.slots] == [2, 6]
    assert [s.quota_left for s in a100.slots] == [5, 12]


@pytest.mark.parametrize("values, rule", [
    ([""], "not_a_string"),
    (["x" * 129], "not_a_string"),
    ([H100, H100], "duplicate"),
    ([f"model {k}" for k in range(17)], "max_length"),
    (["NVIDIA L4"], "not_in_pool"),
    ([f"{H100},{A100}"], "not_in_pool"),  # a value is one model name: a comma does not separate two
])
def test_bad_gpu_models_in_the_availability_query_are_a_400_naming_the_rule(world, api, mixed, values, rule):
    response = availability(api, world.member, *(("gpu_models", value) for value in values))
    assert response.status_code == 400, response.content
    assert errors_of(response) == [("gpu_models", rule)]


def test_a_model_not_in_the_pool_is_named_with_the_pools_models_in_the_availability_query(world, api, mixed):
    response = availability(api, world.member, ("gpu_models", "NVIDIA L4"))
    assert response.json()["errors"][0]["message"] == (
        f"Pool Mixed has no GPU of model NVIDIA L4 (its models: {A100}, {H100}).")
