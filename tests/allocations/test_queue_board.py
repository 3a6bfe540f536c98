"""The queue's fast plan (a WholeGpuBoard: free gaps per GPU, window arrays by mask) against the plain
one (every candidate start walked with booking.choose) on random small exclusive pools: the same start,
the same GPUs and the same reason for every request. And the engine's timeline and masked state against
the general ClusterState they stand in for."""
from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocations import booking, queue, quotas
from allocations.placement import POLICY_NAMES, ClusterState, Holding
from allocations.placement.timeline import (FreeTimeline, WholeGpuState, first_reached_lexsorted,
                                              first_reached_packed)
from allocations.queue import TeamHolding, Waiting, earliest_fit, plan

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)
QUARTER = timedelta(minutes=15)


@st.composite
def schedules(draw, mixed: bool = False):
    """A small exclusive pool, its bookings and a queue; `mixed`: each node of one of two models, and requests
    that may accept only some of them."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    gpus, next_id = [], 1
    for node_id, size in enumerate(sizes, start=1):
        model = draw(st.sampled_from(["H100", "A100"])) if mixed else "H100"
        for index in range(size):
            gpus.append(booking.PoolGpu(id=next_id, node_id=node_id, node_name=f"n{node_id}", index=index,
                                        model=model, memory_mib=81920, weight=2.0 if model == "H100" else 1.0,
                                        usable=draw(st.booleans()) or draw(st.booleans())))
            next_id += 1
    grants = []
    for rid in range(900, 900 + draw(st.integers(0, 8))):
        start = T0 + draw(st.integers(-8, 12)) * QUARTER
        end = start + draw(st.integers(0, 16)) * QUARTER
        ids = draw(st.lists(st.sampled_from([g.id for g in gpus]), min_size=1, max_size=3, unique=True))
        grants.extend(booking.Grant(gpu_id=g, reservation_id=rid, starts_at=start, ends_at=end) for g in ids)
    waiting = []
    for rid in range(1, draw(st.integers(1, 8)) + 1):
        not_before = T0 + draw(st.integers(0, 8)) * QUARTER if draw(st.integers(0, 4)) == 0 else None
        not_after = T0 + draw(st.integers(0, 40)) * QUARTER if draw(st.integers(0, 4)) == 0 else None
        waiting.append(Waiting(reservation_id=rid, team_id=draw(st.sampled_from([1, 2])),
                               shape=booking.Shape(gpus=draw(st.integers(1, 6)), gpu_models=draw(st.sampled_from(
                                   [(), ("A100",), ("H100",), ("A100", "H100")])) if mixed else ()),
                               duration=draw(st.integers(1, 12)) * QUARTER, queued_at=T0 - rid * QUARTER,
                               not_before=not_before, not_after=not_after))
    quota = {team: draw(st.sampled_from([None, 2.0, 4.0, 100.0])) for team in (1, 2)}
    return gpus, grants, waiting, quota, draw(st.booleans()), draw(st.sampled_from(["portal", "first_fit"]))


def teams_for(quota: dict[int, float | None]) -> dict[int, TeamHolding]:
    return {team: TeamHolding(quota=quotas.QuotaLimits(team_id=team, team_slug=f"t{team}", pool_id=1, pool_slug="p",
                                                      max_ge=limit, ge_hours_per_month=None),
                              in_pool=[(T0 - QUARTER, T0 + 2 * QUARTER, 1.0)], everywhere=[])
            for team, limit in quota.items() if limit is not None}


def planned_alike(schedule) -> list:
    """The schedule planned on the board and by the walk over every start: asserts both plan the same starts,
    GPUs and reasons, and returns the board's plan."""
    gpus, grants, waiting, quota, backfill, policy = schedule
    args = dict(gpus=gpus, grants=grants, waiting=waiting, now=T0, horizon=T0 + 48 * QUARTER, policy=policy,
                backfill=backfill)
    fast = plan(**args, teams=teams_for(quota), board=True)
    walked = plan(**args, teams=teams_for(quota), board=False)
    assert [(p.waiting.reservation_id, p.start, p.grants, p.reason) for p in fast] == \
           [(p.waiting.reservation_id, p.start, p.grants, p.reason) for p in walked]
    return fast


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_the_board_plans_what_the_walk_over_every_start_plans(schedule):
    planned_alike(schedule)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules(mixed=True))
