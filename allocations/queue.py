"""The pool's queue: requests that wait for room, the plan that promises each a start, and the pass
that starts them.

A request may ask for a shape and a duration, to start as soon as it fits. If it does not fit
now it waits (`pending`, with a QueueEntry). A scheduling pass, under the same pool lock as a
create, orders the waiting requests by the pool's ordering (fcfs, sjf, priority, fair share) and
plans them one after the other on the pool's bookings as they are booked: each gets the earliest
start where booking.choose finds room for its whole duration and its team stays within quota,
and what it would hold there is added to the plan before the next one is planned. This is
conservative backfill: a later request starts now only where it takes nothing a request ahead
of it was planned on, so nobody ahead is delayed. Without backfill a request never starts
before one ahead of it.

The plan's start is the **promise** (`start_by`): it holds if every booking runs to its booked
end, and only a request ordered ahead later (a higher priority, a smaller fair share) or lost
capacity (a failover) can move it. New fixed-window bookings and extensions see the plan's
holdings as taken, so they cannot break it. The **estimate** (`likely_start`) is the same plan
with the bookings ending when the pool's bookings usually end, learnt from how much of their
booked window the pool's ended bookings really used, given what each has already run: not each
at its own median, but together, so that a request waiting for the k-th of n bookings to end
gets the median of that k-th end (EarlyRelease.likely_ends).

The pass runs after every event that frees capacity or adds a waiting request (`kick`,
coalesced) and periodically as a backstop (the sweep).
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import logging
import math
import operator
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_noop

from allocations import booking, notices, quotas, reclaim, selectors, units
from allocations.messages import Msg, json_param, msg_of, stored
from allocations.models import QueueEntry, Quota, Reservation
from allocations.placement.api import WindowPlacer
from allocations.placement.queueing import ORDERINGS, QueuedItem, order_queue
from allocations.placement.timeline import FreeTimeline, WholeGpuState
from allocations.placement.workload import demand_for
from allocations.transitions import move, record
from common import dispatch, sql
from common.dispatch import enqueue_after_commit
from common.errors import Conflict, instant
from inventory.models import GpuPool
from teams.models import Team
from inventory.sharing import SharingMode

log = logging.getLogger(__name__)
State = Reservation.State

# Why a request waits, by the code the plan gives (the engine's where it has one), in words.
REASONS = {
    "not_enough": gettext_noop("Not enough of the pool is free for it now."),
    "fragmented": gettext_noop("Enough is free in total, but not together on one GPU or node."),
    "over_quota": gettext_noop("Its team would go over its quota in the pool."),
    "held_for_queue": gettext_noop("What is free now is promised to requests ahead of it in the queue."),
    "behind": gettext_noop("Requests ahead of it start first: this pool's queue keeps strict order."),
    "not_before": gettext_noop("It asked not to start before its not_before time."),
    "no_model": gettext_noop("Not enough GPUs of the models it accepts are free for it now (or they are unhealthy "
                             "or drained)."),
    "no_start": gettext_noop("No start fits within the booking horizon, even if every booking ends on time."),
    "not_planned": gettext_noop("Not planned yet: each pass plans only the first requests of the queue in full; "
                                "it gets a promised start when it moves up."),
}
_ENGINE_CODES = {"insufficient_capacity": "not_enough", "no_gpu_model": "no_model", "too_large": "not_enough",
                 "mig_fragmented": "fragmented", "cpu_memory": "not_enough"}


def reason_words(code: str) -> Msg:
    """Why a request waits, for its code (str() of it: in the active language)."""
    return Msg(REASONS.get(code, gettext_noop("It does not fit now.")))


# --- durations ---------------------------------------------------------------------------------

_SHORT = re.compile(r"^\s*(?:(\d+)d)?\s*(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s)?\s*$")
_ISO = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")


def parse_duration(text: str) -> timedelta | None:
    """'4h', '30m', '1d12h', '90s' or an ISO 8601 duration of days, hours, minutes and seconds
    ('PT4H', 'P1DT2H'); None when it is neither."""
    text = str(text).strip()
    match = _ISO.match(text.upper()) if text.upper().startswith("P") else _SHORT.match(text.lower())
    if not match or not any(match.groups()) or text.upper() in ("P", "PT"):
        return None
    days, hours, minutes, seconds = (int(group or 0) for group in match.groups())
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


# --- the plan (no database) ----------------------------------------------------------------------

@dataclass(frozen=True)
class Waiting:
    """A waiting request as the plan sees it."""

    reservation_id: int
    team_id: int
    shape: booking.Shape
    duration: timedelta
    queued_at: datetime
    not_before: datetime | None = None
    not_after: datetime | None = None
    priority: int = 0
    # The last pass's promise: its start and the GPUs it was planned on (none before its first pass).
    promised_at: datetime | None = None
    promised_gpus: tuple[int, ...] = ()


class Windows(Sequence):
    """A team's windows (start, end, GE) as quotas counts them, kept as columns: starts and ends as microseconds
    since the epoch and GE (`columns`); the plan only appends to it. The board adds up the windows that overlap each
    start it tries, and the estimate shortens them all, both in NumPy; the (start, end, GE) tuples are made only
    where a window is read as one (quotas.held_error, over the few windows that overlap a start where the sum says
    the team could go over). Reading a team's thousands of windows as datetimes, turning them into microseconds per
    board and the estimate's back into datetimes cost a fifth of reading a queue."""

    def __init__(self, windows: Iterable[quotas.Window] = (), *,
                 columns: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        """`columns`: the windows' (starts, ends, GE) columns, where the caller has them: then `windows` may be left
        out, and the tuples are made from the columns when read."""
        rows = list(windows)
        if columns is None:
            columns = (np.array([micro(start) for start, _, _ in rows], dtype=np.int64),
                       np.array([micro(end) for _, end, _ in rows], dtype=np.int64),
                       np.array([float(amount) for _, _, amount in rows], dtype=np.float64))
        self._given = len(columns[0])  # windows given at the start (the rest are `_added`)
        self._rows: list[quotas.Window] | None = rows if rows or not self._given else None  # None: not made yet
        self._columns = (self._given, *columns)
        self._own = False  # whether the columns are this Windows' own, to append into
        self._added: list[quotas.Window] = []

    def __len__(self) -> int:
        return self._given + len(self._added)

    def _all(self) -> list[quotas.Window]:
        if self._rows is None:
            starts, ends, ge = (column[:self._given].tolist() for column in self._columns[1:])
            self._rows = [(instant_of(start), instant_of(end), amount)
                          for start, end, amount in zip(starts, ends, ge, strict=True)] + self._added
        return self._rows

    def __getitem__(self, k):
        return self._all()[k]

    def __iter__(self):
        return iter(self._all())

    def append(self, window: quotas.Window) -> None:
        self._added.append(window)
        if self._rows is not None:
            self._rows.append(window)

    def copy(self) -> Windows:
        return Windows(columns=self.columns()) if self._rows is None else Windows(self._rows, columns=self.columns())

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The windows' starts and ends (micro) and GE, as int64, int64 and float columns in their order (views:
        read them before the next append)."""
        seen, starts, ends, ge = self._columns
        if seen != len(self):
            tail = self._added[seen - self._given:]  # the one or two the plan appended since
            if seen + len(tail) > len(starts) or not self._own:
                # Room for as many again: the plan appends a window per request it plans, and copying a team's
                # thousands of windows for each one cost more than the quota check that reads them. A Windows
                # writes only into columns it made itself (those it was given may be another's).
                room = max(2 * (seen + len(tail)), 16)
                starts, ends, ge = (np.concatenate([column[:seen], np.zeros(room - seen, dtype=column.dtype)])
                                    for column in (starts, ends, ge))
                self._own = True
            starts[seen:seen + len(tail)] = [micro(start) for start, _, _ in tail]
            ends[seen:seen + len(tail)] = [micro(end) for _, end, _ in tail]
            ge[seen:seen + len(tail)] = [float(amount) for _, _, amount in tail]
            self._columns = (len(self), starts, ends, ge)
        n = self._columns[0]
        return starts[:n], ends[:n], ge[:n]

    def picked(self, mask: np.ndarray) -> list[quotas.Window]:
        """The windows `mask` picks (in their order), made from the columns: reading a few of a team's thousands
        makes only those."""
        starts, ends, ge = self.columns()
        return [(instant_of(start), instant_of(end), amount) for start, end, amount in
                zip(starts[mask].tolist(), ends[mask].tolist(), ge[mask].tolist(), strict=True)]

    def overlapping(self, start: datetime, end: datetime) -> np.ndarray:
        """Which windows overlap [start, end) (a mask in their order)."""
        starts, ends, _ = self.columns()
        return (starts < micro(end)) & (ends > micro(start))


@dataclass
class TeamHolding:
    """A team's quota in the pool and what it holds (its grants' windows, then the plan's), in GE."""

    quota: quotas.QuotaLimits
    in_pool: Windows
    everywhere: Windows
    # Windows the plan holds for the team's other promised requests while it plans one of them (plan's
    # keep_promises): they count in the pool and everywhere.
    promised: list[quotas.Window] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("in_pool", "everywhere"):
            if not isinstance(getattr(self, name), Windows):
                setattr(self, name, Windows(getattr(self, name)))


@dataclass(frozen=True)
class Planned:
    """Where the plan puts a waiting request: its start (None: nowhere before its not_after or the
    horizon) and the grants it would get there; `reason` says why it does not start now ('' if it does)."""

    waiting: Waiting
    start: datetime | None
    grants: tuple[booking.NewGrant, ...]
    reason: str

    def starts_now(self, now: datetime) -> bool:
        return self.start is not None and self.start <= now


def _overlapping(grants: Sequence[booking.Grant], start: datetime, end: datetime) -> tuple[booking.Grant, ...]:
    return tuple(g for g in grants if g.starts_at < end and g.ends_at > start and g.ends_at > g.starts_at)


def _whole_gpus_short(gpus: Sequence[booking.PoolGpu], grants: Sequence[booking.Grant], count: int,
                      start: datetime, end: datetime) -> str:
    """Why `count` whole GPUs cannot be free for [start, end) ('' when they could): on one node when one
    node has that many usable GPUs, else in total (booking.choose_whole_gpus's rule). Counted in plain
    Python so the plan runs the engine only at starts where it can succeed: a pass tries many starts,
    and each choose builds the pool's arrays anew (12 ms for 400 GPUs here, 2 ms for this)."""
    busy = {g.gpu_id for g in grants if g.starts_at < end and g.ends_at > start and g.ends_at > g.starts_at}
    usable: dict[int, int] = defaultdict(int)
    free: dict[int, int] = defaultdict(int)
    for gpu in gpus:
        if gpu.usable:
            usable[gpu.node_id] += 1
            free[gpu.node_id] += gpu.id not in busy
    if sum(free.values()) < count:
        return "not_enough"
    if count <= max(usable.values(), default=0) and max(free.values(), default=0) < count:
        return "fragmented"
    return ""


def _try(gpus, grants, shape, start, end, policy, profile=None) -> tuple[list[booking.NewGrant] | None, str]:
    if shape.mode == SharingMode.EXCLUSIVE:
        allowed = [gpu for gpu in gpus if gpu.model in shape.gpu_models] if shape.gpu_models else gpus
        short = _whole_gpus_short(allowed, grants, shape.gpus, start, end)
        if short:
            # Short of GPUs of the models it accepts: say so (booking.choose's no_gpu_model does the same).
            return None, "no_model" if short == "not_enough" and shape.gpu_models else short
    snapshot = booking.PoolSnapshot(start=start, end=end, gpus=gpus, grants=_overlapping(grants, start, end),
                                    profile=profile)
    try:
        return booking.choose(snapshot, shape, policy=policy), ""
    except booking.BookingRefused as refused:
        return None, _plan_reason(refused.code, shape.gpu_models)


