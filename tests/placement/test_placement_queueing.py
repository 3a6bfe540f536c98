"""Queue orderings, decaying fair share, and backfill that never delays the head."""

from __future__ import annotations

import math

import pytest

from allocations.placement import ClusterState, Holding, PlacementRequest, earliest_start, place
from allocations.placement.queueing import FairShare, QueuedItem, order_queue, schedule

from .conftest import make_node

H = 3600.0


def item(
    key: str, submitted: float, duration: float = H, priority: int = 0, team: str = "t", gpus: float = 1.0
) -> QueuedItem:
    return QueuedItem(
        key=key, team=team, submitted=submitted, duration=duration, priority=priority, resources={"gpu": gpus}
    )


def keys(items: list[QueuedItem]) -> list[str]:
    return [i.key for i in items]


def test_orderings() -> None:
    q = [item("a", 3, duration=50, priority=1), item("b", 1, duration=500), item("c", 2, duration=50, priority=5)]
    assert keys(order_queue(q, "fcfs")) == ["b", "c", "a"]
    assert keys(order_queue(q, "sjf")) == ["c", "a", "b"]
    assert keys(order_queue(q, "priority")) == ["c", "a", "b"]
    with pytest.raises(ValueError):
        order_queue(q, "lifo")


def test_fair_share_prefers_the_team_that_used_less() -> None:
    fs = FairShare({"gpu": 10}, half_life=H)
    fs.acquire("heavy", {"gpu": 8}, 0)
    fs.acquire("light", {"gpu": 1}, 0)
    q = [item("h", 0, team="heavy"), item("l", 1, team="light")]
    assert keys(order_queue(q, "fairshare", now=2 * H, fairshare=fs)) == ["l", "h"]


def test_fair_share_average_decays_with_the_half_life() -> None:
    fs = FairShare({"gpu": 10}, half_life=H)
    fs.acquire("t", {"gpu": 10}, 0)
    # Holding the whole pool, the average climbs toward 1: 1 - 2^-1 after one half-life.
    assert fs.share("t", H) == pytest.approx(0.5)
    fs.release("t", {"gpu": 10}, H)
    # Released: it decays by half per half-life.
    assert fs.share("t", 2 * H) == pytest.approx(0.25)
    assert fs.share("t", 3 * H) == pytest.approx(0.125)
    assert fs.share("idle", 3 * H) == 0


def test_fair_share_uses_the_dominant_resource_and_weights() -> None:
    fs = FairShare({"gpu": 10, "cpu": 100}, half_life=H, weights={"big": 2.0})
    fs.acquire("cpu-heavy", {"gpu": 1, "cpu": 90}, 0)
    fs.acquire("big", {"gpu": 4, "cpu": 10}, 0)
    tau = H / math.log(2)
    grown = 1 - math.exp(-H / tau)
    assert fs.share("cpu-heavy", H) == pytest.approx(0.9 * grown)
    assert fs.share("big", H) == pytest.approx(0.4 * grown / 2)


class Pool:
    """A pool of identical GPUs with known release times, for scheduling tests."""

    def __init__(self, free: int, releases: list[tuple[float, int]]) -> None:
        self.free, self.releases = free, releases
        self.reserved: tuple[float, int] | None = None

    def free_at(self, t: float) -> int:
        return self.free + sum(n for when, n in self.releases if when <= t)

    def try_start(self, it: QueuedItem, now: float) -> str | None:
        need = int(it.resources["gpu"])
        ends = now + it.duration
        # Running past the head's reserved start, it must leave what the head needs then.
        clashes = self.reserved is not None and ends > self.reserved[0]
        if clashes and self.free_at(self.reserved[0]) - self.reserved[1] < need:  # type: ignore[index]
            return None
        if self.free < need:
            return None
        self.free -= need
        self.releases.append((ends, need))
        return it.key

    def reserve(self, it: QueuedItem) -> None:
        need = int(it.resources["gpu"])
        t = min(when for when, _ in self.releases if self.free_at(when) >= need)
        self.reserved = (t, need)


def test_strict_fcfs_stops_at_the_blocked_head() -> None:
    pool = Pool(free=2, releases=[(10 * H, 4)])
    q = [item("big", 0, gpus=4), item("small", 1, gpus=1)]
    started = schedule(q, "fcfs", 0, lambda it: pool.try_start(it, 0), backfill=False)
    assert started == []


def test_backfill_starts_what_fits_around_the_head_reservation() -> None:
    pool = Pool(free=2, releases=[(10 * H, 4)])  # 6 GPUs from t=10h
    q = [item("big", 0, gpus=6), item("short", 1, duration=5 * H, gpus=2), item("long", 2, duration=20 * H, gpus=1)]
    started = schedule(q, "fcfs", 0, lambda it: pool.try_start(it, 0), reserve=pool.reserve)
    # The head needs all 6 at t=10h; "short" ends before that, "long" would take one of them.
    assert [k for _, k in started] == ["short"]
    assert pool.reserved == (10 * H, 6)


def test_backfill_depth_limits_the_scan() -> None:
    pool = Pool(free=1, releases=[(H, 5)])
    q = (
        [item("big", 0, gpus=6)]
        + [item(f"s{i}", 1 + i, duration=60, gpus=2) for i in range(5)]
        + [item("tiny", 9, duration=60, gpus=1)]
    )
    started = schedule(q, "fcfs", 0, lambda it: pool.try_start(it, 0), reserve=pool.reserve, backfill_depth=3)
    assert started == []  # "tiny" is beyond the depth


def test_backfill_with_time_windows_does_not_delay_the_head() -> None:
    """The engine's windows enforce the reservation: the head's future holding blocks overlap."""
    state = ClusterState(
        [make_node("n0", 4)],
        [Holding("n0", 0, 2 * H, gpu_id=f"n0-g{g}", milli=1000) for g in range(3)],  # 1 GPU free until 2h
    )
    head = PlacementRequest(gpus=4, start=0, end=3 * H)
    reserved = earliest_start(state, head)
    assert reserved is not None and reserved.start == 2 * H
    state = state.with_holdings(reserved.holdings(reservation_id="head"))
    # One GPU is free now: a 1-hour job fits before the head, a 3-hour job would collide.
    assert place(state, PlacementRequest(gpus=1, start=0, end=H)).ok
    assert place(state, PlacementRequest(gpus=1, start=0, end=3 * H)).code == "insufficient_capacity"