def test_the_board_plans_requests_that_accept_only_some_models_as_the_walk_does(schedule):
    """The board masks the timeline with the models a request accepts and tells the engine; the walk asks
    booking.choose, which does the same: the same starts, GPUs and reasons, and never a GPU of another model."""
    fast = planned_alike(schedule)
    model = {gpu.id: gpu.model for gpu in schedule[0]}
    for planned in fast:
        if planned.waiting.shape.gpu_models:
            assert {model[g.gpu_id] for g in planned.grants} <= set(planned.waiting.shape.gpu_models)


def test_a_deeper_queue_than_the_depth_is_planned_only_at_its_head():
    gpus = [booking.PoolGpu(id=i, node_id=1, node_name="n1", index=i) for i in range(2)]
    waiting = [Waiting(reservation_id=rid, team_id=1, shape=booking.Shape(gpus=1), duration=4 * QUARTER,
                       queued_at=T0 - rid * QUARTER) for rid in range(1, 6)]
    result = plan(gpus=gpus, grants=[], waiting=waiting, now=T0, horizon=T0 + 48 * QUARTER, policy="portal",
                  backfill=True, teams={}, depth=3)
    assert [p.start for p in result[:3]] == [T0, T0, T0 + 4 * QUARTER]
    assert all(p.start is None and p.reason == "not_planned" and not p.grants for p in result[3:])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-20, 40), st.integers(0, 20)), max_size=14),
       st.integers(1, 4), st.integers(1, 15), st.integers(0, 20), st.booleans(), st.sampled_from([1, 3 * 10**16]))
def test_the_timeline_finds_the_first_start_a_walk_over_gap_openings_finds(busy, count, duration, earliest,
                                                                         together, scale):
    """`scale`: every time multiplied, so that the sweep's events no longer fit one integer each (3e16: it sorts
    them by lexsort instead) and the answer is the same, scaled."""
    node_of = [0, 0, 0, 1, 1, 2]
    usable = [True, True, False, True, True, True]
    windows = [(gpu, start, start + length) for gpu, start, length in busy]
    timeline = FreeTimeline(node_of, usable, [(g, s * scale, e * scale) for g, s, e in windows])

    def free(gpu, t):
        return usable[gpu] and all(not (s < t + duration and e > t) or e <= s for g, s, e in windows if g == gpu)

    def fits(t):
        per_node = [sum(free(g, t) for g in range(6) if node_of[g] == n) for n in range(3)]
        return max(per_node) >= count if together else sum(per_node) >= count

    candidates = sorted({earliest, *(e for _, _, e in windows if e > earliest)})
    expected = next((t for t in candidates if t <= 60 and fits(t)), None)
    found = timeline.earliest(count, duration * scale, earliest * scale, 60 * scale, together=together)
    assert found == (expected * scale if expected is not None else None)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=6), st.data())
def test_the_timeline_sweep_finds_what_the_lexsorted_sweep_found(sizes, data):
    """Nodes of up to eight GPUs, windows booked and unbooked on them (gaps appended out of GPU order, as a plan's
    are), some GPUs unusable or not allowed: the sweep over events sorted as integers finds the start the sweep
    over three lexsorted keys finds, for every count of two or more (one GPU takes the first start, no sweep)."""
    node_of = [node for node, size in enumerate(sizes) for _ in range(size)]
    n = len(node_of)
    usable = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    busy = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(-50, 200), st.integers(0, 60)),
                              max_size=40))
    timeline = FreeTimeline(node_of, usable, [(g, s, s + length) for g, s, length in busy])
    for _ in range(data.draw(st.integers(0, 6))):  # a plan's bookings: gaps split, appended at the end
        k = data.draw(st.integers(0, timeline.gap_gpu.size - 1)) if timeline.gap_gpu.size else None
        if k is None or timeline.gap_to[k] <= timeline.gap_from[k]:
            continue
        lo, hi = max(int(timeline.gap_from[k]), -60), min(int(timeline.gap_to[k]), 300)
        if hi > lo:
            start = data.draw(st.integers(lo, hi - 1))
            timeline.book(int(timeline.gap_gpu[k]), start, data.draw(st.integers(start + 1, hi)))
    allowed = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n))) if data.draw(st.booleans()) \
        else None
    duration, earliest = data.draw(st.integers(1, 80)), data.draw(st.integers(-20, 150))
    latest = earliest + data.draw(st.integers(0, 300))
    for together in (True, False):
        lo, hi, ok = timeline.start_ranges(duration, earliest, latest, allowed=allowed)
        starts = (lo, hi, timeline.sweep_groups(ok, together=together))
        for count in range(2, max(sizes) + 2):
            assert first_reached_packed(count, *starts, earliest, latest) == first_reached_lexsorted(count, *starts)
            assert timeline.earliest(count, duration, earliest, latest, together=together, allowed=allowed) == \
                (first_reached_lexsorted(count, *starts) if lo.size >= count else None)