def _plan_reason(code: str, models: Sequence[str]) -> str:
    """The plan's reason for a refusal's code (the engine's where it has one); short of room on the models a
    request accepts, `no_model` (booking.choose's no_gpu_model; the board's choose asks the engine directly)."""
    reason = _ENGINE_CODES.get(code, code)
    return "no_model" if reason == "not_enough" and models else reason


def earliest_fit(*, gpus: Sequence[booking.PoolGpu], grants: Sequence[booking.Grant], shape: booking.Shape,
                 duration: timedelta, earliest: datetime, latest: datetime, policy: str,
                 team: TeamHolding | None = None, borrow_at: datetime | None = None, profile=None
                 ) -> tuple[datetime | None, list[booking.NewGrant], str]:
    """The first start in [earliest, latest] where `shape` fits for `duration` among `grants` (and the
    team stays within its quota, or borrows within its limit when it starts at `borrow_at`: now), the
    grants it gets there, and why it did not fit at `earliest` ('' when it did). Room only grows where
    a grant ends, so those are the only starts to try. None where `earliest` is after `latest`: no start
    is in the range (a strict queue's request ahead, or its not_before, past its not_after or the horizon).
    `profile`: the pool's workload profile (booking.PoolSnapshot.profile), for the policies that weigh it."""
    if earliest > latest:
        return None, [], "no_start"
    candidates = {earliest}
    candidates.update(g.ends_at for g in grants if earliest < g.ends_at <= latest)
    if team is not None:
        candidates.update(end for _, end, _ in (*team.in_pool, *team.everywhere, *team.promised)
                          if earliest < end <= latest)
    first_reason = ""
    for start in sorted(candidates):
        end = start + duration
        chosen, reason = _try(gpus, grants, shape, start, end, policy, profile)
        if chosen is not None and team is not None:
            error = quotas.held_error(team.quota, ge=sum(g.ge for g in chosen), asked=shape.in_words(),
                                      field="", start=start, end=end, in_pool=[*team.in_pool, *team.promised],
                                      everywhere=[*team.everywhere, *team.promised], may_borrow=start == borrow_at)
            if error is not None:
                chosen, reason = None, "over_quota"
        if chosen is not None:
            return start, chosen, first_reason
        first_reason = first_reason or reason
    return None, [], first_reason or "no_start"


def _as_grants(reservation_id: int, chosen: Sequence[booking.NewGrant], start: datetime,
               end: datetime) -> list[booking.Grant]:
    return [booking.Grant(gpu_id=g.gpu_id, reservation_id=reservation_id, starts_at=start, ends_at=end,
                          milli=g.milli, mig_profile=g.mig_profile, mig_start=g.mig_start, mode=g.mode,
                          share_from=g.share_from, share_to=g.share_to, memory_mib=g.memory_mib,
                          cores_pct=g.cores_pct) for g in chosen]


_MICROSECOND = timedelta(microseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micro(at: datetime) -> int:
    """An instant as whole microseconds since the epoch (exact, as sql.instant_column reads it)."""
    return (at - _EPOCH) // _MICROSECOND


def micros(instants) -> np.ndarray:
    """micro() of each, as an int64 column."""
    return np.fromiter((micro(at) for at in instants), dtype=np.int64)


def instant_of(us: int) -> datetime:
    """micro()'s inverse: an aware datetime in UTC."""
    return _EPOCH + timedelta(microseconds=us)


class PoolFrame:
    """A pool's GPUs as the plan's boards index them, built once per pass: the engine's nodes (in
    booking.PoolSnapshot.state()'s order), each GPU's rank, node rank and weight."""

    def __init__(self, gpus: Sequence[booking.PoolGpu], key: tuple | None = None) -> None:
        self.gpus = tuple(gpus)
        self.key = key if key is not None else self.key_of(self.gpus)
        self.rank = {gpu.id: k for k, gpu in enumerate(self.gpus)}
        node_rank: dict[int, int] = {}
        # As arrays: each board's timeline takes them as they are.
        self.node_of = np.array([node_rank.setdefault(gpu.node_id, len(node_rank)) for gpu in self.gpus],
                                dtype=np.int64)
        self.usable = np.array([gpu.usable for gpu in self.gpus], dtype=bool)
        self.gpu_ids = np.array([gpu.id for gpu in self.gpus], dtype=object)
        self.most_per_node = booking.most_usable_on_a_node(self.gpus)
        self.weight = {gpu.id: gpu.weight for gpu in self.gpus}
        self.usable_ids = {gpu.id for gpu in self.gpus if gpu.usable}
        self.state = WholeGpuState(booking.engine_nodes(self.gpus))
        self.state.base_arrays()  # built once; every board's state shares it
        # Per rank, the GPU's (node, slot) in the engine's state; and the ids sorted, to rank a column of them at once.
        slots = [self.state.gpu_slot(gpu.id) for gpu in self.gpus]
        self.engine_node = np.array([n for n, _ in slots], dtype=np.int64)
        self.engine_slot = np.array([slot for _, slot in slots], dtype=np.int64)
        ids = np.fromiter((gpu.id for gpu in self.gpus), dtype=np.int64, count=len(self.gpus))
        self._by_id = np.argsort(ids, kind="stable")
        self._ids_sorted = ids[self._by_id]
        self._of_models: dict[tuple[str, ...], tuple[np.ndarray, int]] = {}
        self._whole_fit: dict[tuple[int, tuple[str, ...]], np.ndarray] = {}

    def ranks(self, gpu_ids: np.ndarray) -> np.ndarray:
        """Each GPU id's rank (`rank`'s answer), -1 for a GPU not in the pool, for a column of ids at once."""
        if not self._ids_sorted.size:
            return np.full(len(gpu_ids), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._ids_sorted, gpu_ids), self._ids_sorted.size - 1)
        return np.where(self._ids_sorted[at] == gpu_ids, self._by_id[at], -1)

    def same_gpus(self, gpus: Sequence[booking.PoolGpu]) -> bool:
        """Whether `gpus` are this frame's GPUs: the same objects (booking.pool_snapshot hands out the same PoolGpu
        for a row while it reads the same, and PoolGpu is immutable), else equal keys."""
        if len(gpus) == len(self.gpus) and all(map(operator.is_, gpus, self.gpus)):
            return True
        return self.key == self.key_of(gpus)

    def of_models(self, models: Sequence[str]) -> tuple[np.ndarray | None, int]:
        """For a request that accepts only `models`: per GPU (rank), whether it is of one of them, and the most
        usable GPUs of them one node has; (None, most_per_node) for a request that accepts any."""
        if not models:
            return None, self.most_per_node
        key = tuple(models)
        if key not in self._of_models:
            allowed = np.array([gpu.model in models for gpu in self.gpus], dtype=bool)
            self._of_models[key] = (allowed, booking.most_usable_on_a_node(
                [gpu for gpu in self.gpus if gpu.model in models]))
        return self._of_models[key]

    def whole_fit(self, count: int, models: Sequence[str]) -> np.ndarray:
        """Per GPU (rank), whether the engine would fit choose_whole_gpus's request for `count` GPUs of `models` on
        it where nothing holds it (WholeGpuState.whole_fit_when_free): the same for every window, so once a frame."""
        key = (count, tuple(models))
        if key not in self._whole_fit:
            demand = demand_for(booking.whole_gpu_request(count, 0.0, 1.0, models))
            self._whole_fit[key] = self.state.whole_fit_when_free(demand)[self.engine_node, self.engine_slot]
        return self._whole_fit[key]

    @staticmethod
    def key_of(gpus: Sequence[booking.PoolGpu]) -> tuple:
        """What the frame is built from (a GPU's MIG devices play no part in whole-GPU plans)."""
        return tuple((g.id, g.node_id, g.node_name, g.index, g.model, g.memory_mib, g.usable, g.node_cpu_milli,
                      g.node_memory_mib, g.weight) for g in gpus)


_frames: dict[int, PoolFrame] = {}  # per pool, the last pass's frame


def _whole_cards(grants: Iterable[booking.Grant]) -> bool:
    """Whether every grant holds a whole card: no vGPU, no MIG slice, a whole card's milli."""
    vgpu = SharingMode.VGPU  # (Grant.is_vgpu, without its call per grant: a pass reads thousands)
    return all(g.mode != vgpu and not g.mig_profile and g.milli >= units.MILLI_PER_GPU for g in grants)


