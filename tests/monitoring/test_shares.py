"""Allocated vs used per share: processes attributed to the reservations holding a GPU or MIG instance,
from agents old and new, sent live and kept hot; the share memory each mode allows; /metrics' per-share
and MIG-instance series with dcgm-exporter's labels.

Grant rows are made directly, as the grant-row contract (notes/COMMON.md) lays them out."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from django.test import Client

from allocations.models import Allocation, Reservation
from monitoring import hot, live, shares
from tests.factories import UserFactory
from tests.monitoring.conftest import batch, payload, post, sample

MEMORY = 81559  # the world's GPUs (H100 80GB)


def reserve(world, user, team, mode: str, gpu, slots=(), **row) -> Reservation:
    """A reservation active now holding `gpu` in `mode`: one row per time-slicing/MPS slot in `slots`
    (of 4 replicas: 250 thousandths each), else one row with `row`'s columns."""
    now = timezone.now()
    reservation = Reservation.objects.create(team=team, pool=world.pool, requested_by=user, gpus=1, mode=mode,
                                             starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=3),
                                             state="active")
    common = {"reservation": reservation, "gpu": gpu, "starts_at": reservation.starts_at,
              "ends_at": reservation.ends_at, "mode": mode}
    if slots:
        for i in slots:
            Allocation.objects.create(**common, share_from=250 * i, share_to=250 * (i + 1), milli=250, ge=0.25, **row)
    else:
        Allocation.objects.create(**common, **row)
    return reservation


def proc(pid: int, mib: int, user: str = "", mig_uuid: str = "", gi: int | None = None) -> dict:
    out = {"pid": pid, "used_memory_mib": mib, "user": user}
    if mig_uuid:
        out.update(mig_uuid=mig_uuid, gpu_instance_id=gi)
    return out


def report(host, processes, gpu: int = 0, t: float | None = None, **overrides):
    response = post(host, payload(batch([sample(host.uuids[gpu], processes=processes, **overrides)], t=t)))
    assert response.status_code == 200 and response.json()["accepted"] == 1, response.content
    return response


def hot_uses(host, gpu: int = 0) -> dict:
    latest = hot.latest_get([(host.gpus[gpu].pk, host.node.pk)])[host.gpus[gpu].pk]
    return {(r, i): (mib, gi) for r, i, mib, gi in latest.shares}


@pytest.fixture
def time_sliced(world, host):
    """GPU 0 of node-a time-sliced in 4: member (team ml) holds one share, outsider (team infra) two."""
    world.pool.sharing_mode, world.pool.sharing_config = "time_slicing", {"replicas": 4}
    world.pool.save()
    gpu = host.gpus[0]
    mine = reserve(world, world.member, world.team, "time_slicing", gpu, slots=[0])
    theirs = reserve(world, world.outsider, world.other_team, "time_slicing", gpu, slots=[1, 2])
    return mine, theirs


@pytest.fixture
def mig(world, host):
    """GPU 1 of node-a carved into two 1g.10gb instances (reported by the host), one per reservation."""
    gpu = host.gpus[1]
    gpu.mig_devices = [{"uuid": "MIG-aaaa", "profile": "1g.10gb", "start": 0, "memory_mib": 9984},
                       {"uuid": "MIG-bbbb", "profile": "1g.10gb", "start": 1, "memory_mib": 9984}]
    gpu.save()
    row = {"mig_profile": "1g.10gb", "milli": 142, "ge": 1 / 7, "memory_mib": 9984}
    first = reserve(world, world.member, world.team, "mig", gpu, mig_start=0, share_from=0, share_to=125, **row)
    second = reserve(world, world.outsider, world.other_team, "mig", gpu, mig_start=1, share_from=125, share_to=250,
                     **row)
    return first, second


def test_two_reservations_time_slicing_a_gpu_each_get_their_users_processes(host, time_sliced):
    mine, theirs = time_sliced
    report(host, [proc(101, 30000, "member"), proc(102, 6000, "outsider"), proc(103, 4000, "outsider"),
                  proc(104, 500, "stranger")], memory_used_mib=40500)
    assert hot_uses(host) == {(mine.pk, ""): (30000, None), (theirs.pk, ""): (10000, None), (None, ""): (500, None)}