def _nodes(gpu_count: int):
    """Nodes of three GPUs each, `gpu_count` GPUs in all (GPU i on node i // 3)."""
    gpus = [booking.PoolGpu(id=i, node_id=i // 3, node_name=f"n{i // 3:02d}", index=i % 3) for i in range(gpu_count)]
    return booking.PoolSnapshot(start=T0, end=T0, gpus=tuple(gpus), grants=()).state().nodes


def _assert_masked_gives_the_general_arrays(gpu_count: int, holds, start: int, length: int, fields) -> None:
    """The holdings `holds` (gpu, start minute, minutes, reservation) held by the masked state at once give the
    general state's arrays over the window [start, start + length) minutes."""
    nodes = _nodes(gpu_count)
    minute = timedelta(minutes=1)
    whole = [(gpu, T0 + s * minute, T0 + (s + n) * minute, rid) for gpu, s, n, rid in holds]
    general = ClusterState(nodes, [Holding(node_id=gpu // 3, gpu_id=gpu, start=a, end=b, milli=1000, reservation_id=r)
                                   for gpu, a, b, r in whole if b > a])
    masked = WholeGpuState(nodes)
    masked.hold(whole)
    window = (T0 + start * minute, T0 + (start + length) * minute)
    a, b = general.arrays_for_window(*window), masked.arrays_for_window(*window)
    for field in fields:
        assert (getattr(a, field) == getattr(b, field)).all(), field


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-10, 20), st.integers(0, 10), st.integers(1, 4)),
                max_size=12), st.integers(-5, 15), st.integers(1, 10))
def test_the_masked_state_gives_the_arrays_the_general_state_gives(holds, start, length):
    _assert_masked_gives_the_general_arrays(6, holds, start, length,
                                            ("gpu_free", "mig_used", "affinity", "cpu_free", "mem_free", "version"))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-10, 20), st.integers(0, 10), st.integers(1, 4)),
                max_size=12), st.integers(1, 4), st.integers(1, 4), st.integers(-5, 15), st.integers(1, 10))
def test_the_masked_state_held_bit_by_bit_and_released_gives_the_general_states_arrays(holds, chunk, gone, start,
                                                                                       length):
    """The masked state keeps the many holdings booked first apart from the few added since (so a plan's one more
    copies only the few), merging them at MERGE_AT: held in chunks across a merge, with one reservation released,
    its arrays are those of the general state holding the rest."""
    nodes = _nodes(6)
    minute = timedelta(minutes=1)
    whole = [(gpu, T0 + s * minute, T0 + (s + n) * minute, rid) for gpu, s, n, rid in holds]
    masked = WholeGpuState(nodes)
    masked.MERGE_AT = 3
    for k in range(0, len(whole), chunk):
        masked.hold(whole[k:k + chunk])
    masked.release(gone)
    general = ClusterState(nodes, [Holding(node_id=gpu // 3, gpu_id=gpu, start=a, end=b, milli=1000, reservation_id=r)
                                   for gpu, a, b, r in whole if b > a and r != gone])
    window = (T0 + start * minute, T0 + (start + length) * minute)
    a, b = general.arrays_for_window(*window), masked.arrays_for_window(*window)
    for field in ("gpu_free", "mig_used", "affinity", "cpu_free", "mem_free"):
        assert (getattr(a, field) == getattr(b, field)).all(), field


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 119), st.integers(-10, 20), st.integers(0, 10), st.integers(1, 4)),
                max_size=8), st.integers(-5, 15), st.integers(1, 10))
def test_a_few_holdings_among_many_nodes_give_the_general_states_arrays(holds, start, length):
    """On 40 nodes a handful of holdings are a few clustering tasks, which the masked state counts into their
    cells one by one (np.add.at) rather than adding a count of the whole table: the same arrays."""
    _assert_masked_gives_the_general_arrays(120, holds, start, length, ("gpu_free", "mig_used", "affinity"))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-10, 20), st.integers(0, 10), st.integers(1, 4)),
                max_size=12), st.integers(1, 4), st.integers(1, 4), st.integers(-5, 15), st.integers(1, 10))