class GrantColumns(Sequence):
    """A pool's grants (a Sequence of them) with each one's GPU, reservation and window as NumPy columns in the same
    order, built once a pass for both plans' boards: the boards read only the columns, and a pass turned the same
    6,212 grants into columns four times. The windows are microseconds since the epoch (micros). The estimate's
    grants are the same grants ending earlier (`ending`): as columns at once; as Grant objects only where something
    reads them one by one (the plan without a board, a borrow), because making thousands of them cost a tenth of
    the estimate."""

    def __init__(self, grants: Sequence[booking.Grant], times: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """`times`: the grants' starts and ends as micros, where the caller has them."""
        self._grants = tuple(grants)
        count = len(self._grants)
        self.gpu_ids = np.fromiter((g.gpu_id for g in self._grants), dtype=np.int64, count=count)
        self.reservation_ids = np.fromiter((g.reservation_id for g in self._grants), dtype=np.int64, count=count)
        self.starts, self.ends = times if times is not None else (micros(g.starts_at for g in self._grants),
                                                                   micros(g.ends_at for g in self._grants))
        self._booked_ends = self.ends  # the grants' own ends (`ending` moves `ends` only)
        self.whole = _whole_cards(self._grants)  # for WholeGpuBoard.fits, once for both plans

    def ending(self, ends: np.ndarray) -> GrantColumns:
        """The same grants, each ending at its entry of `ends` (micros) instead."""
        twin = object.__new__(GrantColumns)
        twin.__dict__.update(self.__dict__)
        twin.ends = ends
        twin.__dict__.pop("_moved", None)
        return twin

    @functools.cached_property
    def _moved(self) -> tuple[booking.Grant, ...]:
        """The grants as the columns say, those whose end moved made anew (Grant.ending_at)."""
        if self.ends is self._booked_ends:
            return self._grants
        moved = list(self._grants)
        for k in np.flatnonzero(self.ends != self._booked_ends).tolist():
            moved[k] = moved[k].ending_at(instant_of(int(self.ends[k])))
        return tuple(moved)

    def __len__(self) -> int:
        return len(self._grants)

    def __getitem__(self, k):
        return self._moved[k]

    def __iter__(self):
        return iter(self._moved)


class WholeGpuBoard:
    """The plan's pool when every request asks whole GPUs and every booking holds whole cards (an
    exclusive pool): what is free when, kept up to date as the plan books, so each request's earliest
    fit is one sweep (placement.timeline.FreeTimeline) and the engine scores each chosen start on
    arrays masked from the same bookings (placement.timeline.WholeGpuState), not rebuilt per start.
    It answers exactly what earliest_fit's walk over candidate starts answers (the tests compare them)."""

    def __init__(self, frame: PoolFrame, grants: Sequence[booking.Grant] | GrantColumns, origin: datetime,
                 profile=None) -> None:
        """`grants`: as GrantColumns where the caller has them (else they are made here); `profile`: the pool's
        workload profile, for the policies that weigh it."""
        self.frame, self.gpus, self.origin, self.profile = frame, frame.gpus, origin, profile
        self.most_per_node = frame.most_per_node
        # Each window once as microseconds since the epoch: the timeline counts from `origin` in them, the
        # engine in seconds (us / 1e6 is exactly what datetime.timestamp() gives).
        columns = grants if isinstance(grants, GrantColumns) else GrantColumns(grants)
        starts, ends, ranks = columns.starts, columns.ends, frame.ranks(columns.gpu_ids)
        mine = np.flatnonzero((ranks >= 0) & (ends > starts))
        starts, ends, ranks = starts[mine], ends[mine], ranks[mine]
        at = micro(origin)
        self.timeline = FreeTimeline(frame.node_of, frame.usable, (ranks, starts - at, ends - at))
        self.state = frame.state.copy()
        self.state.hold_slots(frame.engine_node[ranks], frame.engine_slot[ranks], starts / 1e6, ends / 1e6,
                              columns.reservation_ids[mine])
        self.placer = WindowPlacer(self.state)
        # Where a gap opens (the starts earliest_fit tries, as micros), each with how many windows end there.
        opens, count = np.unique(ends, return_counts=True)
        self.ends: list[int] = opens.tolist()
        self.end_count: dict[int, int] = defaultdict(int, zip(self.ends, count.tolist(), strict=True))

    def copy(self) -> WholeGpuBoard:
        """The board as it is now, to book on apart."""
        twin = object.__new__(WholeGpuBoard)
        twin.__dict__.update(self.__dict__)
        twin.timeline, twin.state, twin.ends = self.timeline.copy(), self.state.copy(), list(self.ends)
        twin.placer = WindowPlacer(twin.state)
        twin.end_count = defaultdict(int, self.end_count)
        return twin

    @staticmethod
    def fits(shapes: Sequence[booking.Shape], grants: Sequence[booking.Grant] | GrantColumns) -> bool:
        """Whether the board can plan these: whole-GPU requests among bookings of whole cards only."""
        return (all(shape.mode == SharingMode.EXCLUSIVE for shape in shapes)
                and (grants.whole if isinstance(grants, GrantColumns) else _whole_cards(grants)))

    def _t(self, at: datetime) -> int:
        return (at - self.origin) // _MICROSECOND

    def book(self, reservation_id: int, chosen: Sequence[booking.NewGrant], start: datetime, end: datetime) -> None:
        if end <= start:
            return
        ranks = [self.frame.rank[grant.gpu_id] for grant in chosen]
        for rank in ranks:
            self.timeline.book(rank, self._t(start), self._t(end))
        # state.hold's holdings, each GPU's (node, slot) from the frame and the window in seconds as to_seconds
        # gives them (micro / 1e6 is datetime.timestamp(), exactly).
        self.state.hold_slots(self.frame.engine_node[ranks], self.frame.engine_slot[ranks],
                              [micro(start) / 1e6] * len(ranks), [micro(end) / 1e6] * len(ranks),
                              [reservation_id] * len(ranks))
        opens = micro(end)
        self.end_count[opens] += len(chosen)
        k = bisect.bisect_left(self.ends, opens)
        if k == len(self.ends) or self.ends[k] != opens:
            self.ends.insert(k, opens)

    def unbook(self, reservation_id: int, gpu_ids: Sequence[int], start: datetime, end: datetime) -> None:
        """Take back what `book` booked for the reservation (a promise held for it, when it is planned anew)."""
        for gpu_id in gpu_ids:
            self.timeline.unbook(self.frame.rank[gpu_id], self._t(start), self._t(end))
        self.state.release(reservation_id)
        opens = micro(end)
        self.end_count[opens] -= len(gpu_ids)
        if self.end_count[opens] <= 0:
            del self.end_count[opens]
            del self.ends[bisect.bisect_left(self.ends, opens)]

    def free_on(self, gpu_ids: Sequence[int], start: datetime, end: datetime) -> bool:
        """Whether each of these GPUs is usable and its whole card free over [start, end)."""
        free = self.timeline.free_for(self._t(start), self._t(end))
        return all(gpu_id in self.frame.rank and free[self.frame.rank[gpu_id]] for gpu_id in gpu_ids)

    def short(self, count: int, start: datetime, end: datetime, models: Sequence[str] = ()) -> str:
        """_whole_gpus_short's answer, from the timeline (among the GPUs of `models` where it names some)."""
        allowed, most_per_node = self.frame.of_models(models)
        free = self.timeline.free_for(self._t(start), self._t(end))
        if allowed is not None:
            free &= allowed
        per_node = np.bincount(self.timeline.gpu_node[free], minlength=1)
        if int(free.sum()) < count:
            return "no_model" if models else "not_enough"
        if count <= most_per_node and int(per_node.max()) < count:
            return "fragmented"
        return ""

    def choose(self, count: int, start: datetime, end: datetime, policy: str, models: Sequence[str] = ()
               ) -> tuple[list[booking.NewGrant] | None, str]:
        """booking.choose's whole GPUs for [start, end) on the board (of `models` where it names some)."""
        allowed, most_per_node = self.frame.of_models(models)
        free = self.timeline.free_for(self._t(start), self._t(end))
        if allowed is not None:
            free &= allowed
        if 0 < count <= most_per_node:
            forced = self._forced(count, models, free)
            if forced is not None:
                return [booking.NewGrant(gpu_id=gpu_id, ge=self.frame.weight[gpu_id]) for gpu_id in forced], ""
        window = booking.PoolSnapshot(start=start, end=end, gpus=self.gpus, grants=())
        try:
            ids = booking.choose_whole_gpus(window, count, policy=policy, state=self.state,
                                            free=_FreeGpus(self.gpus, free),
                                            most_per_node=most_per_node, gpu_models=models, profile=self.profile,
                                            placer=self.placer)
        except booking.BookingRefused as refused:
            return None, _plan_reason(refused.code, models)
        return [booking.NewGrant(gpu_id=gpu_id, ge=self.frame.weight[gpu_id]) for gpu_id in ids], ""

    def _forced(self, count: int, models: Sequence[str], free: np.ndarray) -> list[int] | None:
        """The GPUs the engine must choose for `count` GPUs on one node where the window leaves it no choice of node
        (None where it may have one): the cards it fits there are the frame's whole fit less those held in the
        window, which are those the timeline has busy (`free`: the board keeps both from the same windows); where
        one node alone has `count` of them or more, it is the only node the engine's filter passes (a node is
        feasible where `count` of its cards fit: feasibility.feasible_nodes), and whole-GPU slots are the first
        `count` fit by slot (policies.base.whole_slots, every policy's), so every policy picks them, in slot order.
        In a full pool a request's earliest fit is usually where just the room it needs opens, and asking the
        engine there (its window's arrays and scores) was half of planning a request. That room is often on one
        node while other nodes have a card or two free, fewer than a request for several GPUs asks: those windows
        are forced too (asking the engine for 2-8 GPUs cost 0.5-2 ms a window, the portal policy's adjust a third)."""
        ranks = np.flatnonzero(free & self.frame.whole_fit(count, models))
        if ranks.size < count:
            return None
        nodes = self.frame.node_of[ranks]
        roomy = np.flatnonzero(np.bincount(nodes) >= count)
        if roomy.size != 1:
            return None
        ranks = ranks[nodes == roomy[0]]
        ranks = ranks[np.argsort(self.frame.engine_slot[ranks], kind="stable")][:count]
        return [self.gpus[rank].id for rank in ranks.tolist()]

    def within_quota(self, team: TeamHolding, ge: float, start: datetime, end: datetime) -> bool:
        """quotas.held_error(...) is None, asked only where the team's windows that overlap [start, end), added
        up, could go over (their peak is at most their sum): a team holds thousands of windows, and the
        peak over them is a sort in Python."""
        quota = team.quota
        promised = [w for w in team.promised if w[0] < end and w[1] > start]
        held = sum(amount for _, _, amount in promised)
        in_pool = team.in_pool.overlapping(start, end)
        fine = float(team.in_pool.columns()[2][in_pool].sum()) + held + ge <= quota.max_ge + 1e-9
        # (The windows across pools count only under a team-wide cap.)
        everywhere = team.everywhere.overlapping(start, end) if quota.team_max_ge is not None else None
        if fine and everywhere is not None:
            fine = float(team.everywhere.columns()[2][everywhere].sum()) + held + ge <= quota.team_max_ge + 1e-9
        if fine:
            return True
        return quotas.held_error(quota, ge=ge, asked="", field="", start=start, end=end,
                                 in_pool=team.in_pool.picked(in_pool) + promised,
                                 everywhere=(team.everywhere.picked(everywhere) if everywhere is not None else [])
                                 + promised) is None

    def earliest_fit(self, *, shape: booking.Shape, duration: timedelta, earliest: datetime, latest: datetime,
                     policy: str, team: TeamHolding | None = None
                     ) -> tuple[datetime | None, list[booking.NewGrant], str]:
        """earliest_fit on the board: the timeline finds the first start where enough cards are free
        (where the walk's room check would first pass); the engine and the quota check decide there, and
        where either refuses, the search goes on from the walk's next candidate start."""
        models = shape.gpu_models
        allowed, most_per_node = self.frame.of_models(models)
        count, together = shape.gpus, shape.gpus <= most_per_node
        first_reason: str | None = None
        at = earliest
        while at is not None:
            found = self.timeline.earliest(count, duration // _MICROSECOND, self._t(at), self._t(latest),
                                           together=together, allowed=allowed)
            if found is None:
                break
            start = self.origin + found * _MICROSECOND
            if first_reason is None and start > earliest:
                first_reason = self.short(count, earliest, earliest + duration, models)
            chosen, reason = self.choose(count, start, start + duration, policy, models)
            if chosen is not None and team is not None and not self.within_quota(
                    team, sum(g.ge for g in chosen), start, start + duration):
                chosen, reason = None, "over_quota"
            if chosen is not None:
                return start, chosen, first_reason or ""
            first_reason = first_reason or reason
            at = self._next_candidate(start, latest, team)
        if first_reason is None:
            first_reason = self.short(count, earliest, earliest + duration, models)
        return None, [], first_reason or "no_start"

    def _next_candidate(self, after: datetime, latest: datetime, team: TeamHolding | None) -> datetime | None:
        """The next start earliest_fit's walk tries after `after`: where a booking or the team's holding ends."""
        after_us = micro(after)
        k = bisect.bisect_right(self.ends, after_us)
        options = [self.ends[k]] if k < len(self.ends) else []
        if team is not None:
            for windows in (team.in_pool, team.everywhere):
                ends = windows.columns()[1]
                later = ends[ends > after_us]
                if later.size:
                    options.append(int(later.min()))
            options.extend(micro(end) for _, end, _ in team.promised if end > after)
        nxt = min(options, default=None)
        return instant_of(nxt) if nxt is not None and nxt <= micro(latest) else None


class _FreeGpus(Sequence):
    """The pool's GPUs free for a window (a mask over the board's ranks), as choose_whole_gpus takes them:
    counted at once, listed only where it walks them (a request larger than any node, or one that names
    models). Listing thousands of free GPUs for every window the plan tried cost more than the engine's choice."""

    def __init__(self, gpus: Sequence[booking.PoolGpu], mask: np.ndarray) -> None:
        self._gpus, self._ranks = gpus, np.flatnonzero(mask)

    def __len__(self) -> int:
        return int(self._ranks.size)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self._gpus[r] for r in self._ranks[k].tolist()]
        return self._gpus[int(self._ranks[k])]

    def __iter__(self):
        return (self._gpus[r] for r in self._ranks.tolist())


@dataclass(frozen=True)
class _Pin:
    """A promise the plan holds for a request while the requests ahead of it are planned."""

    start: datetime
    end: datetime
    gpu_ids: tuple[int, ...]
    team_id: int
    ge: float

    def grants(self, reservation_id: int) -> list[booking.Grant]:
        return [booking.Grant(gpu_id=gpu_id, reservation_id=reservation_id, starts_at=self.start, ends_at=self.end)
                for gpu_id in self.gpu_ids]