def test_an_old_agents_processes_without_users_go_to_nobody_on_a_shared_gpu(host, time_sliced):
    mine, theirs = time_sliced
    report(host, [{"pid": 101, "used_memory_mib": 30000}])
    assert hot_uses(host) == {(mine.pk, ""): (0, None), (theirs.pk, ""): (0, None), (None, ""): (30000, None)}


def test_a_gpu_with_one_holder_gets_every_process_whoever_runs_it(host, world):
    held = reserve(world, world.member, world.team, "exclusive", host.gpus[0])
    report(host, [{"pid": 101, "used_memory_mib": 30000}, proc(102, 2000, "someone-else")])
    assert hot_uses(host) == {(held.pk, ""): (32000, None)}


def test_samples_without_processes_are_still_accepted_and_nobody_uses_anything(host, world, time_sliced):
    mine, theirs = time_sliced
    values = sample(host.uuids[0])
    del values["processes"]
    assert post(host, payload(batch([values]))).json()["accepted"] == 1
    assert hot_uses(host) == {(mine.pk, ""): (0, None), (theirs.pk, ""): (0, None)}
    report(host, [], gpu=2)  # nobody holds it and nothing runs: nothing to say
    assert hot_uses(host, gpu=2) == {}


def test_processes_on_mig_instances_go_to_the_instances_holders(host, mig):
    first, second = mig
    report(host, [proc(201, 5000, "root", "MIG-aaaa", 7), proc(202, 9000, "outsider", "MIG-bbbb", 8),
                  proc(203, 100, "", "MIG-cccc")], gpu=1)
    assert hot_uses(host, gpu=1) == {(first.pk, "MIG-aaaa"): (5000, 7), (second.pk, "MIG-bbbb"): (9000, 8),
                                     (None, "MIG-cccc"): (100, None)}


def test_a_process_field_of_the_wrong_type_costs_its_attribution_not_the_sample(host, world):
    held = reserve(world, world.member, world.team, "exclusive", host.gpus[0])
    report(host, [{"pid": 101, "used_memory_mib": 1000, "user": 5, "mig_uuid": ["x"], "gpu_instance_id": "7"}])
    assert hot_uses(host) == {(held.pk, ""): (1000, None)}