def test_holdings_given_as_slots_and_a_reservation_column_are_those_held_one_by_one(holds, chunk, gone, start, length):
    """hold_slots with the reservations as an integer column (a board's bulk of bookings: one group look-up per
    reservation, not per holding), in chunks that may repeat a reservation, then one more held by hold and one
    reservation released: the arrays of the same holdings held by hold."""
    nodes = _nodes(6)
    minute = timedelta(minutes=1)
    whole = [(gpu, T0 + s * minute, T0 + (s + n) * minute, rid) for gpu, s, n, rid in holds]
    extra = [(0, T0, T0 + 5 * minute, 2)]
    plain, columns = WholeGpuState(nodes), WholeGpuState(nodes)
    plain.hold(whole + extra)
    for k in range(0, len(whole), chunk):
        part = whole[k:k + chunk]
        slots = [columns.gpu_slot(gpu) for gpu, _, _, _ in part]
        columns.hold_slots(np.array([n for n, _ in slots], dtype=np.int64),
                           np.array([slot for _, slot in slots], dtype=np.int64),
                           [a.timestamp() for _, a, _, _ in part], [b.timestamp() for _, _, b, _ in part],
                           np.array([rid for _, _, _, rid in part], dtype=np.int64))
    columns.hold(extra)
    for state in (plain, columns):
        state.release(gone)
    window = (T0 + start * minute, T0 + (start + length) * minute)
    a, b = plain.arrays_for_window(*window), columns.arrays_for_window(*window)
    for field in ("gpu_free", "mig_used", "affinity", "cpu_free", "mem_free"):
        assert (getattr(a, field) == getattr(b, field)).all(), field


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules(), st.data())
def test_grants_as_columns_plan_what_the_grants_plan_and_read_back_as_the_grants(schedule, data):
    """GrantColumns (the pass's grants read once as columns for both plans) plan what the same grants as a list plan;
    ending some of them earlier (the estimate's grants) reads back as Grant.ending_at of each moved one, and plans
    what that list of grants plans. Team windows kept as columns read back as the windows they were made from."""
    gpus, grants, waiting, quota, backfill, policy = schedule
    args = dict(gpus=gpus, waiting=waiting, now=T0, horizon=T0 + 48 * QUARTER, policy=policy, backfill=backfill)
    columns = queue.GrantColumns(grants)
    assert list(columns) == grants and len(columns) == len(grants)
    moves = data.draw(st.lists(st.integers(0, 8), min_size=len(grants), max_size=len(grants)))
    ends = np.array([min(queue.micro(g.ends_at), queue.micro(g.starts_at + k * QUARTER)) if k
                     else queue.micro(g.ends_at) for g, k in zip(grants, moves, strict=True)], dtype=np.int64)
    moved = [g if end == queue.micro(g.ends_at) else g.ending_at(queue.instant_of(end))
             for g, end in zip(grants, ends.tolist(), strict=True)]
    shortened = columns.ending(ends)
    assert list(shortened) == moved and list(columns) == grants
    for given, listed in ((columns, grants), (shortened, moved)):
        fast = plan(**args, grants=given, teams=teams_for(quota))
        plain = plan(**args, grants=listed, teams=teams_for(quota))
        assert [(p.waiting.reservation_id, p.start, p.grants, p.reason) for p in fast] == \
               [(p.waiting.reservation_id, p.start, p.grants, p.reason) for p in plain]
    windows = [(g.starts_at, g.ends_at, float(k)) for k, g in enumerate(grants)]
    given = queue.Windows(windows)
    kept = queue.Windows(columns=given.columns())
    added = [(T0 + k * QUARTER, T0 + (k + 1) * QUARTER, 1.0) for k in range(data.draw(st.integers(1, 40)))]
    for k, window in enumerate(added):  # appended one by one, its columns read between (they grow in place)
        kept.append(window)
        if k % 3 == 0:
            kept.columns()
    assert list(kept) == [*windows, *added] and len(kept) == len(windows) + len(added)
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(kept), max_size=len(kept))), dtype=bool)
    assert kept.picked(mask) == [w for w, on in zip(kept, mask.tolist(), strict=True) if on]
    assert [c.tolist() for c in kept.copy().columns()] == [c.tolist() for c in queue.Windows(list(kept)).columns()]
    assert [c.tolist() for c in given.columns()] == [c.tolist() for c in queue.Windows(windows).columns()]