def _pinned(pins: dict[int, _Pin]) -> list[booking.Grant]:
    """The promises held, as grants."""
    return [g for rid, pin in pins.items() for g in pin.grants(rid)]


def _free_on(grants: Sequence[booking.Grant], usable: set[int], gpu_ids: Sequence[int], start: datetime,
             end: datetime) -> bool:
    """Whether each of these GPUs is usable and no grant holds it at some instant of [start, end)."""
    wanted = set(gpu_ids)
    return wanted <= usable and not any(g.gpu_id in wanted and g.starts_at < end and g.ends_at > start
                                        and g.ends_at > g.starts_at for g in grants)


def plan(*, gpus: Sequence[booking.PoolGpu], grants: Sequence[booking.Grant], waiting: Sequence[Waiting],
         now: datetime, horizon: datetime, policy: str, backfill: bool, teams: dict[int, TeamHolding],
         hold_for: Callable[[Waiting], timedelta] | None = None, depth: int | None = None,
         board: bool = True, frame: PoolFrame | None = None, keep_promises: bool = False,
         profile=None) -> list[Planned]:
    """Plan `waiting` (in queue order) one after the other, each at its earliest fit among `grants`
    and the plan's holdings of the requests before it. `hold_for` is how long a planned request
    holds what it gets (its duration unless given: the estimate shortens it). `teams` is updated
    with the plan's holdings.

    `keep_promises`: a request's last promise (`promised_at` on `promised_gpus`, whole GPUs) is an upper
    bound. Each request the last pass promised plans around the promises of the others, and where its
    earliest fit is later than its promise it keeps the promise, on the same GPUs, if they are still free
    for it then. So the plan only moves a promise later where a request new since the last pass is ordered
    ahead of it (it plans as if no promise were held: the order decides) or capacity was lost (its GPUs
    failed, or a failover put a booking on them). Reservations in Maui and Moab's backfill work the same
    way: held from cycle to cycle, only ever moved earlier.

    `depth`: only the first `depth` requests are planned; the rest get no start (reason
    `not_planned`) and take nothing, as Slurm's backfill tests only its first bf_max_job_test jobs
    each cycle: the pass's time stays bounded however long the queue grows. `board`: plan exclusive
    pools on a WholeGpuBoard (the same answers, computed incrementally; False walks every candidate
    start with booking.choose, the reference the tests compare it with); `frame`: the pool's GPUs
    indexed for it, where the caller plans more than once; `grants` may be GrantColumns (the boards read their
    columns, and the grants are made only where the walk reads them); `profile`: the pool's workload profile
    (booking.PoolSnapshot's), for the policies that weigh it."""
    added: list[booking.Grant] = []  # the plan's holdings, as grants, for the walk (`grants` and these are taken)
    latest_planned = now
    planned: list[Planned] = []
    head = list(waiting[:depth] if depth is not None else waiting)
    fast = board and WholeGpuBoard.fits([w.shape for w in waiting], grants)
    frame = (frame or PoolFrame(gpus)) if fast else None
    open_board = WholeGpuBoard(frame, grants, now, profile) if fast else None  # bookings and the plan
    bookings_board = open_board.copy() if open_board is not None else None  # the bookings alone
    usable = frame.usable_ids if frame is not None else {gpu.id for gpu in gpus if gpu.usable}
    weight = frame.weight if frame is not None else {gpu.id: gpu.weight for gpu in gpus}
    # The promises held, and (where the plan is on boards) a board with them booked too.
    pins: dict[int, _Pin] = {}
    pinned_board = open_board.copy() if open_board is not None and keep_promises else None
    if keep_promises:
        for item in head:
            if (item.promised_at is None or item.promised_at <= now or item.shape.mode != SharingMode.EXCLUSIVE
                    or len(item.promised_gpus) != item.shape.gpus):
                continue
            if not set(item.promised_gpus) <= usable:
                continue
            pin = _Pin(item.promised_at, item.promised_at + item.duration, item.promised_gpus, item.team_id,
                       sum(weight[g] for g in item.promised_gpus))
            if pinned_board is not None:
                if pinned_board.free_on(pin.gpu_ids, pin.start, pin.end):
                    pinned_board.book(item.reservation_id, [booking.NewGrant(gpu_id=g, ge=weight[g])
                                                            for g in pin.gpu_ids], pin.start, pin.end)
                    pins[item.reservation_id] = pin
            elif _free_on([*grants, *(g for rid, p in pins.items() for g in p.grants(rid))], usable, pin.gpu_ids,
                          pin.start, pin.end):
                pins[item.reservation_id] = pin
    for position, item in enumerate(waiting):
        if depth is not None and position >= depth:
            planned.append(Planned(waiting=item, start=None, grants=(), reason="not_planned"))
            continue
        earliest = max(now, item.not_before or now)
        if not backfill:
            earliest = max(earliest, latest_planned)  # strict order: never before one ahead of it
        latest = min(horizon, item.not_after) if item.not_after else horizon
        team = teams.get(item.team_id)
        own = pins.pop(item.reservation_id, None)
        was_promised = keep_promises and item.promised_at is not None
        if was_promised and team is not None:
            # Its team's quota counts what is promised to the team's other requests, as the GPUs do.
            team = dataclasses.replace(team, promised=[(p.start, p.end, p.ge) for p in pins.values()
                                                       if p.team_id == item.team_id])
        room = pinned_board if was_promised else open_board
        if own is not None and pinned_board is not None:
            pinned_board.unbook(item.reservation_id, own.gpu_ids, own.start, own.end)
        # The walk (no board) sees the promises held for the others as grants; a board has them booked.
        others = _pinned(pins) if was_promised and room is None else []
        if earliest > latest:
            # No start in [earliest, latest]: in a strict queue the request ahead starts after its not_after
            # (or its not_before is past it or the horizon). It gets no start, never one after its not_after:
            # the pass fails it now rather than promise a start it will fail at when not_after passes.
            start, chosen, reason = None, [], "no_start"
        elif room is not None:
            start, chosen, reason = room.earliest_fit(shape=item.shape, duration=item.duration, earliest=earliest,
                                                      latest=latest, policy=policy, team=team)
        else:
            start, chosen, reason = earliest_fit(gpus=gpus, grants=[*grants, *added, *others], shape=item.shape,
                                                 duration=item.duration, earliest=earliest, latest=latest,
                                                 policy=policy, team=team, profile=profile)
        if own is not None and (start is None or start > own.start) and earliest <= own.start <= latest:
            free = (room.free_on(own.gpu_ids, own.start, own.end) if room is not None
                    else _free_on([*grants, *added, *others], usable, own.gpu_ids, own.start, own.end))
            kept = [booking.NewGrant(gpu_id=g, ge=weight[g]) for g in own.gpu_ids]
            if free and (team is None or quotas.held_error(
                    team.quota, ge=sum(g.ge for g in kept), asked="", field="", start=own.start, end=own.end,
                    in_pool=[*team.in_pool, *team.promised], everywhere=[*team.everywhere, *team.promised]) is None):
                start, chosen = own.start, kept
        if start is not None and start > now:
            reason = _why_later(item, now, reason, gpus, grants, policy, backfill, earliest, board=bookings_board,
                                profile=profile)
        elif start is None:
            reason = reason or "no_start"
        if start is not None:
            end = start + (hold_for(item) if hold_for else item.duration)
            added.extend(_as_grants(item.reservation_id, chosen, start, end))
            if not was_promised:
                # A request new since the last pass, ordered ahead: the promises it takes room from are void.
                ids = {g.gpu_id for g in chosen}
                for rid, pin in list(pins.items()):
                    if pin.start < end and pin.end > start and ids & set(pin.gpu_ids):
                        del pins[rid]
                        if pinned_board is not None:
                            pinned_board.unbook(rid, pin.gpu_ids, pin.start, pin.end)
            for each in (open_board, pinned_board):
                if each is not None:
                    each.book(item.reservation_id, chosen, start, end)
            ge = sum(g.ge for g in chosen)
            if team is not None:
                team.in_pool.append((start, end, ge))
                team.everywhere.append((start, end, ge))
            latest_planned = max(latest_planned, start)
        planned.append(Planned(waiting=item, start=start, grants=tuple(chosen), reason=reason))
    return _borrow_idle(planned, grants, added, gpus=gpus, now=now, policy=policy, teams=teams, hold_for=hold_for,
                        profile=profile)


def _borrow_idle(planned: list[Planned], grants: Sequence[booking.Grant], added: list[booking.Grant], *, gpus,
                 now: datetime, policy: str, teams: dict[int, TeamHolding], hold_for, profile=None) -> list[Planned]:
    """Where the pool lends idle GPUs, a request held back only by its team's quota starts now on what
    nobody's plan holds (borrowing within its team's limit): after everyone is planned without
    borrowing, so borrowing never takes room a request within its quota was planned on. `grants` and `added`
    (the plan's) are what is taken; listed together only where a request may borrow."""
    taken: list[booking.Grant] | None = None
    for index, entry in enumerate(planned):
        item, team = entry.waiting, teams.get(entry.waiting.team_id)
        if (team is None or team.quota.borrow <= 0 or entry.starts_now(now) or entry.reason != "over_quota"
                or (item.not_before and item.not_before > now)):
            continue
        if taken is None:
            taken = [*grants, *added]
        others = [g for g in taken if g.reservation_id != item.reservation_id]
        start, chosen, _ = earliest_fit(gpus=gpus, grants=others, shape=item.shape, duration=item.duration,
                                        earliest=now, latest=now, policy=policy, team=team, borrow_at=now,
                                        profile=profile)
        if start is None:
            continue
        end = now + (hold_for(item) if hold_for else item.duration)
        taken[:] = [*others, *_as_grants(item.reservation_id, chosen, now, end)]
        team.in_pool.append((now, end, sum(g.ge for g in chosen)))
        planned[index] = Planned(waiting=item, start=now, grants=tuple(chosen), reason="")
    return planned


def _why_later(item: Waiting, now: datetime, reason: str, gpus, grants, policy, backfill, earliest,
               board: WholeGpuBoard | None = None, profile=None) -> str:
    """The reason a request planned later than now waits, in the plan's terms. `board`: the bookings
    alone on a WholeGpuBoard, where the plan has one."""
    if item.not_before and item.not_before > now:
        return "not_before"
    if not backfill and earliest > now:
        return "behind"
    if reason in ("not_enough", "fragmented", "no_model", ""):
        # Room now among the bookings alone, but not among the plan's holdings: promised ahead.
        if board is not None:
            end = now + item.duration
            models = item.shape.gpu_models
            chosen = (board.choose(item.shape.gpus, now, end, policy, models)[0]
                      if not board.short(item.shape.gpus, now, end, models) else None)
        else:
            chosen, _ = _try(gpus, grants, item.shape, now, now + item.duration, policy, profile)
        if chosen is not None:
            return "held_for_queue"
    return reason or "not_enough"


# --- when bookings really end (the estimate) ------------------------------------------------------

