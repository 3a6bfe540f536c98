"""A request that accepts only some GPU models (Shape.gpu_models) is chosen, counted and planned on GPUs of
those models alone, in every sharing mode; no database (booking and the queue's plan on plain data)."""
from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from allocations import booking, queue
from allocations.booking import BookingRefused, Grant, PoolGpu, PoolSnapshot, Shape, choose, room
from inventory.sharing import SharingMode

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
START = datetime(2026, 11, 23, 12, tzinfo=UTC)
END = START + timedelta(hours=2)


def mixed_pool(layout=((A100, 4), (H100, 2), (A100, 4)), *, busy=(), weights=None) -> PoolSnapshot:
    """One node per (model, GPUs) of `layout`, in that order (node k, GPU id k * 100 + index); `busy`: GPU ids
    held whole by another reservation over the window."""
    weights = weights or {H100: 2.0, A100: 1.0}
    gpus = tuple(PoolGpu(id=k * 100 + i, node_id=k, node_name=f"n{k}", index=i, uuid=f"GPU-{k}-{i}", model=model,
                         memory_mib=81920, weight=weights.get(model, 1.0))
                 for k, (model, size) in enumerate(layout) for i in range(size))
    grants = tuple(Grant(gpu_id=gpu_id, reservation_id=9, starts_at=START, ends_at=END) for gpu_id in busy)
    return PoolSnapshot(start=START, end=END, gpus=gpus, grants=grants)


def models_of(snapshot: PoolSnapshot, grants) -> set[str]:
    model = {gpu.id: gpu.model for gpu in snapshot.gpus}
    return {model[grant.gpu_id] for grant in grants}


@pytest.mark.parametrize("policy", ["portal", "first_fit", "best_fit", "spread", "fgd"])
def test_whole_gpus_land_only_on_the_models_accepted(policy):
    snapshot = mixed_pool()
    for _ in range(2):  # first_fit alone would take the first node (A100): the pin must move it
        grants = choose(snapshot, Shape(gpus=1, gpu_models=(H100,)), policy=policy)
        assert models_of(snapshot, grants) == {H100}
        assert grants[0].ge == 2.0  # the H100's weight, not the pool's first model's
        snapshot = dataclasses.replace(snapshot, grants=(*snapshot.grants, Grant(
            gpu_id=grants[0].gpu_id, reservation_id=1, starts_at=START, ends_at=END)))
    with pytest.raises(BookingRefused) as refused:  # both H100s taken; 8 A100s free
        choose(snapshot, Shape(gpus=1, gpu_models=(H100,)), policy=policy)
    assert refused.value.code == "no_gpu_model"
    assert refused.value.msg.english().startswith(f"Counting only GPUs of the models it accepts ({H100}): ")
    assert models_of(snapshot, choose(snapshot, Shape(gpus=1), policy=policy)) == {A100}


def test_a_request_larger_than_any_node_of_its_model_takes_whole_nodes_of_that_model():
    snapshot = mixed_pool(((A100, 8), (H100, 2), (H100, 2), (A100, 8)))
    grants = choose(snapshot, Shape(gpus=4, gpu_models=(H100,)), policy="portal")
    assert sorted(g.gpu_id for g in grants) == [100, 101, 200, 201]
    with pytest.raises(BookingRefused) as refused:
        choose(snapshot, Shape(gpus=5, gpu_models=(H100,)), policy="portal")
    assert refused.value.code == "no_gpu_model"


def test_the_fragmented_refusal_keeps_its_code_and_names_the_models():
    snapshot = mixed_pool(((H100, 2), (A100, 8), (H100, 2)), busy=(0, 200))
    with pytest.raises(BookingRefused) as refused:
        choose(snapshot, Shape(gpus=2, gpu_models=(H100,)), policy="portal")
    assert refused.value.code == "fragmented"
    assert H100 in refused.value.msg.english()


@pytest.mark.parametrize("mode", [SharingMode.TIME_SLICING, SharingMode.MPS])
def test_shares_land_only_on_the_models_accepted(mode):
    snapshot = mixed_pool()
    shape = Shape(mode=mode, shares=2, replicas=4, gpu_models=(H100,))
    grants = choose(snapshot, shape, policy="first_fit")
    assert models_of(snapshot, grants) == {H100} and grants[0].ge == pytest.approx(2.0 * 2 / 4)
    assert room(snapshot, shape).free == 2 * 4  # the two H100s' shares, not the A100s'