def promised(result) -> list[Waiting]:
    """The requests as the next pass reads them: each with the start and GPUs this plan promised."""
    return [dataclasses.replace(p.waiting, promised_at=p.start, promised_gpus=tuple(g.gpu_id for g in p.grants))
            for p in result]


@settings(max_examples=int(__import__("os").environ.get("QS_EXAMPLES", 150)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(schedules(), st.data())
def test_releases_never_move_a_promise_later_and_the_board_keeps_promises_as_the_walk_does(schedule, data):
    """Bookings that end sooner than booked (nothing else changes) move no promise later: each request
    plans around the others' promises and keeps its own where its earliest fit went later."""
    gpus, grants, waiting, quota, backfill, policy = schedule
    args = dict(gpus=gpus, waiting=waiting, now=T0, horizon=T0 + 48 * QUARTER, policy=policy, backfill=backfill)
    first = plan(**args, grants=grants, teams=teams_for(quota), keep_promises=True)
    released = [dataclasses.replace(g, ends_at=max(g.starts_at, T0, g.ends_at - data.draw(st.integers(0, 8)) * QUARTER))
                if data.draw(st.booleans()) else g for g in grants]
    # The next pass: what the plan started now holds its GPUs as bookings; those it could not start before
    # their not_after failed; those with no start at all have no promise to keep.
    released += [booking.Grant(gpu_id=g.gpu_id, reservation_id=p.waiting.reservation_id, starts_at=T0,
                               ends_at=T0 + p.waiting.duration) for p in first if p.start == T0 for g in p.grants]
    first = [p for p in first if p.start is not None and p.start > T0]
    args["waiting"] = promised(first)
    fast = plan(**args, grants=released, teams=teams_for(quota), keep_promises=True, board=True)
    walked = plan(**args, grants=released, teams=teams_for(quota), keep_promises=True, board=False)
    assert [(p.start, p.grants, p.reason) for p in fast] == [(p.start, p.grants, p.reason) for p in walked]
    for before, after in zip(first, fast, strict=True):
        assert after.start is not None and after.start <= before.start


def test_without_the_promises_held_a_release_can_move_a_promise_later():
    """Why the plan holds promises: re-planned from scratch, a request ahead that starts sooner may take the
    GPUs a later one was promised. Here A (1 GPU, 3 h) was planned on GPU 1 at +2 h and B (2 GPUs) at +5 h;
    the booking on GPU 2 ends at +1 h instead of +3 h, A now fits there at +1 h, and B's promise holds
    (plain re-planning gives B +4 h: earlier too, but a promise must hold whatever the engine picks)."""
    gpus = [booking.PoolGpu(id=i, node_id=1, node_name="n1", index=i - 1) for i in (1, 2)]
    grants = [booking.Grant(gpu_id=1, reservation_id=900, starts_at=T0 - QUARTER, ends_at=T0 + 8 * QUARTER),
              booking.Grant(gpu_id=2, reservation_id=901, starts_at=T0 - QUARTER, ends_at=T0 + 12 * QUARTER)]
    waiting = [Waiting(reservation_id=1, team_id=1, shape=booking.Shape(gpus=1), duration=12 * QUARTER,
                       queued_at=T0 - 2 * QUARTER),
               Waiting(reservation_id=2, team_id=1, shape=booking.Shape(gpus=2), duration=4 * QUARTER,
                       queued_at=T0 - QUARTER)]
    args = dict(gpus=gpus, now=T0, horizon=T0 + 96 * QUARTER, policy="portal", backfill=True, teams={},
                keep_promises=True)
    first = plan(**args, grants=grants, waiting=waiting)
    assert [p.start for p in first] == [T0 + 8 * QUARTER, T0 + 20 * QUARTER]
    released = [grants[0], dataclasses.replace(grants[1], ends_at=T0 + 4 * QUARTER)]
    again = plan(**args, grants=released, waiting=promised(first))
    assert again[0].start == T0 + 4 * QUARTER and again[1].start <= T0 + 20 * QUARTER


def test_a_newcomer_ordered_ahead_may_take_a_promised_start():
    gpus = [booking.PoolGpu(id=1, node_id=1, node_name="n1", index=0)]
    grants = [booking.Grant(gpu_id=1, reservation_id=900, starts_at=T0 - QUARTER, ends_at=T0 + 4 * QUARTER)]
    old = Waiting(reservation_id=2, team_id=1, shape=booking.Shape(gpus=1), duration=4 * QUARTER, queued_at=T0,
                  promised_at=T0 + 4 * QUARTER, promised_gpus=(1,))
    newcomer = Waiting(reservation_id=3, team_id=1, shape=booking.Shape(gpus=1), duration=4 * QUARTER,
                       queued_at=T0, priority=5)
    result = plan(gpus=gpus, grants=grants, waiting=[newcomer, old], now=T0, horizon=T0 + 96 * QUARTER,
                  policy="portal", backfill=True, teams={}, keep_promises=True)
    assert [p.start for p in result] == [T0 + 4 * QUARTER, T0 + 8 * QUARTER]


@pytest.mark.parametrize("on_board", [True, False])
def test_a_strict_queue_never_promises_a_start_after_the_requests_not_after(on_board):
    """The bug the promise property found: in a strict queue a request ahead that starts after the next one's
    not_after pushed its earliest start past its latest, and the walk then tried that start anyway and
    promised it (here B at +1 h with a not_after of +30 min). The pass fails such a request when its
    not_after passes, so the promise could never be kept: and the next pass, where the request ahead moved
    earlier, gave it no start at all, a promise moved later on a release. B gets no start now, and fails."""
    gpus = [booking.PoolGpu(id=i, node_id=1, node_name="n1", index=i - 1) for i in (1, 2)]
    grants = [booking.Grant(gpu_id=g, reservation_id=900, starts_at=T0 - QUARTER, ends_at=T0 + 4 * QUARTER)
              for g in (1, 2)]
    ahead = Waiting(reservation_id=1, team_id=1, shape=booking.Shape(gpus=1), duration=4 * QUARTER,
                    queued_at=T0 - 2 * QUARTER)
    bounded = Waiting(reservation_id=2, team_id=1, shape=booking.Shape(gpus=1), duration=4 * QUARTER,
                      queued_at=T0 - QUARTER, not_after=T0 + 2 * QUARTER)
    result = plan(gpus=gpus, grants=grants, waiting=[ahead, bounded], now=T0, horizon=T0 + 48 * QUARTER,
                  policy="portal", backfill=False, teams={}, keep_promises=True, board=on_board)
    assert [(p.start, p.reason) for p in result] == [(T0 + 4 * QUARTER, "not_enough"), (None, "no_start")]
    assert not result[1].grants


def test_the_walk_finds_no_start_where_the_earliest_is_after_the_latest():
    gpus = [booking.PoolGpu(id=1, node_id=1, node_name="n1", index=0)]
    assert earliest_fit(gpus=gpus, grants=[], shape=booking.Shape(gpus=1), duration=QUARTER, earliest=T0 + QUARTER,
                        latest=T0, policy="portal") == (None, [], "no_start")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-10, 20), st.integers(0, 10), st.integers(1, 4)),
                max_size=12),
       st.lists(st.tuples(st.sampled_from(["window", "hold", "release"]), st.integers(-5, 15), st.integers(1, 10),
                          st.integers(0, 5), st.integers(1, 6)), min_size=1, max_size=12),
       st.integers(1, 3), st.integers(1, 3), st.sampled_from(["portal", "first_fit", "random"]))