def test_live_messages_carry_each_shares_allocation_and_use_and_teams_see_their_own(host, world, time_sliced,
                                                                                    monkeypatch):
    mine, theirs = time_sliced
    sent = []
    monkeypatch.setattr(live, "send", lambda groups, **kw: sent.append(groups))
    report(host, [proc(101, 30000, "member"), proc(102, 6000, "outsider")])
    groups = sent[-1]
    pool_item = groups[live.group_name("pool", world.pool.pk)]["samples"][0]
    assert pool_item["shares"] == [
        {"reservation": mine.pk, "team": world.team.pk, "instance": "", "allocated": MEMORY // 4, "used": 30000},
        {"reservation": theirs.pk, "team": world.other_team.pk, "instance": "", "allocated": MEMORY * 2 // 4,
         "used": 6000}]
    ours = groups[live.group_name("team", world.team.pk)]["samples"][0]["shares"]
    assert [s["reservation"] for s in ours] == [mine.pk]
    assert [s["reservation"] for s in groups[live.group_name("team", world.other_team.pk)]["samples"][0]["shares"]] \
        == [theirs.pk]


@pytest.mark.parametrize("mode, rows, replicas, expected", [
    ("exclusive", [(None, 1000)], None, MEMORY),
    ("time_slicing", [(None, 250), (None, 250)], 4, MEMORY // 2),
    ("time_slicing", [(None, 333)], None, MEMORY * 333 // 1000),  # a pool that names no replicas: the rows' worth
    ("mps", [(20389, 250), (20389, 250)], 4, 40778),
    ("mps", [(None, 250)], 4, MEMORY // 4),
    ("vgpu", [(12000, 148)], None, 12000),
    ("mig", [(9984, 142)], None, 9984),
])
def test_a_shares_memory_follows_its_mode(mode, rows, replicas, expected):
    assert shares.share_memory_mib(mode, MEMORY, rows, replicas) == expected


def test_shares_now_groups_slot_rows_and_names_mig_instances(world, host, time_sliced, mig):
    mine, theirs = time_sliced
    first, second = mig
    found = {(s.reservation_id, s.instance): s for s in shares.shares_now(timezone.now())}
    assert found[(mine.pk, "")].allocated_mib == MEMORY // 4 and found[(mine.pk, "")].user == "member"
    assert found[(theirs.pk, "")].allocated_mib == MEMORY // 2 and len(found[(theirs.pk, "")].rows) == 2
    assert found[(first.pk, "MIG-aaaa")].allocated_mib == 9984 and found[(first.pk, "MIG-aaaa")].mig_start == 0
    assert found[(second.pk, "MIG-bbbb")].mig_profile == "1g.10gb"


# --- /metrics -------------------------------------------------------------------------------


def _scrape(settings) -> dict:
    settings.METRICS_TOKEN = "scrape-token"
    body = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token").content.decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_metrics_have_allocated_and_used_memory_per_share(settings, host, world, time_sliced):
    mine, theirs = time_sliced
    report(host, [proc(101, 30000, "member"), proc(102, 6000, "outsider"), proc(104, 500, "stranger")])
    metrics = _scrape(settings)
    gpu = {"gpu": "0", "UUID": host.uuids[0], "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3",
           "Hostname": "node-a", "pool": "a100"}
    allocated = metrics["gpupool_share_memory_allocated_mib"]
    used = metrics["gpupool_share_memory_used_mib"]
    ours = {**gpu, "team": "ml", "reservation": str(mine.pk), "mode": "time_slicing"}
    assert (ours, MEMORY // 4) in allocated and (ours, 30000) in used
    assert ({**gpu, "team": "infra", "reservation": str(theirs.pk), "mode": "time_slicing"}, 6000) in used
    assert metrics["gpupool_gpu_memory_unattributed_mib"] == [(gpu, 500)]


def test_mig_shares_and_instances_carry_dcgm_exporters_mig_labels(settings, host, world, mig):
    first, second = mig
    report(host, [proc(201, 5000, "member", "MIG-aaaa"), proc(202, 9000, "outsider", "MIG-bbbb", 8)], gpu=1,
           memory_used_mib=14000)
    metrics = _scrape(settings)
    gpu = {"gpu": "1", "UUID": host.uuids[1], "device": "nvidia1", "modelName": "NVIDIA H100 80GB HBM3",
           "Hostname": "node-a", "pool": "a100"}
    used = {labels["reservation"]: (labels, value) for labels, value in metrics["gpupool_share_memory_used_mib"]}
    assert used[str(second.pk)] == ({**gpu, "team": "infra", "reservation": str(second.pk), "mode": "mig",
                                     "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "8", "mig_instance": "MIG-bbbb"}, 9000)
    # The host never said MIG-aaaa's GPU instance id: the share says so with an empty GPU_I_ID ...
    assert used[str(first.pk)][0]["GPU_I_ID"] == "" and used[str(first.pk)][1] == 5000
    # ... and the DCGM-style instance series leave that instance out rather than invent an id.
    fb_used = [(labels, value) for labels, value in metrics["gpupool_dcgm_fi_dev_fb_used"] if labels["gpu"] == "1"]
    assert fb_used == [(gpu, 14000), ({**gpu, "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "8"}, 9000)]
    fb_free = [(labels, value) for labels, value in metrics["gpupool_dcgm_fi_dev_fb_free"]
               if labels.get("GPU_I_ID") == "8"]
    assert fb_free == [({**gpu, "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "8"}, 9984 - 9000)]


def test_a_user_named_like_no_booker_is_not_attributed(host, world, time_sliced):
    UserFactory(username="member2")
    mine, theirs = time_sliced
    report(host, [proc(101, 1000, "member2")])
    assert hot_uses(host)[(None, "")] == (1000, None)


def test_a_process_on_an_instance_nobody_holds_is_nobodys_even_beside_a_single_holder(host, world):
    gpu = host.gpus[1]
    gpu.mig_devices = [{"uuid": "MIG-aaaa", "profile": "1g.10gb", "start": 0, "memory_mib": 9984},
                       {"uuid": "MIG-cccc", "profile": "1g.10gb", "start": 2, "memory_mib": 9984}]
    gpu.save()
    held = reserve(world, world.member, world.team, "mig", gpu, mig_start=0, share_from=0, share_to=125,
                   mig_profile="1g.10gb", milli=142, ge=1 / 7, memory_mib=9984)
    report(host, [proc(201, 700, "member", "MIG-cccc"), proc(202, 300, "member", "MIG-aaaa")], gpu=1)
    assert hot_uses(host, gpu=1) == {(held.pk, "MIG-aaaa"): (300, None), (None, "MIG-cccc"): (700, None)}