def test_static_mig_instances_come_only_from_gpus_of_the_models_accepted():
    snapshot = mixed_pool()
    shape = Shape(mode=SharingMode.MIG, mig_profile="1g.10gb", mig_count=3, mig_layout="all-1g.10gb",
                  gpu_models=(H100,))
    grants = choose(snapshot, shape, policy="portal")
    assert models_of(snapshot, grants) == {H100}
    assert room(snapshot, shape).free == 2 * 7
    with pytest.raises(BookingRefused) as refused:
        choose(snapshot, dataclasses.replace(shape, mig_count=15), policy="portal")
    assert refused.value.code == "no_gpu_model"


def test_dynamic_mig_carves_only_gpus_of_the_models_accepted():
    snapshot = mixed_pool()
    shape = Shape(mode=SharingMode.MIG, mig_profile="3g.40gb", mig_count=4, mig_dynamic=True, gpu_models=(H100,))
    grants = choose(snapshot, shape, policy="first_fit")
    assert models_of(snapshot, grants) == {H100} and len(grants) == 4
    with pytest.raises(BookingRefused):
        choose(snapshot, dataclasses.replace(shape, mig_count=5), policy="first_fit")


def test_vgpu_lands_only_on_the_models_accepted():
    snapshot = mixed_pool()
    shape = Shape(mode=SharingMode.VGPU, gpus=2, memory_mib=20000, cores_pct=25, gpu_models=(H100,))
    grants = choose(snapshot, shape, policy="first_fit")
    assert models_of(snapshot, grants) == {H100}
    with pytest.raises(BookingRefused):
        choose(snapshot, dataclasses.replace(shape, gpus=3), policy="first_fit")


def test_several_models_accepted_take_either():
    snapshot = mixed_pool(((A100, 2), (H100, 2), ("NVIDIA L4", 4)), busy=(100, 101))
    grants = choose(snapshot, Shape(gpus=2, gpu_models=(A100, H100)), policy="portal")
    assert models_of(snapshot, grants) == {A100}


def test_the_queue_plan_promises_a_pinned_request_only_its_models_gpus():
    """The A100s free up in 1 h, the H100s in 3 h: an H100-only request is promised 3 h, and its reason says the
    models it accepts are short."""
    snapshot = mixed_pool(((A100, 4), (H100, 2)))
    grants = [*(Grant(gpu_id=g, reservation_id=1, starts_at=START - timedelta(hours=1),
                      ends_at=START + timedelta(hours=1)) for g in (0, 1, 2, 3)),
              *(Grant(gpu_id=g, reservation_id=2, starts_at=START - timedelta(hours=1),
                      ends_at=START + timedelta(hours=3)) for g in (100, 101))]
    waiting = [queue.Waiting(reservation_id=10, team_id=1, shape=Shape(gpus=2, gpu_models=(H100,)),
                             duration=timedelta(hours=1), queued_at=START),
               queue.Waiting(reservation_id=11, team_id=1, shape=Shape(gpus=2), duration=timedelta(hours=1),
                             queued_at=START)]
    for board in (True, False):
        planned = queue.plan(gpus=snapshot.gpus, grants=grants, waiting=waiting, now=START,
                             horizon=START + timedelta(days=2), policy="portal", backfill=True, teams={}, board=board)
        pinned, free = planned
        assert pinned.start == START + timedelta(hours=3) and pinned.reason == "no_model"
        assert {g.gpu_id for g in pinned.grants} == {100, 101}
        assert free.start == START + timedelta(hours=1) and {g.gpu_id for g in free.grants} <= {0, 1, 2, 3}


def test_a_shape_keeps_its_models_through_the_queue_entry():
    shape = Shape(gpus=2, gpu_models=(A100, H100))
    assert queue.shape_from(queue.shape_data(shape)) == shape
    assert queue.shape_from({k: v for k, v in queue.shape_data(Shape(gpus=2)).items() if k != "gpu_models"}
                            ) == Shape(gpus=2)  # an entry written before the field existed
    assert str(shape.in_words()) == f"2 GPUs of {A100} / {H100}"


MODELS = (A100, H100, "NVIDIA L4")