def test_the_kept_window_arrays_and_the_window_placer_answer_what_a_fresh_window_does(holds, steps, merge_at, count,
                                                                                      policy):
    """WholeGpuState.window_arrays rewrites only the rows whose holdings in the window changed since its last call,
    and WindowPlacer scores through a ScoreCache on them: window after window, with holdings held and released
    between (across the few's merges into the many), they give arrays_for_window's arrays and place()'s decisions."""
    from allocations.placement import PlacementRequest, place
    from allocations.placement.api import WindowPlacer

    gpus = [booking.PoolGpu(id=i, node_id=i // 3, node_name=f"n{i // 3}", index=i % 3) for i in range(9)]
    nodes = booking.PoolSnapshot(start=T0, end=T0, gpus=tuple(gpus), grants=()).state().nodes
    minute = timedelta(minutes=1)
    kept = WholeGpuState(nodes)
    kept.MERGE_AT = merge_at
    kept.hold([(gpu, T0 + s * minute, T0 + (s + n) * minute, rid) for gpu, s, n, rid in holds])
    placer = WindowPlacer(kept)
    for action, start, length, gpu, rid in steps:
        if action == "hold":
            kept.hold([(gpu, T0 + start * minute, T0 + (start + length) * minute, rid)])
        elif action == "release":
            kept.release(rid)
        window = (T0 + start * minute, T0 + (start + length) * minute)
        fresh = kept.arrays_for_window(*window)
        request = PlacementRequest(gpus=count, start=window[0].timestamp(), end=window[1].timestamp())
        expected = place(kept, request, policy)
        got = placer.place(request, policy)
        arrays = kept.window_arrays(*window)
        for field in ("gpu_free", "mig_used", "affinity", "cpu_free", "mem_free", "gpu_mem_free", "mig_media"):
            assert (getattr(fresh, field) == getattr(arrays, field)).all(), field
        assert got == expected


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, 15), max_size=10), st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=2,
                                                          max_size=6))