@dataclass(frozen=True)
class EarlyRelease:
    """How much of its booked window each of the pool's recent ended bookings used (0-1, ascending), and
    (`by_length`) each one's booked length in seconds with that share."""

    used: tuple[float, ...]
    by_length: tuple[tuple[float, float], ...] = ()

    MIN_HISTORY = 10

    #: Booked lengths within this factor of each other are the same length (the usual lengths, 30 min, 1 h, 2 h, ...,
    #: are at least 1.5 apart).
    SAME_LENGTH = 1.05
    #: The booked lengths a booking learns from, narrowest first: within SAME_LENGTH of its own, then half to twice
    #: as long; the first with MIN_HISTORY bookings, else all (shares and _alike_groups both follow it).
    ALIKE_RATIOS = (SAME_LENGTH, 2.0)

    def shares(self, length: timedelta) -> tuple[float, ...]:
        """The used shares of bookings booked as long as `length` (within SAME_LENGTH), where there are
        MIN_HISTORY of them, else of those booked about as long (half to twice), else of all: a booking of 30
        minutes and one of 30 days are not let go alike, nor one of 1 hour and one of 2. (Runtime predictors for
        batch queues condition on the requested time the same way; and a booking that rounds its runtime up to
        the next usual length uses more than half of it, where one of the length below may use any share.)"""
        seconds = length.total_seconds()
        lengths = self._lengths
        for ratio in self.ALIKE_RATIOS:
            first, last = bisect.bisect_left(lengths, seconds / ratio), bisect.bisect_right(lengths, seconds * ratio)
            if last - first >= self.MIN_HISTORY:
                return self._between(first, last)
        return self.used

    def _between(self, first: int, last: int) -> tuple[float, ...]:
        """The used shares of the bookings `first` to `last` (excluded) by booked length, ascending."""
        if (first, last) not in self._alike:  # a pass asks for thousands of bookings of a few lengths
            self._alike[first, last] = tuple(sorted(used for _, used in self._by_length_sorted[first:last]))
        return self._alike[first, last]

    @functools.cached_property
    def _by_length_sorted(self) -> list[tuple[float, float]]:
        return sorted(self.by_length)

    @functools.cached_property
    def _lengths(self) -> list[float]:
        return [booked for booked, _ in self._by_length_sorted]

    @functools.cached_property
    def _alike(self) -> dict[tuple[int, int], tuple[float, ...]]:
        return {}

    @functools.cached_property
    def _alike_columns(self) -> dict[tuple[int, int], np.ndarray]:
        return {}

    def expected_end(self, start: datetime, end: datetime, now: datetime) -> datetime:
        """When a booking of [start, end) is likely to end, given it runs at `now`: the median of the
        used shares above what it has run so far (the conditional median), never before now."""
        if len(self.used) < self.MIN_HISTORY or end <= start:
            return end
        used = self.shares(end - start)
        ran = max(0.0, (now - start) / (end - start))
        later = used[bisect.bisect_right(used, ran):]
        if not later:
            return end
        share = later[(len(later) - 1) // 2]
        return min(end, max(now, start + (end - start) * share))

    def expected_ends(self, starts: np.ndarray, ends: np.ndarray, now: int) -> np.ndarray:
        """expected_end for many windows at once, each end in whole microseconds since the epoch (int64 columns,
        `now` too): the same answers, in NumPy, because the estimate asks it for every booking of the pool and
        every window its teams hold (thousands a pass, 10 µs each in Python). The tests compare the two."""
        out = ends.copy()
        live = np.flatnonzero(ends > starts)
        if len(self.used) < self.MIN_HISTORY or not live.size:
            return out
        start, end = starts[live], ends[live]
        length = end - start
        seconds = length / 1e6  # timedelta.total_seconds(), exactly (both are correctly rounded divisions)
        ran = np.maximum(0.0, (now - start) / length)
        share = np.full(live.size, np.nan)
        for rows, used in self._alike_groups(seconds):
            k = np.searchsorted(used, ran[rows], "right")  # bisect_right: the shares above what it has run
            later = used.size - k
            share[rows] = np.where(later > 0, used[np.minimum(k + (later - 1) // 2, used.size - 1)], np.nan)
        has = ~np.isnan(share)
        # timedelta * float rounds the exact product half to even; the float product is within 1e-3 of it,
        # so only a product that close to a half can round otherwise: those are done as timedelta does.
        product = length * np.where(has, share, 0.0)
        moved = np.rint(product).astype(np.int64)
        for j in np.flatnonzero(has & (np.abs(product - np.floor(product) - 0.5) < 1e-3)):
            moved[j] = (timedelta(microseconds=int(length[j])) * float(share[j])) // _MICROSECOND
        out[live[has]] = np.minimum(end, np.maximum(now, start + moved))[has]
        return out

    #: Points of each running booking's conditional end distribution that likely_ends sums (at the levels
    #: (q + ½) / points), at least ENDING_POINTS: the expected count of ended bookings M is read between them.
    ENDING_POINTS = 4
    ENDING_POINTS_A_GROUP = 1024  # more points a booking where a group has few (up to 256): M read finer, still cheap

    def likely_ends(self, starts: np.ndarray, ends: np.ndarray, now: int, bookings: np.ndarray | None = None,
                    groups: np.ndarray | None = None) -> np.ndarray:
        """When the bookings [starts, ends) running at `now` (micros) likely end, taken together: in each group
        (`groups`; one group where None), the j-th of its bookings to end (in the order of their conditional
        medians, `expected_ends`) ends at the median of the group's j-th end.

        Why not each at its own median: a request that waits for any k of n bookings starts at the k-th of their
        ends, and the k-th smallest of n medians is far later than the median of the k-th smallest end (the
        first of 8 bookings that each end at their median in 10 minutes ends within 10 minutes with
        probability 1 - 2^-8). The count of a group's bookings ended by t has mean M(t) = the sum over them of
        P(it has ended by t) (the history's conditional distribution, read at `points` quantiles of each). Were
        the n bookings alike, M(t) = n F(t), and F at the j-th of n ends is a Beta(j, n - j + 1) variable, whose
        median is about (j - 1/3) / (n + 1/3) (Kerman 2011): so the j-th end is taken where
        M(t) = n (j - 1/3) / (n + 1/3): a lone booking at its own median, the first of 8 alike where each has
        ended with probability 8 %, the j-th of many where M reaches j - 1/3, as for Poisson ends.

        `bookings`: rows with the same id and window are one booking (a reservation's grants, one per GPU).
        Bookings not running at `now` (not started, or of no length) keep expected_ends's answer."""
        if len(self.used) < self.MIN_HISTORY:
            return ends.copy()
        running = (starts <= now) & (ends > now)
        out = ends.copy()
        if not running.all():
            out[~running] = self.expected_ends(starts[~running], ends[~running], now)
        running = np.flatnonzero(running)
        if not running.size:
            return out
        if bookings is not None:  # one row per booking: the first of each (id, start, end)
            ids, first_at, last_at = bookings[running], starts[running], ends[running]
            by = np.lexsort((last_at, first_at, ids))
            new = np.ones(by.size, dtype=bool)
            new[1:] = (np.diff(ids[by]) != 0) | (np.diff(first_at[by]) != 0) | (np.diff(last_at[by]) != 0)
            back = np.empty(by.size, dtype=np.int64)
            back[by] = np.cumsum(new) - 1
            rows = running[by[new]]
        else:
            rows, back = running, None
        start, end = starts[rows], ends[rows]
        length = end - start
        ran = (now - start) / length
        group = (np.unique(groups[rows], return_inverse=True)[1].ravel() if groups is not None
                 else np.zeros(rows.size, dtype=np.int64))
        size = np.bincount(group)
        # Points a booking, by group: more where the group is small, so that M is read finely where one end matters.
        per = np.clip(self.ENDING_POINTS_A_GROUP // size, self.ENDING_POINTS, 256)
        points = per[group]
        owner = np.repeat(np.arange(rows.size), points)  # each point's booking
        level = (np.arange(owner.size) - np.repeat(np.cumsum(points) - points, points) + 0.5) / points[owner]
        # Each booking's used shares above what it has run: from `first` in `shares` (every alike set's, one after
        # the other), `later` of them (none: it runs to its end).
        first, later = np.zeros(rows.size, dtype=np.int64), np.zeros(rows.size, dtype=np.int64)
        columns, base = [], 0
        for alike, used in self._alike_groups(length / 1e6):
            k = np.searchsorted(used, ran[alike], "right")
            first[alike], later[alike] = base + k, used.size - k
            columns.append(used)
            base += used.size
        shares = np.concatenate([*columns, [1.0]])  # the 1.0 after: a booking with none later indexes in range
        has = later > 0
        median = np.where(has, start + length * shares[first + np.maximum(later - 1, 0) // 2], end)
        pick = first[owner] + np.floor(level * later[owner]).astype(np.int64)
        at = np.where(has[owner], start[owner] + length[owner] * shares[pick], end[owner])
        at = np.minimum(np.maximum(at, now), end[owner])
        # Each group's points in time order, the groups one after the other: in group g, M(its i-th point) =
        # (i + 1/2) / per[g], each point standing in the middle of its step.
        by_time = np.argsort(at)
        expected = at[by_time[np.argsort(group[owner][by_time], kind="stable")]] if groups is not None else at[by_time]
        first_point = np.cumsum(size * per) - size * per
        order = np.lexsort((median, group))  # by group, then by conditional median
        mine = group[order]
        n, each = size[mine].astype(np.float64), per[mine]
        j = np.arange(rows.size) - (np.cumsum(size) - size)[mine] + 1.0
        where = np.clip(n * (j - 1 / 3) / (n + 1 / 3) * each - 0.5, 0, n * each - 1)
        below = np.floor(where).astype(np.int64)
        above = np.minimum(below + 1, (n * each - 1).astype(np.int64))
        low, high = expected[first_point[mine] + below], expected[first_point[mine] + above]
        likely = np.empty(rows.size, dtype=np.int64)
        likely[order] = np.rint(low + (where - below) * (high - low)).astype(np.int64)
        likely = np.minimum(np.maximum(likely, now), end)
        out[running] = likely[back] if back is not None else likely
        return out

    def _alike_groups(self, seconds: np.ndarray):
        """(rows, used shares) for bookings of booked lengths `seconds`, as shares() groups them: the bookings
        booked as long, where there are MIN_HISTORY of them, else those booked half to twice as long, else all."""
        lengths = self._length_column
        first, last = np.full(seconds.size, -1), np.full(seconds.size, -1)  # -1: all of them
        for ratio in reversed(self.ALIKE_RATIOS):  # widest first, so the narrowest set with MIN_HISTORY wins
            low = np.searchsorted(lengths, seconds / ratio, "left")
            high = np.searchsorted(lengths, seconds * ratio, "right")
            enough = high - low >= self.MIN_HISTORY
            first, last = np.where(enough, low, first), np.where(enough, high, last)
        for f, l in set(zip(first.tolist(), last.tolist(), strict=True)):
            yield np.flatnonzero((first == f) & (last == l)), self._used_column(f, l)

    @functools.cached_property
    def _length_column(self) -> np.ndarray:
        return np.array(self._lengths, dtype=np.float64)

    def _used_column(self, first: int, last: int) -> np.ndarray:
        """The used shares of the bookings `first` to `last` by booked length (all where first < 0), as an array."""
        if (first, last) not in self._alike_columns:
            self._alike_columns[first, last] = np.array(self.used if first < 0 else self._between(first, last),
                                                        dtype=np.float64)
        return self._alike_columns[first, last]

    def expected_duration(self, duration: timedelta) -> timedelta:
        if len(self.used) < self.MIN_HISTORY:
            return duration
        used = self.shares(duration)
        return duration * max(used[(len(used) - 1) // 2], 0.01)


def early_release(pool_id: int, now: datetime) -> EarlyRelease:
    """The pool's last QUEUE_HISTORY ended bookings, each as the share of its booked window it used."""
    # Read as micros (sql.instant_column: PostgreSQL's timestamptz loader is Python, and these are 1,500 a pass);
    # the same figures as timedelta gives them: total_seconds() and timedelta / timedelta divide the microseconds.
    rows = sql.fetch_all(
        f"SELECT {sql.instant_column('starts_at')}, {sql.instant_column('ends_at')}, {sql.instant_column('ended_at')} "
        "FROM allocations_reservation "
        "WHERE pool_id = %s AND state IN ('released', 'expired') AND ended_at IS NOT NULL AND ended_at > starts_at "
        "AND ends_at > starts_at AND ended_at <= %s ORDER BY ended_at DESC LIMIT %s",
        [pool_id, sql.db_datetime(now), settings.QUEUE_HISTORY])
    pairs = [((end - start) / 1_000_000, min(1.0, (ended - start) / (end - start)))
             for start, end, ended in ((sql.instant_micros(a), sql.instant_micros(b), sql.instant_micros(c))
                                       for a, b, c in rows)]
    return EarlyRelease(tuple(sorted(used for _, used in pairs)), tuple(pairs))


# --- reading a pool's queue -------------------------------------------------------------------------

@dataclass
class PoolQueue:
    """A locked pool with its waiting requests (in queue order) and what the plan needs to plan them."""

    pool: GpuPool
    now: datetime
    horizon: datetime
    snapshot: booking.PoolSnapshot
    waiting: list[Waiting]
    entries: dict[int, Entry]
    teams: dict[int, TeamHolding]
    _frame: PoolFrame | None = dataclasses.field(default=None, init=False, repr=False)
    _columns: tuple | None = dataclasses.field(default=None, init=False, repr=False)

    def frame(self) -> PoolFrame:
        """The pool's GPUs indexed for the plan's boards: kept from the last pass over the pool while its GPUs
        read the same (building it is a tenth of a pass on a thousand nodes)."""
        if self._frame is None or self._frame.gpus is not self.snapshot.gpus:
            kept = _frames.get(self.pool.pk)
            self._frame = (kept if kept is not None and kept.same_gpus(self.snapshot.gpus)
                           else PoolFrame(self.snapshot.gpus))
            _frames[self.pool.pk] = self._frame
        return self._frame

    def grant_columns(self) -> GrantColumns:
        """The snapshot's grants as GrantColumns: once per snapshot, for both plans."""
        grants = self.snapshot.grants
        if self._columns is None or self._columns[0] is not grants:
            self._columns = (grants, GrantColumns(grants, self.snapshot.grant_micros_of()))
        return self._columns[1]

    def promise(self) -> list[Planned]:
        return plan(gpus=self.snapshot.gpus, grants=self.grant_columns(), waiting=self.waiting,
                    now=self.now, horizon=self.horizon, policy=self.pool.placement_policy,
                    backfill=self.pool.backfill, teams=self._fresh_teams(), depth=settings.QUEUE_PLAN_DEPTH,
                    frame=self.frame(), keep_promises=True, profile=self.snapshot.profile)

    def estimate(self) -> list[Planned]:
        history = early_release(self.pool.pk, self.now)
        now = micro(self.now)
        columns = self.grant_columns()
        # The pool's bookings end together (likely_ends): a request waiting for any k GPUs gets the median of the
        # k-th end. (Taken apart by node instead, or each at its own median as before, the benchmark's windows
        # read the same: its waits are on quotas and on the queue's order.)
        grants = columns.ending(history.likely_ends(columns.starts, columns.ends, now,
                                                    bookings=columns.reservation_ids))
        # The team's own bookings end as early as the pool's do: a request waiting on its team's quota waits
        # for them, and kept to their booked ends its estimate was its promise. They end together apart from the
        # pool's: a request over its team's quota waits for the k-th end among its team's bookings.
        held = list(self.teams.items())
        moved = _ending_as_usual(history, [w for _, t in held for w in (t.in_pool, t.everywhere)], now)
        teams = {team_id: TeamHolding(quota=t.quota, in_pool=moved[2 * k], everywhere=moved[2 * k + 1])
                 for k, (team_id, t) in enumerate(held)}
        return plan(gpus=self.snapshot.gpus, grants=grants, waiting=self.waiting, now=self.now, horizon=self.horizon,
                    policy=self.pool.placement_policy, backfill=self.pool.backfill, teams=teams,
                    hold_for=lambda item: history.expected_duration(item.duration), depth=settings.QUEUE_PLAN_DEPTH,
                    frame=self.frame(), profile=self.snapshot.profile)

    def _fresh_teams(self) -> dict[int, TeamHolding]:
        return {team_id: TeamHolding(quota=t.quota, in_pool=t.in_pool.copy(), everywhere=t.everywhere.copy())
                for team_id, t in self.teams.items()}


def _ending_as_usual(history: EarlyRelease, sets: list[Windows], now: int) -> list[Windows]:
    """Teams' sets of windows (start, end, GE), ending when history.likely_ends says, each set taken together apart
    from the others (`now` in micros). One call for all of them (a call's cost is mostly NumPy's per call), and a
    set the same as one before it (a team's windows in the pool are all it holds anywhere) is not counted twice."""
    columns = [windows.columns() for windows in sets]
    same_as = list(range(len(sets)))
    for k, (starts, ends, _) in enumerate(columns):
        same_as[k] = next((j for j in range(k) if same_as[j] == j and np.array_equal(columns[j][0], starts)
                           and np.array_equal(columns[j][1], ends)), k)
    distinct = [k for k in range(len(sets)) if same_as[k] == k]
    if not distinct:
        return []
    sizes = [len(columns[k][0]) for k in distinct]
    starts, booked = (np.concatenate([columns[k][c] for k in distinct]) for c in (0, 1))
    likely = history.likely_ends(starts, booked, now, groups=np.repeat(np.arange(len(distinct)), sizes))
    ends_of = dict(zip(distinct, np.split(likely, np.cumsum(sizes)[:-1]), strict=True))
    return [Windows(columns=(first, ends_of[same_as[k]], ge)) for k, (first, _, ge) in enumerate(columns)]


def shape_data(shape: booking.Shape) -> dict:
    """A Shape as its QueueEntry keeps it (JSON)."""
    data = dataclasses.asdict(shape)
    data["mig_layout"] = shape.mig_layout if isinstance(shape.mig_layout, str) else list(shape.mig_layout)
    return data


def shape_from(data: dict) -> booking.Shape:
    layout = data.get("mig_layout", ())
    return booking.Shape(**{**data, "mig_layout": layout if isinstance(layout, str) else tuple(layout),
                            "gpu_models": tuple(data.get("gpu_models") or ())})


@functools.lru_cache(maxsize=4096)
def _shape_of_text(text: str) -> booking.Shape:
    """shape_from of a QueueEntry's shape read as JSON text: a queue's thousand requests ask a few shapes, and
    decoding each one's JSON and making its Shape (immutable, so shared) was a tenth of reading the queue."""
    return shape_from(json.loads(text))


@dataclass(frozen=True)
class Entry:
    """What a pass reads of a waiting request's QueueEntry (by hand: a queue of a thousand read through the
    ORM, with its reservations and teams, took longer than planning it)."""

    pk: int
    team_id: int
    duration: timedelta
    queued_at: datetime
    not_before: datetime | None
    not_after: datetime | None
    position: int | None
    reason: str
    start_by: datetime | None
    likely_start: datetime | None
    first_start_by: datetime | None
    first_likely_start: datetime | None
    moved_why_text: str
    moved_why_message: dict | None

    @property
    def moved_why(self) -> Msg | str:
        """As messages.stored_reason reads a StoredTextField: its message while it says what the text says."""
        msg = Msg.of(self.moved_why_message)
        return msg if msg is not None and msg.english() == self.moved_why_text else self.moved_why_text


def _duration(value) -> timedelta:
    """A DurationField read by hand: an interval on PostgreSQL, microseconds on SQLite."""
    return value if isinstance(value, timedelta) else timedelta(microseconds=int(value))


def read(pool_id: int, now: datetime, *, lock: bool = True) -> PoolQueue:
    """The pool (locked FOR UPDATE unless `lock` is False: the caller holds it) with its waiting requests."""
    pools = GpuPool.objects.filter(pk=pool_id)
    pool = (pools.select_for_update() if lock else pools).get()
    horizon = now + settings.RESERVATION_MAX_LEAD + settings.RESERVATION_MAX_DURATION
    rows = sql.fetch_all(
        "SELECT r.id, r.team_id, CAST(q.shape AS TEXT), q.duration, " + ", ".join(
            sql.instant_column(f"q.{name}") for name in ("queued_at", "not_before", "not_after"))
        + ", q.priority, q.position, q.reason, " + ", ".join(
            sql.instant_column(f"q.{name}") for name in ("start_by", "likely_start", "first_start_by",
                                                          "first_likely_start")) + ", q.moved_why, q.moved_why_message, "
        "q.planned_gpus "
        "FROM allocations_reservation r JOIN allocations_queueentry q ON q.reservation_id = r.id "
        "WHERE r.pool_id = %s AND r.state = %s ORDER BY r.id", [pool_id, State.PENDING])
    entries, waiting = {}, []
    for (pk, team_id, shape, duration, queued_at, not_before, not_after, priority, position, reason, start_by, likely,
         first_start_by, first_likely, moved_text, moved_message, planned_gpus) in rows:
        entry = Entry(pk=pk, team_id=team_id, duration=_duration(duration), queued_at=sql.instant(queued_at),
                      not_before=sql.instant(not_before), not_after=sql.instant(not_after), position=position,
                      reason=reason,
                      start_by=sql.instant(start_by), likely_start=sql.instant(likely),
                      first_start_by=sql.instant(first_start_by), first_likely_start=sql.instant(first_likely),
                      moved_why_text=moved_text, moved_why_message=sql.json_value(moved_message))
        entries[pk] = entry
        waiting.append(Waiting(reservation_id=pk, team_id=team_id, shape=_shape_of_text(shape),
                               duration=entry.duration, queued_at=entry.queued_at, not_before=entry.not_before,
                               not_after=entry.not_after, priority=priority, promised_at=entry.start_by,
                               promised_gpus=tuple(sql.json_value(planned_gpus) or ())))
    snapshot = booking.pool_snapshot(pool_id, now, horizon) if waiting else booking.PoolSnapshot(
        start=now, end=horizon, gpus=(), grants=())
    snapshot = _cut_at_notice(snapshot, pool_id)
    teams = _team_holdings(pool, Team.objects.filter(pk__in={w.team_id for w in waiting}), now, horizon)
    waiting = _ordered(waiting, pool, now, teams)
    return PoolQueue(pool=pool, now=now, horizon=horizon, snapshot=snapshot, waiting=waiting, entries=entries,
                     teams=teams)


class Locked:
    """The waiting requests a pass holds row locks on (those still pending when it locked them, in id order,
    as every writer locks), each read as a Reservation only when the pass writes it."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids: set[int] = set()
        if ids:
            among, params = sql.in_list("id", ids)
            self.ids = {pk for (pk,) in sql.fetch_all(
                f"SELECT id FROM allocations_reservation WHERE {among} AND state = %s "
                f"ORDER BY id{sql.for_update_of('allocations_reservation')}", [*params, State.PENDING])}
        self._read: dict[int, Reservation] = {}

    def __contains__(self, pk: int) -> bool:
        return pk in self.ids

    def __getitem__(self, pk: int) -> Reservation:
        if pk not in self.ids:
            raise KeyError(pk)
        if pk not in self._read:
            self._read[pk] = Reservation.objects.select_related("team", "requested_by").get(pk=pk)
        return self._read[pk]


def _cut_at_notice(snapshot: booking.PoolSnapshot, pool_id: int) -> booking.PoolSnapshot:
    """The snapshot with the grants of reservations under a reclaim notice ending when the notice does."""
    notice = dict(Reservation.objects.filter(pool_id=pool_id, preempt_at__isnull=False,
                                             state__in=Reservation.LIVE_STATES).values_list("pk", "preempt_at"))
    if not notice:
        return snapshot
    return dataclasses.replace(snapshot, grants=tuple(
        dataclasses.replace(g, ends_at=min(g.ends_at, max(g.starts_at, notice[g.reservation_id])))
        if g.reservation_id in notice else g for g in snapshot.grants))


def team_holding(quota: quotas.QuotaLimits, start: datetime, end: datetime) -> TeamHolding:
    """The team's quota with what it holds over [start, end): in the pool, and across pools where a
    team-wide cap makes that count."""
    return team_holdings([quota], start, end)[quota.team_id]


def team_holdings(limits: Sequence[quotas.QuotaLimits], start: datetime, end: datetime) -> dict[int, TeamHolding]:
    """team_holding of each team's quota in one pool (by team), reading the windows of them all at once."""
    if not limits:
        return {}
    in_pool = selectors.teams_window_micros([q.team_id for q in limits], limits[0].pool_id, start, end)
    capped = [q.team_id for q in limits if q.team_max_ge is not None]
    everywhere = selectors.teams_window_micros(capped, None, start, end) if capped else {}

    def windows(columns: tuple[list[int], list[int], list[float]] | None) -> Windows:
        if columns is None:
            return Windows()
        starts, ends, ge = columns
        return Windows(columns=(np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64),
                                np.array(ge, dtype=np.float64)))

    return {q.team_id: TeamHolding(quota=q, in_pool=windows(in_pool[q.team_id]),
                                   everywhere=windows(everywhere.get(q.team_id))) for q in limits}


def with_promised(snapshot: booking.PoolSnapshot, promised: Sequence[booking.Grant]) -> booking.PoolSnapshot:
    """The snapshot with what the plan promises (promised_grants) inside its window taken too."""
    inside = tuple(g for g in promised if g.starts_at < snapshot.end and g.ends_at > snapshot.start)
    return dataclasses.replace(snapshot, grants=(*snapshot.grants, *inside)) if inside else snapshot


def _team_holdings(pool: GpuPool, teams, now: datetime, horizon: datetime) -> dict[int, TeamHolding]:
    quotas_by_team = {q.team_id: q for q in Quota.objects.filter(pool=pool, team__in=teams)}
    limits = []
    for team in teams:
        quota = quotas_by_team.get(team.pk)
        if quota is None:
            continue  # its quota was removed while it waited: the pass fails it
        limits.append(quotas.QuotaLimits.of(
            team_id=team.pk, team_slug=team.slug, pool_id=pool.pk, pool_slug=pool.slug, team_name=team.name,
            pool_name=pool.name, max_ge=quota.max_ge, ge_hours_per_month=quota.ge_hours_per_month,
            team_max_ge=team.max_ge, borrowing=pool.borrowing, max_borrow_ge=quota.max_borrow_ge))
    return team_holdings(limits, now, horizon)


def _ordered(waiting: list[Waiting], pool: GpuPool, now: datetime, teams: dict[int, TeamHolding]) -> list[Waiting]:
    """`waiting` in the pool's queue order (allocations.placement.queueing.order_queue)."""
    ordering = pool.queue_ordering if pool.queue_ordering in ORDERINGS else "fcfs"
    items = [QueuedItem(key=w.reservation_id, team=str(w.team_id), submitted=w.queued_at.timestamp(),
                        duration=w.duration.total_seconds(), priority=w.priority, payload=w) for w in waiting]
    if ordering != "fairshare":
        return [item.payload for item in order_queue(items, ordering)]
    shares = fair_shares(pool.pk, now, {w.team_id: teams[w.team_id].quota.max_ge if w.team_id in teams else 1.0
                                        for w in waiting})
    return sorted(waiting, key=lambda w: (shares.get(w.team_id, 0.0), w.queued_at, w.reservation_id))


def fair_shares(pool_id: int, now: datetime, quota_ge: dict[int, float]) -> dict[int, float]:
    """Each team's decayed GE use of the pool divided by its quota: the dominant share in GE (one
    resource), past use fading with QUEUE_FAIRSHARE_HALF_LIFE. A team that held its quota all along
    has a share near 1; one that held nothing, 0. Teams with a smaller share go first."""
    tau = settings.QUEUE_FAIRSHARE_HALF_LIFE.total_seconds() / math.log(2)
    since = now - settings.QUEUE_FAIRSHARE_HALF_LIFE * 10  # older use weighs under 0.1 %
    rows = sql.fetch_all(
        "SELECT r.team_id, a.starts_at, a.ends_at, a.ge FROM allocations_allocation a "
        "JOIN allocations_reservation r ON r.id = a.reservation_id "
        "WHERE r.pool_id = %s AND a.starts_at < %s AND a.ends_at > %s AND a.ends_at > a.starts_at "
        f"AND r.team_id IN ({', '.join(['%s'] * len(quota_ge)) or 'NULL'})",
        [pool_id, sql.db_datetime(now), sql.db_datetime(since), *quota_ge])
    use: dict[int, float] = defaultdict(float)
    for team_id, start, end, ge in rows:
        start, end = max(sql.aware(start), since), min(sql.aware(end), now)
        # The average of GE held, weighted by exp(-age / tau): what this grant adds to it.
        use[team_id] += ge * (math.exp(-(now - end).total_seconds() / tau)
                              - math.exp(-(now - start).total_seconds() / tau))
    return {team_id: use[team_id] / max(ge, 1e-9) for team_id, ge in quota_ge.items()}


# --- the pass ---------------------------------------------------------------------------------------

def kick(pool_id: int) -> None:
    """Run a pass over the pool's queue after the current transaction commits, if anyone waits there or a
    reclaim notice stands (the pass withdraws one no longer needed). Coalesced: while one is queued and not
    yet started, more kicks add nothing."""
    if not Reservation.objects.filter(_WORTH_A_PASS, pool_id=pool_id).exists():
        return

    def send() -> None:
        try:
            first = cache.add(f"queue-pass:{pool_id}", 1, timeout=settings.QUEUE_PASS_COALESCE_SECONDS)
        except Exception:  # noqa: BLE001 - the cache away: send the pass anyway; two passes are safe
            first = True
        if first:
            # Looked up on the module when called, so a stand-in for the broker (the queue benchmark's) sees it.
            dispatch.enqueue("allocations.tasks.run_queue", pool_id)

    transaction.on_commit(send)


def has_waiting(pool_id: int, *, besides: int | None = None) -> bool:
    return Reservation.objects.filter(pool_id=pool_id, state=State.PENDING).exclude(pk=besides).exists()


# What makes a pool worth a pass: a request waits there, or a reclaim notice stands (the pass withdraws one no
# longer needed). One query, as a kick on every release asks it.
_WORTH_A_PASS = Q(state=State.PENDING) | reclaim.NOTICE_STANDS


def pools_to_pass_ids() -> list[int]:
    """The pools where requests wait or a reclaim notice stands: those the backstop passes over."""
    return list(Reservation.objects.filter(_WORTH_A_PASS).order_by().values_list("pool_id", flat=True).distinct())


@transaction.atomic
def queue_pass(*, pool_id: int, now: datetime | None = None, quiet: Sequence[int] = (),
               lock: bool = True) -> dict[str, int]:
    """One scheduling pass over the pool's queue: fail what ran out of time, start what the plan starts
    now, and write every other waiting request's position, reason, promise and estimate. `quiet`:
    reservations not to mail when they start (one placed in the call that created it). Then withdraw the
    pool's reclaim notices no longer needed (reclaim.call_off_needless): a release, cancel or create that
    kicked this pass may have ended the request one was given for, or this pass placed it elsewhere.
    Returns counts."""
    now = now or timezone.now()
    try:
        cache.delete(f"queue-pass:{pool_id}")  # kicks from now on queue another pass
    except Exception:  # noqa: BLE001
        pass
    state = read(pool_id, now, lock=lock)
    counts = _start_and_plan(state, quiet=quiet, now=now)
    called_off = reclaim.call_off_needless(pool_id, now)
    if called_off:
        counts["called_off"] = called_off
        kick(pool_id)  # the GPUs it gave back were free in this plan: plan again around them
    return counts


def _start_and_plan(state: PoolQueue, *, quiet: Sequence[int], now: datetime) -> dict[str, int]:
    """The pass's work on its waiting requests (queue_pass)."""
    counts = {"started": 0, "failed": 0, "waiting": 0}
    if not state.waiting:
        return counts
    locked = Locked([w.reservation_id for w in state.waiting])
    for item in list(state.waiting):
        entry = state.entries[item.reservation_id]
        if item.reservation_id not in locked:
            state.waiting.remove(item)  # cancelled meanwhile
            continue
        reservation = locked[item.reservation_id] if (item.team_id not in state.teams or (
            entry.not_after is not None and entry.not_after < now)) else None
        if item.team_id not in state.teams:
            _fail(reservation, Msg(gettext_noop("Team %(team)s no longer has a quota in pool %(pool)s."),
                                   team=reservation.team.name, pool=state.pool.name), now=now)
            state.waiting.remove(item)
            counts["failed"] += 1
        elif entry.not_after is not None and entry.not_after < now:
            _fail(reservation, Msg(gettext_noop("It could not start by its latest start, %(latest)s."),
                                   latest=instant(entry.not_after)), now=now)
            state.waiting.remove(item)
            counts["failed"] += 1
    promised = state.promise()
    started_grants: list[booking.Grant] = []
    for planned in promised:
        if not planned.starts_now(now):
            continue
        reservation = locked[planned.waiting.reservation_id]
        error = _start(reservation, planned, state, now=now, notify=reservation.pk not in quiet)
        if error:
            _fail(reservation, error, now=now)
            counts["failed"] += 1
        else:
            counts["started"] += 1
        state.waiting.remove(planned.waiting)
        started_grants.extend(_as_grants(reservation.pk, planned.grants, now, now + planned.waiting.duration))
    if counts["started"] or counts["failed"]:
        # What started now holds its grants for real; plan the rest again around them.
        # (_start added each to its team's holdings.)
        state.snapshot = dataclasses.replace(state.snapshot, grants=(*state.snapshot.grants, *started_grants))
        promised = state.promise()
    if _reclaim(state, promised, now=now):
        state.snapshot = _cut_at_notice(state.snapshot, state.pool.pk)
        promised = state.promise()
        counts["reclaiming"] = 1
    likely = {p.waiting.reservation_id: p.start for p in state.estimate()}
    entry_rows, reservation_rows = [], []
    for position, planned in enumerate(promised, start=1):
        if planned.start is None and planned.waiting.not_after is not None and planned.reason != "not_planned":
            _fail(locked[planned.waiting.reservation_id], Msg(gettext_noop(
                "It cannot start by its not_after time, even if every booking ends on time.")), now=now)
            counts["failed"] += 1
            continue
        counts["waiting"] += 1
        entry = state.entries[planned.waiting.reservation_id]
        if (planned.reason == entry.reason == "not_planned" and entry.position == position
                and entry.start_by is None):
            continue  # beyond the plan's depth as before, at the same place: nothing to write
        entry_row, reservation_row = _entry_rows(entry, locked, planned, likely.get(planned.waiting.reservation_id),
                                                 position=position, now=now)
        entry_rows.append(entry_row)
        if reservation_row is not None:
            reservation_rows.append(reservation_row)
    _write_entries(entry_rows, reservation_rows)
    return counts


def _start(reservation: Reservation, planned: Planned, state: PoolQueue, *, now: datetime,
           notify: bool) -> Msg | None:
    """Book a waiting request from now for its duration on the plan's grants; None or why it cannot."""
    end = now + planned.waiting.duration
    ge = sum(g.ge for g in planned.grants)
    team = state.teams[reservation.team_id]
    quota = team.quota
    borrowed = quotas.beyond(quota, ge=ge, start=now, end=end, in_pool=team.in_pool)
    try:
        quotas.check_month_budget(quota, ge=ge, asked=planned.waiting.shape.in_words(), start=now, end=end)
    except Conflict as refused:
        return msg_of(refused)
    booking.grants_write(reservation_id=reservation.pk, grants=planned.grants, start=now, end=end)
    gpus = len({g.gpu_id for g in planned.grants})
    memory = planned.grants[0].memory_mib if reservation.mode == SharingMode.VGPU else reservation.gpu_memory_mib
    sql.execute("UPDATE allocations_reservation SET starts_at = %s, ends_at = %s, gpus = %s, ge = %s, "
                "gpu_memory_mib = %s, borrowed_ge = %s WHERE id = %s",
                [sql.db_datetime(now), sql.db_datetime(end), gpus, ge, memory, borrowed, reservation.pk])
    team.in_pool.append((now, end, ge))
    team.everywhere.append((now, end, ge))
    reservation.starts_at, reservation.ends_at, reservation.gpus, reservation.ge = now, end, gpus, ge
    waited = now - state.entries[reservation.pk].queued_at
    move(reservation, State.SCHEDULED, now=now,
         reason=Msg(gettext_noop("%(asked)s placed (%(ge)s GE) after waiting %(span)s."),
                    asked=planned.waiting.shape.in_words(), ge=f"{ge:.2f}", span=span(waited)))
    QueueEntry.objects.filter(pk=reservation.pk).update(position=None, reason="", reason_text="",
                                                        reason_text_message=None, planned_at=now)
    enqueue_after_commit("allocations.tasks.activate_reservation", reservation.pk)
    if notify:
        notices.notify_owners(reservation, Msg(gettext_noop("Reservation #%(id)s started"), id=reservation.pk),
                              Msg(gettext_noop("It waited %(span)s in the queue of pool %(pool)s and now holds "
                                               "%(asked)s until %(end)s."), span=span(waited), pool=state.pool.name,
                                  asked=planned.waiting.shape.in_words(), end=instant(end)),
                              event="reservation.queued_started")
    return None


def _fail(reservation: Reservation, why: Msg, *, now: datetime) -> None:
    move(reservation, State.FAILED, reason=why, now=now)
    QueueEntry.objects.filter(pk=reservation.pk).update(position=None, planned_at=now)
    notices.notify_owners(reservation, Msg(gettext_noop("Reservation #%(id)s did not start"), id=reservation.pk),
                          why, event="reservation.not_started")


@functools.lru_cache(maxsize=64)
def _reason_stored(code: str) -> tuple[str, dict | None]:
    """stored(reason_words(code)), once per code (the same words for every request with that reason)."""
    return stored(reason_words(code))


def _entry_rows(entry: Entry, locked: Locked, planned: Planned, likely: datetime | None, *,
                position: int, now: datetime) -> tuple[list, list | None]:
    """What the pass writes for a waiting request (its entry's row, its reservation's: None where it reads so
    already), after recording a promise that moved later."""
    start_by = planned.start
    if likely is not None and start_by is not None:
        likely = min(max(likely, now), start_by)
    moved_why = entry.moved_why
    if entry.start_by is not None and start_by is not None and start_by > entry.start_by + timedelta(seconds=1):
        ahead_before = entry.position or position
        moved_why = (Msg(gettext_noop("Requests ordered ahead of it joined the queue (position %(before)s → "
                                      "%(after)s)."), before=ahead_before, after=position)
                     if position > ahead_before else
                     Msg(gettext_noop("The pool lost capacity it was planned on (a node or GPU failed or was drained, "
                                      "or a failover moved a booking onto it), or a request ahead of it that had no "
                                      "start before now has one.")))
        moved = Msg(gettext_noop("Promised start moved from %(old)s to %(new)s: %(why)s"),
                    old=instant(entry.start_by), new=instant(start_by), why=moved_why)
        record(locked[entry.pk], from_state=State.PENDING, to_state=State.PENDING, actor=None, reason=moved, at=now)
        notices.notify_owners(locked[entry.pk], Msg(gettext_noop("Reservation #%(id)s: its promised start moved later"),
                                                    id=entry.pk), moved, event="reservation.promise_moved")
    moved_text, moved_message = stored(moved_why)
    why_text, why_message = _reason_stored(planned.reason)
    entry_row = [position, planned.reason, why_text, json_param(why_message), *map(sql.db_datetime, (
        entry.start_by, entry.likely_start, start_by, likely, entry.first_start_by or start_by,
        entry.first_likely_start or likely)), moved_text, json_param(moved_message), sql.db_datetime(now),
        json.dumps([g.gpu_id for g in planned.grants]) if start_by is not None else None, entry.pk]
    # The reservation's window follows the plan, so lists sorted by start show it where it would run. A promise and
    # reason the same as the last pass's leave it as that pass wrote it (only a pass writes them while it waits, and
    # with its entry's): nothing to write.
    if start_by is not None and start_by == entry.start_by and planned.reason == entry.reason:
        return entry_row, None
    start = start_by or now
    reservation_row = [sql.db_datetime(start), sql.db_datetime(start + entry.duration), why_text,
                       json_param(why_message), entry.pk]
    return entry_row, reservation_row


def _write_entries(entry_rows: Sequence[list], reservation_rows: Sequence[list]) -> None:
    """Write every waiting request's entry and window in two statements, each run for all rows (a pass over
    a queue of a thousand wrote two thousand statements one by one)."""
    sql.execute_many(
        "UPDATE allocations_queueentry SET position = %s, reason = %s, reason_text = %s, reason_text_message = %s, "
        "previous_start_by = %s, previous_likely_start = %s, start_by = %s, likely_start = %s, first_start_by = %s, "
        "first_likely_start = %s, moved_why = %s, moved_why_message = %s, planned_at = %s, planned_gpus = %s "
        "WHERE reservation_id = %s", entry_rows)
    sql.execute_many("UPDATE allocations_reservation SET starts_at = %s, ends_at = %s, reason = %s, "
                     "reason_message = %s WHERE id = %s", reservation_rows)


def requeue_rest(old: Reservation, remaining: timedelta, *, now: datetime, reason: Msg | None = None) -> Reservation:
    """A reclaimed reservation's rest as a new waiting request, at the place in the queue the old one had (one
    that asked `requeue`, when its notice is carried out or its GPUs are lost before that). `reason`: why, for
    its history (by default: its GPUs were taken back)."""
    shape = booking.shape_of(old, old.pool)
    entry = QueueEntry.objects.filter(pk=old.pk).first()
    again = Reservation.objects.create(
        team=old.team, pool=old.pool, requested_by=old.requested_by, mode=old.mode, gpus=old.gpus, shares=old.shares,
        mig_profile=old.mig_profile, mig_count=old.mig_count, gpu_memory_mib=old.gpu_memory_mib,
        gpu_cores_pct=old.gpu_cores_pct, gpu_models=old.gpu_models, ge=0, priority=old.priority,
        priority_class=old.priority_class, preemptible=old.preemptible, requeue=True, starts_at=now,
        ends_at=now + remaining, state=State.PENDING)
    QueueEntry.objects.create(reservation=again, shape=shape_data(shape), duration=remaining,
                              queued_at=entry.queued_at if entry else old.created_at, priority=old.priority)
    record(again, from_state="", to_state=State.PENDING, actor=None, at=now, reason=reason or Msg(gettext_noop(
        "Requeued for the rest of reservation #%(id)s (%(span)s), whose GPUs were taken back."), id=old.pk,
        span=span(remaining)))
    return again


def span(delta: timedelta) -> Msg:
    """A length of time as people read it: "45 min", "3 h 20 min", "2 d 4 h" (to the nearest minute; str() of
    it: in the active language)."""
    minutes = round(abs(delta.total_seconds()) / 60)
    if minutes < 1:
        return Msg(gettext_noop("under a minute"))
    if minutes < 60:
        return Msg(gettext_noop("%(minutes)d min"), minutes=minutes)
    if minutes < 48 * 60:
        if minutes % 60:
            return Msg(gettext_noop("%(hours)d h %(minutes)02d min"), hours=minutes // 60, minutes=minutes % 60)
        return Msg(gettext_noop("%(hours)d h"), hours=minutes // 60)
    return Msg(gettext_noop("%(days)d d %(hours)d h"), days=minutes // 1440, hours=(minutes % 1440) // 60)


# --- taking GPUs back (allocations/reclaim.py: who may be taken, the notice) ----------------------------

def _reclaim(state: PoolQueue, promised: list[Planned], *, now: datetime) -> bool:
    """Give notice to the bookings whose GPUs the first waiting request within its quota needs, if taking
    them back lets it start when the notice ends (sooner than its plan): borrowed bookings of other teams,
    and other teams' bookings of a preemptible class below its priority (reclaim.may_take), the fewest and
    youngest that free the room (reclaim.choose). Returns whether it gave notice."""
    at = reclaim.earliest_takeback(now)
    found = reclaim.candidates(state.pool.pk, at)
    if not found:
        return False
    ahead: list[booking.Grant] = []
    for planned in promised:
        item = planned.waiting
        team = state.teams.get(item.team_id)
        starts_anyway = planned.start is not None and planned.start <= at
        # One that may not start by `at` (its not_before is later) gains nothing from a take-back then.
        may_start = item.not_before is None or item.not_before <= at
        if team is not None and not starts_anyway and may_start:
            victims = _victims(state, item, team, reclaim.for_request(found, team_id=item.team_id,
                                                                       priority=item.priority), ahead, at)
            if victims:
                reclaim.give_notice(victims, at=at, team_words=team.quota.team_words, priority=item.priority,
                                    beneficiary_id=item.reservation_id, now=now)
                return True
        if planned.start is not None:
            ahead.extend(_as_grants(item.reservation_id, planned.grants, planned.start, planned.start + item.duration))
    return False


def _victims(state: PoolQueue, item: Waiting, team: TeamHolding, found: list[Reservation],
             ahead: list[booking.Grant], at: datetime) -> list[Reservation]:
    """The victims (reclaim.choose) among `found` whose grants, taken back at `at`, let `item` start then
    within its quota (no borrowing for it), or [] when none do."""
    end = at + item.duration

    def fits(without: set[int]) -> bool:
        grants = [g for g in (*state.snapshot.grants, *ahead) if g.reservation_id not in without]
        chosen, _ = _try(state.snapshot.gpus, grants, item.shape, at, end, state.pool.placement_policy,
                         state.snapshot.profile)
        return chosen is not None and quotas.held_error(
            team.quota, ge=sum(g.ge for g in chosen), asked="", field="", start=at, end=end,
            in_pool=team.in_pool, everywhere=team.everywhere) is None

    return reclaim.choose(found, fits) if found else []


# --- what creates and extensions must leave alone ---------------------------------------------------

class Promised(list):
    """promised_grants' answer: the grants the plan holds (a list of booking.Grant), and per team the windows
    (start, end, GE) its waiting requests are promised, which a booking of that team must leave within its
    quota as other bookings leave the GPUs."""

    def __init__(self, grants=(), team_windows: dict[int, list[quotas.Window]] | None = None) -> None:
        super().__init__(grants)
        self.team_windows = team_windows or {}


def promised_grants(pool_id: int, now: datetime, *, without: int | None = None) -> Promised:
    """What the queue's plan holds in the pool from now (the caller holds the pool's lock): a new
    fixed-window booking or an extension must fit around it, so the promises stay kept."""
    if not has_waiting(pool_id, besides=without):
        return Promised()
    state = read(pool_id, now, lock=False)
    state.waiting = [w for w in state.waiting if w.reservation_id != without]
    planned = [p for p in state.promise() if p.start is not None]
    windows: dict[int, list[quotas.Window]] = defaultdict(list)
    for p in planned:
        windows[p.waiting.team_id].append((p.start, p.start + p.waiting.duration, sum(g.ge for g in p.grants)))
    return Promised([grant for p in planned for grant in _as_grants(p.waiting.reservation_id, p.grants, p.start,
                                                                    p.start + p.waiting.duration)], dict(windows))