@st.composite
def pools_and_requests(draw):
    nodes = draw(st.lists(st.tuples(st.sampled_from(MODELS), st.integers(1, 4)), min_size=1, max_size=5))
    snapshot = mixed_pool(tuple(nodes))
    ids = [gpu.id for gpu in snapshot.gpus]
    busy = draw(st.lists(st.sampled_from(ids), unique=True, max_size=len(ids)))
    snapshot = dataclasses.replace(snapshot, grants=tuple(
        Grant(gpu_id=g, reservation_id=9, starts_at=START, ends_at=END) for g in busy))
    allowed = tuple(sorted(draw(st.sets(st.sampled_from(MODELS), min_size=1, max_size=2))))
    mode = draw(st.sampled_from([SharingMode.EXCLUSIVE, SharingMode.TIME_SLICING, SharingMode.VGPU, "mig",
                                 "dynamic_mig"]))
    if mode == SharingMode.EXCLUSIVE:
        shape = Shape(gpus=draw(st.integers(1, 6)), gpu_models=allowed)
    elif mode == SharingMode.TIME_SLICING:
        shape = Shape(mode=mode, shares=draw(st.integers(1, 4)), replicas=4, gpu_models=allowed)
    elif mode == SharingMode.VGPU:
        shape = Shape(mode=mode, gpus=draw(st.integers(1, 2)), memory_mib=8000, cores_pct=30, gpu_models=allowed)
    elif mode == "mig":
        shape = Shape(mode=SharingMode.MIG, mig_profile="1g.10gb", mig_count=draw(st.integers(1, 9)),
                      mig_layout="all-1g.10gb", gpu_models=allowed)
    else:
        shape = Shape(mode=SharingMode.MIG, mig_profile="2g.20gb", mig_count=draw(st.integers(1, 5)), mig_dynamic=True,
                      gpu_models=allowed)
    policy = draw(st.sampled_from(["portal", "first_fit", "best_fit", "spread", "fgd"]))
    return snapshot, shape, policy


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pools_and_requests())
def test_no_grant_ever_lands_on_a_model_the_request_does_not_accept(case):
    snapshot, shape, policy = case
    try:
        grants = choose(snapshot, shape, policy=policy)
    except BookingRefused:
        # Refused only when the GPUs of its models alone cannot give it: the same shape on a pool of just them
        # is refused too.
        with pytest.raises(BookingRefused):
            choose(snapshot.of_models(shape.gpu_models), dataclasses.replace(shape, gpu_models=()), policy=policy)
        return
    assert models_of(snapshot, grants) <= set(shape.gpu_models)
    if shape.mode == SharingMode.EXCLUSIVE:
        assert len({g.gpu_id for g in grants}) == shape.gpus


@st.composite
def two_model_slots(draw):
    """A small pool of two models (nodes of 1 to 4 GPUs, some held), and whole GPUs or shares pinned to one
    model or both: the sizes where one model's nodes are smaller than the other's, and a request can need
    whole nodes of its model though a node of the other model could hold it."""
    nodes = draw(st.lists(st.tuples(st.sampled_from((A100, H100)), st.integers(1, 4)), min_size=2, max_size=4))
    snapshot = mixed_pool(tuple(nodes))
    ids = [gpu.id for gpu in snapshot.gpus]
    busy = draw(st.lists(st.sampled_from(ids), unique=True, max_size=len(ids) // 2))
    snapshot = dataclasses.replace(snapshot, grants=tuple(
        Grant(gpu_id=g, reservation_id=9, starts_at=START, ends_at=END) for g in busy))
    allowed = draw(st.sampled_from([(A100,), (H100,), (A100, H100)]))
    if draw(st.booleans()):
        shape = Shape(gpus=draw(st.integers(1, 8)), gpu_models=allowed)
    else:
        shape = Shape(mode=SharingMode.TIME_SLICING, shares=draw(st.integers(1, 4)), replicas=4, gpu_models=allowed)
    return snapshot, shape, draw(st.sampled_from(["portal", "first_fit", "best_fit", "spread", "fgd"]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(two_model_slots(), pools_and_requests()))
# Three H100s where H100 nodes hold two and an A100 node four: they take both H100 nodes, whole.
@example((mixed_pool(((H100, 2), (H100, 2), (A100, 4))), Shape(gpus=3, gpu_models=(H100,)), "portal"))
def test_the_timeline_says_a_pinned_shape_fits_exactly_when_choose_would_place_it(case):
    """A slot's `fits` (selectors.availability: what room counts on the shape's models) against choose on the
    slot's snapshot: the timeline may neither promise what a booking would be refused nor hide room it has."""
    from allocations.selectors import _fits

    snapshot, shape, policy = case
    try:
        choose(snapshot, shape, policy=policy)
        placed = True
    except BookingRefused:
        placed = False
    assert _fits(shape, room(snapshot, shape), snapshot) == placed


def test_a_snapshot_cut_to_no_models_is_the_whole_snapshot():
    snapshot = mixed_pool()
    assert snapshot.of_models(()) is snapshot
    assert {g.model for g in snapshot.of_models([H100]).gpus} == {H100}
    assert booking.models_words([A100, H100]) == f"{A100} / {H100}"