def test_a_window_placer_asked_under_another_profile_answers_as_place_does_under_it(held, asks):
    """A WindowPlacer's cached scores were made under the profile they were asked with: asked under another (one
    placer, profiles in turn), it answers what place() does under that one (it once kept the old scores and answered
    for the profile before)."""
    from allocations.placement import PlacementRequest, place
    from allocations.placement.api import WindowPlacer
    from allocations.placement.requests import Demand
    from allocations.placement.workload import WorkloadProfile

    profiles = {False: WorkloadProfile.from_demands([Demand(12_000, 48_000, 1, 1000)] * 10),
                True: WorkloadProfile.from_demands([Demand(48_000, 192_000, 4, 1000)] * 10)}
    gpus = [booking.PoolGpu(id=i, node_id=i // 4, node_name=f"n{i // 4}", index=i % 4) for i in range(16)]
    state = WholeGpuState(booking.PoolSnapshot(start=T0, end=T0, gpus=tuple(gpus), grants=()).state().nodes)
    state.hold([(gpu, T0, T0 + timedelta(hours=1), 100 + gpu) for gpu in sorted(held)])
    placer = WindowPlacer(state)
    for count, fours in asks:
        request = PlacementRequest(gpus=count, start=T0.timestamp(), end=(T0 + timedelta(minutes=30)).timestamp())
        assert placer.place(request, "portal", profile=profiles[fours]) == place(state, request, "portal",
                                                                                   profile=profiles[fours])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-20, 40), st.integers(0, 20)), max_size=14), st.data())
def test_the_timeline_booked_and_unbooked_has_the_gaps_of_one_built_from_its_windows(busy, data):
    """book splits a GPU's gap and unbook joins them again, in place where it can: after any of them the gaps are
    those of a timeline built afresh from the windows held. Enough steps to fill the room the columns keep for new
    gaps more than once; a copy taken on the way and changed in turn with the original keeps its own gaps."""
    node_of = [0, 0, 0, 1, 1, 2]
    usable = [True, True, False, True, True, True]
    windows = [(g, s, s + n) for g, s, n in busy]
    timeline = FreeTimeline(node_of, usable, windows)
    held: list[tuple[int, int, int]] = []

    def step(line: FreeTimeline, held: list[tuple[int, int, int]]) -> None:
        """Free one of `held` or book a window in one of `line`'s gaps, as the data draws."""
        if held and data.draw(st.booleans()):
            line.unbook(*held.pop(data.draw(st.integers(0, len(held) - 1))))
            return
        k = data.draw(st.integers(0, line.gap_gpu.size - 1))
        gpu, lo, hi = int(line.gap_gpu[k]), max(int(line.gap_from[k]), -30), min(int(line.gap_to[k]), 60)
        if hi > lo:
            start = data.draw(st.integers(lo, hi - 1))
            end = data.draw(st.integers(start + 1, hi))
            line.book(gpu, start, end)
            held.append((gpu, start, end))

    # (A gap a booking fills stays in the columns, emptied: gaps() leaves those out.)
    copy_at = data.draw(st.integers(0, 40))
    twin = None
    for k in range(data.draw(st.integers(1, 40))):
        if k == copy_at:
            twin, twin_held = timeline.copy(), list(held)
        step(timeline, held)
        assert timeline.gaps() == FreeTimeline(node_of, usable, windows + held).gaps()
        if twin is not None:
            step(twin, twin_held)
            assert twin.gaps() == FreeTimeline(node_of, usable, windows + twin_held).gaps()


def _board_and_frame(gpus, grants):
    frame = queue.PoolFrame(gpus)
    return queue.WholeGpuBoard(frame, grants, T0), frame


