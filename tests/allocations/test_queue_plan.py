"""The queue's plan on hand-made pools where the answer is known (no database): ordering, backfill,
strict order, the promise (start_by) and the estimate (likely_start)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from allocations import booking, queue
from allocations.queue import EarlyRelease, Waiting, parse_duration, plan

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)
H = timedelta(hours=1)


def node(node_id: int, gpus: int, first_id: int) -> list[booking.PoolGpu]:
    return [booking.PoolGpu(id=first_id + i, node_id=node_id, node_name=f"n{node_id}", index=i, model="H100",
                            memory_mib=81920) for i in range(gpus)]


def busy(gpu_ids, until: datetime, reservation_id: int = 900, since: datetime = T0 - H) -> list[booking.Grant]:
    return [booking.Grant(gpu_id=g, reservation_id=reservation_id, starts_at=since, ends_at=until) for g in gpu_ids]


def wait(rid: int, gpus: int, hours: float, queued_minutes_ago: int = 0, **kwargs) -> Waiting:
    return Waiting(reservation_id=rid, team_id=1, shape=booking.Shape(gpus=gpus), duration=hours * H,
                   queued_at=T0 - timedelta(minutes=queued_minutes_ago), **kwargs)


def planned(gpus, grants, waiting, backfill=True, **kwargs):
    result = plan(gpus=gpus, grants=grants, waiting=waiting, now=T0, horizon=T0 + 1000 * H, policy="portal",
                  backfill=backfill, teams={}, **kwargs)
    return {p.waiting.reservation_id: p for p in result}


def test_a_request_that_fits_starts_now():
    result = planned(node(1, 4, 1), busy([1, 2], T0 + 2 * H), [wait(1, 2, 1)])
    assert result[1].start == T0 and result[1].reason == "" and len(result[1].grants) == 2


def test_the_promise_is_where_the_booking_ends():
    result = planned(node(1, 4, 1), busy([1, 2, 3], T0 + 2 * H), [wait(1, 2, 1)])
    assert result[1].start == T0 + 2 * H
    assert result[1].reason == "not_enough"


def test_backfill_starts_a_short_request_that_ends_before_the_head_needs_the_room():
    gpus = node(1, 4, 1)
    # Two GPUs busy for 2 h; the head wants all four (promised at +2 h).
    grants = busy([1, 2], T0 + 2 * H)
    result = planned(gpus, grants, [wait(1, 4, 1, queued_minutes_ago=10), wait(2, 2, 1), wait(3, 2, 3)])
    assert result[1].start == T0 + 2 * H
    assert result[2].start == T0  # 1 h on the two free GPUs: done before the head starts
    # 3 h on them would run into the head's window: it goes after the head instead.
    assert result[3].start == T0 + 3 * H
    assert result[3].reason == "held_for_queue"


def test_without_backfill_nobody_starts_before_the_head():
    gpus = node(1, 4, 1)
    result = planned(gpus, busy([1, 2], T0 + 2 * H), [wait(1, 4, 1, queued_minutes_ago=10), wait(2, 2, 1)],
                     backfill=False)
    assert result[1].start == T0 + 2 * H
    assert result[2].start == T0 + 3 * H and result[2].reason == "behind"


def test_backfill_never_delays_anyone_ahead():
    """Planning later requests never moves the start of an earlier one: each start is the same as
    when that request was planned alone with those ahead of it."""
    gpus = node(1, 4, 1) + node(2, 4, 11)
    grants = busy([1, 2, 3], T0 + 2 * H) + busy([11], T0 + 5 * H, reservation_id=901)
    queue = [wait(i, gpus=(i % 4) + 1, hours=1 + i % 3, queued_minutes_ago=60 - i) for i in range(1, 13)]
    everyone = planned(gpus, grants, queue)
    for count in range(1, len(queue)):
        ahead = planned(gpus, grants, queue[:count])
        assert ahead[queue[count - 1].reservation_id].start == everyone[queue[count - 1].reservation_id].start


def test_not_before_and_not_after():
    gpus = node(1, 2, 1)
    result = planned(gpus, [], [wait(1, 1, 1, not_before=T0 + 3 * H)])
    assert result[1].start == T0 + 3 * H and result[1].reason == "not_before"
    result = planned(gpus, busy([1, 2], T0 + 5 * H), [wait(2, 1, 1, not_after=T0 + 2 * H)])
    assert result[2].start is None


def test_a_share_waits_for_a_free_slot():
    gpus = node(1, 1, 1)
    shape = booking.Shape(mode="time_slicing", shares=2, replicas=4)
    held = [booking.Grant(gpu_id=1, reservation_id=900, starts_at=T0 - H, ends_at=T0 + 2 * H, milli=750,
                          mode="time_slicing", share_from=0, share_to=750)]
    item = Waiting(reservation_id=1, team_id=1, shape=shape, duration=H, queued_at=T0)
    result = planned(gpus, held, [item])
    assert result[1].start == T0 + 2 * H


def test_the_estimate_uses_how_early_bookings_end():
    # Half of the pool's bookings used a fifth of their window, half the whole of it.
    history = EarlyRelease(tuple(sorted([0.2] * 10 + [1.0] * 10)))
    # Booked [T0 - 1 h, T0 + 9 h): 10 % run; the used shares above 0.1 are all twenty, median 0.2 → +1 h.
    assert history.expected_end(T0 - H, T0 + 9 * H, T0) == T0 + H
    # Past a fifth of its window already, the ones that used more say it runs to its end.
    assert history.expected_end(T0 - 5 * H, T0 + 5 * H, T0) == T0 + 5 * H
    # With too little history the booked end is the estimate.
    assert EarlyRelease((0.5,) * 3).expected_end(T0 - H, T0 + 9 * H, T0) == T0 + 9 * H


def test_the_estimate_is_never_after_the_promise_on_the_same_pool():
    gpus = node(1, 2, 1)
    grants = busy([1, 2], T0 + 9 * H, since=T0 - H)
    history = EarlyRelease(tuple(sorted([0.3] * 20)))
    promise = planned(gpus, grants, [wait(1, 2, 2)])[1].start
    shortened = [booking.Grant(gpu_id=g.gpu_id, reservation_id=g.reservation_id, starts_at=g.starts_at,
                               ends_at=history.expected_end(g.starts_at, g.ends_at, T0)) for g in grants]
    likely = planned(gpus, shortened, [wait(1, 2, 2)])[1].start
    assert promise == T0 + 9 * H and likely == T0 + 2 * H


@pytest.mark.parametrize("text, expected", [
    ("4h", 4 * H), ("30m", timedelta(minutes=30)), ("1d12h", 36 * H), ("90s", timedelta(seconds=90)),
    ("PT4H", 4 * H), ("P1DT2H30M", timedelta(days=1, hours=2, minutes=30)), ("pt45m", timedelta(minutes=45)),
])
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "4", "h", "P", "PT", "4 hours", "-4h", "P1Y", "4h4d"])
def test_not_durations(text):
    assert parse_duration(text) is None


def test_the_estimate_learns_from_bookings_of_about_the_same_length():
    # Short bookings run to their end, long ones are let go at a tenth.
    history = EarlyRelease(tuple(sorted([1.0] * 10 + [0.1] * 10)),
                           tuple([(1800.0, 1.0)] * 10 + [(86400.0, 0.1)] * 10))
    assert history.expected_end(T0, T0 + timedelta(minutes=30), T0) == T0 + timedelta(minutes=30)
    assert history.expected_end(T0, T0 + timedelta(days=1), T0) == T0 + timedelta(hours=2.4)
    assert history.expected_duration(timedelta(days=1)) == timedelta(hours=2.4)
    # A length nobody booked learns from all of them.
    assert history.expected_end(T0, T0 + 10 * H, T0) == T0 + H


def test_the_estimate_learns_from_bookings_of_the_same_length_first():
    # 1-hour bookings (runtimes rounded up to the next usual length) used 60-90 % of it; 2-hour ones a tenth.
    history = EarlyRelease(tuple(sorted([0.6] * 5 + [0.9] * 5 + [0.1] * 10)),
                           tuple([(3600.0, 0.6)] * 5 + [(3600.0, 0.9)] * 5 + [(7200.0, 0.1)] * 10))
    # Each length learns from its own (half to twice as long, both would read 0.1: 6 and 12 minutes).
    assert history.expected_end(T0, T0 + H, T0) == T0 + timedelta(minutes=36)
    assert history.expected_duration(H) == timedelta(minutes=36)
    assert history.expected_end(T0, T0 + 2 * H, T0) == T0 + timedelta(minutes=12)
    # A length nobody booked: those booked half to twice as long, all twenty (median 0.1).
    assert history.expected_end(T0, T0 + 1.5 * H, T0) == T0 + timedelta(minutes=9)
    # Fewer than MIN_HISTORY of its own length: those half to twice as long (five 1-hour, ten 2-hour: median 0.1).
    fewer = EarlyRelease(tuple(sorted([0.6] * 5 + [0.1] * 10)), tuple([(3600.0, 0.6)] * 5 + [(7200.0, 0.1)] * 10))
    assert fewer.expected_end(T0, T0 + H, T0) == T0 + timedelta(minutes=6)
    starts = np.array([queue.micro(T0)] * 3, dtype=np.int64)
    ends = starts + np.array([3600, 7200, 5400], dtype=np.int64) * 10**6
    assert ((history.expected_ends(starts, ends, queue.micro(T0)) - starts) // 60_000_000).tolist() == [36, 12, 9]


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
    used=st.lists(st.tuples(st.sampled_from([600.0, 1800.0, 2700.0, 3600.0, 7200.0, 86400.0, 7 * 86400.0]),
                            st.floats(0.001, 1.0)), max_size=40),
    windows=st.lists(st.tuples(st.integers(-10**11, 10**11), st.integers(-10**6, 40 * 86400 * 10**6)),
                     min_size=1, max_size=30))
def test_expected_ends_in_numpy_answer_what_expected_end_answers(used, windows):
    """The estimate's columnar expected_ends (every booking of the pool at once) mirrors expected_end: the same
    share by booked length, the same conditional median, the same rounding to the microsecond."""
    history = EarlyRelease(tuple(sorted(share for _, share in used)), tuple(used))
    now = queue.micro(T0)
    starts = np.array([now + offset for offset, _ in windows], dtype=np.int64)
    ends = np.array([start + length for start, (_, length) in zip(starts.tolist(), windows)], dtype=np.int64)
    expected = [queue.micro(history.expected_end(queue.instant_of(s), queue.instant_of(e), T0))
                for s, e in zip(starts.tolist(), ends.tolist())]
    assert history.expected_ends(starts, ends, now).tolist() == expected


def test_expected_ends_round_a_half_microsecond_as_timedelta_does():
    # 0.5 of 3 µs is 1.5 µs: timedelta rounds it half to even (2), as 2.5 rounds to 2.
    history = EarlyRelease((0.5,) * 10)
    for length in (3, 5, 2 * 10**12 + 1):
        start = queue.micro(T0) + 10
        got = history.expected_ends(np.array([start]), np.array([start + length]), queue.micro(T0))
        assert got.tolist() == [queue.micro(history.expected_end(queue.instant_of(start),
                                                                 queue.instant_of(start + length), T0))]


# --- likely_ends: the bookings' ends taken together (the median of the k-th end, not the k-th median) ------------

MINUTE = 60 * 10**6  # micros
UNIFORM = EarlyRelease(tuple((k + 0.5) / 200 for k in range(200)),
                       tuple((1800.0, (k + 0.5) / 200) for k in range(200)))  # 30-min bookings use U(0, 1) of it


def min_of_uniforms_median(n: int, minutes: float = 30.0) -> float:
    """The median of the first of n ends each uniform over `minutes`: 1 - (1 - F)^n = 1/2."""
    return minutes * (1 - 0.5 ** (1 / n))


def test_a_request_waiting_for_any_one_of_four_gpus_is_estimated_at_the_median_of_the_first_end():
    """Four GPUs, each booked alone for 30 min from now by a booking that ends uniformly within its window (the
    history says so): a 1-GPU request starts at the first of the four ends, whose median is 30 (1 - 2^-1/4) =
    4.8 min. Each booking at its own median (15 min) would say 15."""
    gpus = node(1, 4, 1)
    grants = [g for k in range(4) for g in busy([1 + k], T0 + 30 * timedelta(minutes=1), 900 + k, since=T0)]
    now = queue.micro(T0)
    starts = np.array([queue.micro(g.starts_at) for g in grants])
    ends = np.array([queue.micro(g.ends_at) for g in grants])
    assert np.allclose((UNIFORM.expected_ends(starts, ends, now) - now) / MINUTE, 15, atol=0.1)
    likely = UNIFORM.likely_ends(starts, ends, now, bookings=np.array([g.reservation_id for g in grants]))
    shortened = [booking.Grant(gpu_id=g.gpu_id, reservation_id=g.reservation_id, starts_at=g.starts_at,
                               ends_at=queue.instant_of(int(end))) for g, end in zip(grants, likely.tolist())]
    start = planned(gpus, shortened, [wait(1, 1, 0.5)])[1].start
    assert abs((start - T0) / timedelta(minutes=1) - min_of_uniforms_median(4)) < 0.3
    # The four are taken to end one after the other at the medians of the 1st to 4th of four uniform ends
    # (Beta(j, 5 - j) medians: 0.16, 0.39, 0.61, 0.84 of the window), each within a few seconds of a minute.
    order_medians = [0.1591, 0.3857, 0.6143, 0.8409]
    assert np.allclose(np.sort(likely - now) / MINUTE, [30 * m for m in order_medians], atol=0.35)


def test_a_lone_booking_ends_at_its_own_conditional_median():
    now = queue.micro(T0)
    starts, ends = np.array([now - 10 * MINUTE]), np.array([now + 20 * MINUTE])
    # Ran a third of its window: the shares above 1/3 are uniform on (1/3, 1), median 2/3: 20 min from its start.
    assert abs(UNIFORM.likely_ends(starts, ends, now)[0] - UNIFORM.expected_ends(starts, ends, now)[0]) < MINUTE / 10
    assert abs(UNIFORM.likely_ends(starts, ends, now)[0] - (now + 10 * MINUTE)) < MINUTE / 10


def test_a_reservations_grants_end_together_and_groups_are_taken_apart():
    now = queue.micro(T0)
    starts = np.full(8, now)
    ends = starts + 30 * MINUTE
    together = UNIFORM.likely_ends(starts, ends, now, bookings=np.array([1, 1, 2, 2, 3, 3, 4, 4]))
    assert together[0] == together[1] and together[2] == together[3] and together[6] == together[7]
    # Two groups of four (the GPUs of two nodes, the windows of two teams): each as if it were alone.
    alone = UNIFORM.likely_ends(starts[:4], ends[:4], now)
    apart = UNIFORM.likely_ends(starts, ends, now, groups=np.array([7, 7, 7, 7, 9, 9, 9, 9]))
    assert sorted(apart[:4].tolist()) == sorted(alone.tolist()) == sorted(apart[4:].tolist())


def test_likely_ends_with_too_little_history_are_the_booked_ends():
    now = queue.micro(T0)
    starts, ends = np.array([now - MINUTE, now]), np.array([now + 9 * MINUTE, now + 30 * MINUTE])
    assert EarlyRelease((0.5,) * 3).likely_ends(starts, ends, now).tolist() == ends.tolist()


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(
    used=st.lists(st.tuples(st.sampled_from([1800.0, 3600.0, 86400.0]), st.floats(0.001, 1.0)), min_size=10,
                  max_size=60),
    windows=st.lists(st.tuples(st.integers(-3 * 86400 * 10**6, 3600 * 10**6), st.integers(1, 3 * 86400 * 10**6)),
                     min_size=1, max_size=40))
def test_likely_ends_stay_in_the_window_and_keep_the_order_of_the_medians(used, windows):
    """Every likely end is within [now, booked end]; bookings not running keep expected_ends's answer; and the
    bookings that end in the order of their conditional medians (ties aside) also do in likely_ends, wherever
    the booked end does not hold one back."""
    history = EarlyRelease(tuple(sorted(share for _, share in used)), tuple(used))
    now = queue.micro(T0)
    starts = np.array([now + offset for offset, _ in windows], dtype=np.int64)
    ends = starts + np.array([length for _, length in windows], dtype=np.int64)
    medians, likely = history.expected_ends(starts, ends, now), history.likely_ends(starts, ends, now)
    running = (starts <= now) & (ends > now)
    assert (likely[~running] == medians[~running]).all()
    assert ((likely[running] >= now) & (likely[running] <= ends[running])).all()
    rows = np.flatnonzero(running)
    by_median = rows[np.argsort(medians[rows], kind="stable")]
    unclipped = likely[by_median] < ends[by_median]
    assert (np.diff(likely[by_median][unclipped]) >= 0).all()


def test_teams_windows_end_together_within_each_set_and_a_repeated_set_alike():
    """_ending_as_usual takes every team's windows in one call: each set as if alone, and the same set twice (a team's
    windows in the pool and everywhere, where it holds nothing elsewhere) the same answers."""
    now = queue.micro(T0)
    four = [(T0, T0 + timedelta(minutes=30), 1.0)] * 4
    one = [(T0 - timedelta(minutes=10), T0 + timedelta(minutes=20), 2.0)]
    sets = [queue.Windows(four), queue.Windows(four), queue.Windows(one), queue.Windows([])]
    moved = queue._ending_as_usual(UNIFORM, sets, now)
    assert [len(m) for m in moved] == [4, 4, 1, 0]
    alone = UNIFORM.likely_ends(*sets[0].columns()[:2], now)
    assert moved[0].columns()[1].tolist() == moved[1].columns()[1].tolist() == alone.tolist()
    assert [queue.micro(end) for _, end, _ in moved[0]] == alone.tolist()
    assert moved[2].columns()[1].tolist() == UNIFORM.likely_ends(*sets[2].columns()[:2], now).tolist()
    assert [ge for _, _, ge in moved[2]] == [2.0]


def test_a_small_group_reads_the_same_beside_a_large_one():
    """Points a booking are chosen per group: a team of four windows ends as it would alone, however many windows the
    other teams in the same call hold."""
    now = queue.micro(T0)
    small_starts, small_ends = np.full(4, now), np.full(4, now + 30 * MINUTE)
    rng = np.random.default_rng(3)
    big_starts = now - rng.integers(0, 29 * MINUTE, 3000)
    starts, ends = np.concatenate([small_starts, big_starts]), np.concatenate([small_ends, big_starts + 30 * MINUTE])
    together = UNIFORM.likely_ends(starts, ends, now, groups=np.repeat([1, 2], [4, 3000]))
    assert together[:4].tolist() == UNIFORM.likely_ends(small_starts, small_ends, now).tolist()
    assert abs(np.sort(together[:4])[0] - now - min_of_uniforms_median(4) * MINUTE) < 0.3 * MINUTE
