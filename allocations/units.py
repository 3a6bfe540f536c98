"""The portal's units, and the one sweep that finds a peak over time windows. Pure Python, no Django.

A grant's size is counted in milli-GPU (thousandths of one card): a whole GPU is
MILLI_PER_GPU, a MIG instance its compute slices out of MIG_COMPUTE_SLICES. Quotas,
budgets and the pages count GPU-equivalents (GE): milli-GPU / 1000 times the GPU model's
weight (1.0 unless staff weigh a model more or less). The placement engine, the quota
checks and the displays all convert through here, so a share or a slice is worth the same
everywhere.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, TypeVar

MILLI_PER_GPU = 1000
#: Compute slices of a whole MIG-capable GPU: a 7g instance is the whole card.
MIG_COMPUTE_SLICES = 7

T = TypeVar("T")  # an instant: a datetime, or seconds as a number


def mig_milli(compute_slices: int) -> int:
    """A MIG instance of `compute_slices` compute slices, in milli-GPU (1g = 143, 3g = 429, 7g = 1000)."""
    return round(MILLI_PER_GPU * compute_slices / MIG_COMPUTE_SLICES)


def share_slot_width(replicas: int) -> int:
    """Milli-GPU of one share of a card offered as `replicas` shares (time-slicing, MPS): every share is
    this wide, so k of them are worth the same wherever they sit; the rest of the card
    (1000 % replicas) is never granted."""
    return MILLI_PER_GPU // max(1, replicas)


def share_slots(milli: int, replicas: int) -> int:
    """How many shares a time-slicing or MPS grant of `milli` holds (a grant is a run of adjacent slots)."""
    return milli // share_slot_width(replicas)


def ge(milli: int, weight: float = 1.0) -> float:
    """GPU-equivalents of `milli` thousandths of a GPU whose model weighs `weight`."""
    return milli / MILLI_PER_GPU * weight


class Peak(NamedTuple):
    amount: float
    at: object | None  # the first instant the peak is reached; None when nothing overlaps


def peak(intervals: Iterable[tuple[T, T, float]], start: T, end: T) -> Peak:
    """The largest total amount held at one instant of [start, end), and the first instant it is reached.

    `intervals` are (start, end, amount), half-open: at equal instants releases count before
    acquisitions, so [a, b) and [b, c) never overlap. Parts outside [start, end) are ignored.
    """
    events: list[tuple[T, float]] = []
    for held_from, held_to, amount in intervals:
        lo, hi = max(held_from, start), min(held_to, end)
        if lo < hi and amount:
            events.append((lo, amount))
            events.append((hi, -amount))
    events.sort(key=lambda event: (event[0], event[1] > 0))
    best, running, best_at = 0, 0, None
    for instant, amount in events:
        running += amount
        if running > best:
            best, best_at = running, instant
    return Peak(best, best_at)