def _board_held_but(gpus, free, count, monkeypatch):
    """A board where every GPU but those at `free` ((node, index)) is held for the first four quarters, and
    choose_whole_gpus's answer for `count` GPUs in the first quarter; the board's engine then fails the test if
    asked."""
    grants = [booking.Grant(gpu_id=g.id, reservation_id=900, starts_at=T0, ends_at=T0 + 4 * QUARTER) for g in gpus
              if (g.node_id, g.index) not in free]
    board, _ = _board_and_frame(gpus, grants)
    window = booking.PoolSnapshot(start=T0, end=T0 + QUARTER, gpus=tuple(gpus), grants=tuple(grants))
    expected = booking.choose_whole_gpus(window, count, policy="portal")
    monkeypatch.setattr(board.placer, "place", lambda *a, **k: pytest.fail("the engine was asked"))
    return board, expected


def test_a_window_that_leaves_just_the_room_asked_gets_the_engines_choice_without_asking_the_engine(monkeypatch):
    """Two nodes of four GPUs; in the window only node 2's GPUs of index 3 and 1 are free (their ids in the other
    order): a request for two gets them, in slot order, as the engine gives them, and the engine is not asked."""
    gpus = [booking.PoolGpu(id=10 * node + (3 - index), node_id=node, node_name=f"n{node}", index=index)
            for node in (1, 2) for index in range(4)]
    board, expected = _board_held_but(gpus, {(2, 1), (2, 3)}, 2, monkeypatch)
    chosen, reason = board.choose(2, T0, T0 + QUARTER, "portal")
    assert reason == "" and [g.gpu_id for g in chosen] == expected == [22, 20]
    # Once the bookings end every GPU is free: a choice, so the engine is asked.
    with pytest.raises(pytest.fail.Exception):
        board.choose(1, T0 + 4 * QUARTER, T0 + 5 * QUARTER, "portal")


def test_a_window_with_one_node_roomy_enough_gets_its_first_slots_without_asking_the_engine(monkeypatch):
    """Three nodes of four GPUs; in the window node 1 has one GPU free, node 2 three (indexes 0, 2, 3) and node 3
    none: a request for two can only go on node 2, which takes its first two free slots, as the engine does, though
    the pool has more GPUs free than asked; a request for one has two nodes to choose from, so the engine is asked."""
    gpus = [booking.PoolGpu(id=10 * node + index, node_id=node, node_name=f"n{node}", index=index)
            for node in (1, 2, 3) for index in range(4)]
    board, expected = _board_held_but(gpus, {(1, 2), (2, 0), (2, 2), (2, 3)}, 2, monkeypatch)
    chosen, reason = board.choose(2, T0, T0 + QUARTER, "portal")
    assert reason == "" and [g.gpu_id for g in chosen] == expected == [20, 22]
    with pytest.raises(pytest.fail.Exception):
        board.choose(1, T0, T0 + QUARTER, "portal")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules(mixed=True), st.integers(1, 6), st.integers(-4, 16), st.integers(1, 8),
       st.sampled_from([(), ("A100",), ("H100",)]), st.sampled_from(sorted(POLICY_NAMES)))
def test_the_boards_choice_is_the_engines_whether_or_not_the_window_forces_it(schedule, count, start, length, models,
                                                                              policy):
    """WholeGpuBoard.choose answers booking.choose_whole_gpus on the window's grants (the engine, asked afresh), where
    the window leaves exactly the room asked (no engine) as elsewhere; unusable GPUs and models included. Every
    policy: a policy that chose whole GPUs other than by Policy.choose_gpus's first fit slots would fail here."""
    gpus, grants, *_ = schedule
    board, frame = _board_and_frame(gpus, grants)
    begin, end = T0 + start * QUARTER, T0 + (start + length) * QUARTER
    window = booking.PoolSnapshot(start=begin, end=end, gpus=tuple(gpus), grants=tuple(
        g for g in grants if g.starts_at < end and g.ends_at > begin and g.ends_at > g.starts_at))
    try:
        expected = booking.choose_whole_gpus(window, count, policy=policy, gpu_models=models)
    except booking.BookingRefused as refused:
        expected = queue._plan_reason(refused.code, models)
    chosen, reason = board.choose(count, begin, end, policy, models)
    assert ([g.gpu_id for g in chosen] if chosen is not None else reason) == expected
    if chosen is not None:
        assert [g.ge for g in chosen] == [frame.weight[g.gpu_id] for g in chosen]
