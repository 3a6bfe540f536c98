"""Whole GPUs over time, for planning a queue: when each GPU's card is free, and the window arrays
the engine scores, without rebuilding either per candidate start.

A queue plan asks, for request after request, "the first start at which `count` whole GPUs are
free for `duration`", then books what the engine chose there and asks again for the next one.
:meth:`ClusterState.arrays_for_window` answers one window at a time from every holding (tens of
milliseconds on thousands of GPUs); a plan of hundreds of requests over thousands of candidate
starts cannot afford that. Two structures here keep the answer exact and cheap:

* :class:`FreeTimeline`: per GPU, its free gaps (the time between its whole-card bookings), as
  NumPy columns. The earliest start for a request is one sweep over the gaps long enough for it
  (per node when the request must fit on one node), and booking a planned window splits one gap
  per GPU. Only where a gap opens (a booking ends, or the earliest allowed start) can a start be
  first, which is the rule Slurm's backfill and the engine's `earliest_start` use too: candidate
  starts are the event times.
* :class:`WholeGpuState`: a :class:`ClusterState` whose holdings are whole-card bookings kept as
  NumPy columns; `arrays_for_window` is then a mask over them, equal to the general one for such
  holdings (a whole card held at any instant of the window leaves it 0 free; the clustering
  tags count each reservation's cards per node). :meth:`WholeGpuState.window_arrays` keeps one
  such set of arrays from window to window and rewrites only the rows whose holdings in the
  window changed, so the engine (``api.WindowPlacer``) rescores only those nodes.

Times are integers (any unit; the caller picks microseconds) in the timeline, and the engine's
seconds in the state. Nothing here knows Django.
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from .arrays import AFFINITY_BIG, ClusterArrays
from .feasibility import gpu_fit, node_resources_ok
from .mig import FULL_MASK
from .requests import Demand, Kind, Time, to_seconds
from .state import ClusterState, NodeInfo

FOREVER = np.iinfo(np.int64).max // 4  # later than any time a caller passes


class FreeTimeline:
    """When each GPU's whole card is free: per GPU, the gaps between the windows it is booked for.

    `gpu_node[g]` is the node (any hashable grouping) of GPU `g` (0..n-1), `usable[g]` whether it
    may be booked at all; `busy` the windows (gpu, start, end), end exclusive, that hold a card.
    Gaps are kept as three parallel columns; a GPU's gaps never overlap.
    """

    def __init__(self, gpu_node: Sequence[int], usable: Sequence[bool],
                 busy: Sequence[tuple[int, int, int]] | tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        self.gpu_node = np.asarray(gpu_node, dtype=np.int64)
        self.usable = np.asarray(usable, dtype=bool)
        n = len(self.gpu_node)
        if isinstance(busy, tuple) and len(busy) == 3 and isinstance(busy[0], np.ndarray):
            columns = busy  # (gpus, starts, ends) as arrays already
        else:
            columns = tuple(zip(*busy, strict=True)) if busy else ()
        if columns and len(columns[0]):
            g, s, e = (np.asarray(column, dtype=np.int64) for column in columns)
            keep = (e > s) & self.usable[g]
            g, s, e = g[keep], s[keep], e[keep]
        else:
            g = s = e = np.zeros(0, dtype=np.int64)
        order = np.lexsort((s, g))
        g, s, e = g[order], s[order], e[order]
        # A GPU's windows may overlap: its gap after a window starts at the latest end so far. Offsetting
        # each GPU's ends by its rank keeps one running maximum from crossing into the next GPU.
        if g.size:
            span = int(max(e.max(), s.max()) - min(e.min(), s.min())) + 2
            base = int(min(e.min(), s.min()))
            if n * span < FOREVER:
                ends = np.maximum.accumulate((e - base) + g * span) - g * span + base
            else:  # a span too wide for the offset: per GPU, by hand
                ends = e.copy()
                for k in range(1, g.size):
                    if g[k] == g[k - 1]:
                        ends[k] = max(ends[k], ends[k - 1])
        else:
            ends = e
        last = np.ones(g.size, dtype=bool)
        last[:-1] = g[1:] != g[:-1]
        first = np.ones(g.size, dtype=bool)
        first[1:] = g[1:] != g[:-1]
        nxt = np.where(last, FOREVER, np.roll(s, -1))
        # Gaps: before each GPU's first window, after each window up to the next one, and whole free GPUs.
        idle = np.setdiff1d(np.flatnonzero(self.usable), g)
        gap_gpu = np.concatenate([g[first], g, idle])
        gap_from = np.concatenate([np.full(int(first.sum()), -FOREVER), ends, np.full(idle.size, -FOREVER)])
        gap_to = np.concatenate([s[first], nxt, np.full(idle.size, FOREVER)])
        keep = gap_to > gap_from
        self.gap_gpu, self.gap_from, self.gap_to = gap_gpu[keep], gap_from[keep], gap_to[keep]
        # Where each GPU's gaps are, for book and unbook: the built columns' positions in GPU order and where each
        # GPU's run of them begins, and the positions of gaps appended since, per GPU. Positions never move: a gap
        # a booking fills is emptied where it is (`_empty`), not deleted. (Sorting the columns themselves by GPU
        # made the sweeps in `earliest` twice as slow; finding a GPU's gaps by a scan of all 12,000 was a tenth of
        # booking a plan's request on a thousand nodes.)
        self._by_gpu = np.argsort(self.gap_gpu, kind="stable")
        self._run = np.searchsorted(self.gap_gpu[self._by_gpu], np.arange(n + 1)).tolist()
        self._appended: dict[int, list[int]] = {}
        self._room: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # what the columns view, with room (_append)

    def copy(self) -> FreeTimeline:
        twin = object.__new__(FreeTimeline)
        twin.__dict__.update(self.__dict__)
        twin.gap_gpu, twin.gap_from, twin.gap_to = self.gap_gpu.copy(), self.gap_from.copy(), self.gap_to.copy()
        twin._room = None  # the twin's columns are its own, with no room: its first append makes some
        twin._appended = {gpu: list(at) for gpu, at in self._appended.items()}
        return twin

    def gaps(self) -> list[tuple[int, int, int]]:
        """Every gap (gpu, from, to), sorted: the emptied ones left out."""
        live = self.gap_to > self.gap_from
        return sorted(zip(self.gap_gpu[live].tolist(), self.gap_from[live].tolist(), self.gap_to[live].tolist(),
                          strict=True))

    def _gaps_of(self, gpu: int) -> list[int]:
        """Where GPU `gpu`'s gaps are in the columns (emptied ones too)."""
        return self._by_gpu[self._run[gpu]:self._run[gpu + 1]].tolist() + self._appended.get(gpu, [])

    def _append(self, gpu: int, start: int, end: int) -> None:
        """A new gap at the columns' end. The columns are views of longer arrays with room to append into, grown to
        twice their size when full: a plan splits a gap for each request it books, and np.append copied the
        pool's 12,000 gaps each time (an eighth of planning a queue of multi-GPU requests on a thousand nodes)."""
        k = self.gap_gpu.size
        self._appended.setdefault(gpu, []).append(k)
        room = self._room
        if room is None or room[0].size == k:
            room = tuple(np.concatenate([column, np.zeros(max(k, 16), dtype=np.int64)])
                         for column in (self.gap_gpu, self.gap_from, self.gap_to))
            self._room = room
        room[0][k], room[1][k], room[2][k] = gpu, start, end
        self.gap_gpu, self.gap_from, self.gap_to = (column[:k + 1] for column in room)

    def _empty(self, k: int) -> None:
        """Gap k holds nothing any more: from FOREVER to -FOREVER, which no sweep, mask or join counts."""
        self.gap_from[k], self.gap_to[k] = FOREVER, -FOREVER

    def book(self, gpu: int, start: int, end: int) -> None:
        """Hold GPU `gpu` over [start, end), which must lie in one of its gaps (a planned window is
        chosen where it is free): that gap splits in two."""
        inside = [k for k in self._gaps_of(gpu) if self.gap_from[k] <= start and self.gap_to[k] >= end]
        if len(inside) != 1:
            raise ValueError(f"GPU {gpu} is not free over [{start}, {end})")
        k = inside[0]
        after = int(self.gap_to[k])
        if self.gap_from[k] < start:
            self.gap_to[k] = start
            if after > end:
                self._append(gpu, end, after)
        elif after > end:  # the window starts where the gap does (as an earliest fit does): the gap starts later
            self.gap_from[k] = end
        else:  # the window fills the gap
            self._empty(k)

    def unbook(self, gpu: int, start: int, end: int) -> None:
        """Free GPU `gpu` over [start, end) again (a window `book` held): the gaps either side join it. (Gaps
        are never empty, so at most one gap ends at `start` and one begins at `end`.)"""
        gaps = self._gaps_of(gpu)
        left = [k for k in gaps if self.gap_to[k] == start]
        right = [k for k in gaps if self.gap_from[k] == end]
        if left and right:
            self.gap_to[left[0]] = self.gap_to[right[0]]
            self._empty(right[0])
        elif left:
            self.gap_to[left[0]] = end
        elif right:
            self.gap_from[right[0]] = start
        else:
            self._append(gpu, start, end)

    def free_for(self, start: int, end: int) -> np.ndarray:
        """Per GPU (0..n-1), whether its whole card is free over [start, end) (mask it with a request's allowed GPUs
        where it has some)."""
        free = np.zeros(len(self.gpu_node), dtype=bool)
        free[self.gap_gpu[(self.gap_from <= start) & (self.gap_to >= end)]] = True
        return free

    def earliest(self, count: int, duration: int, earliest: int, latest: int, *, together: bool,
                 allowed: np.ndarray | None = None) -> int | None:
        """The first start t in [earliest, latest] at which `count` GPUs are free over [t, t + duration):
        on one node when `together`, else anywhere in the pool; None when there is none. `allowed`: per GPU,
        whether the request may take it (a request that accepts only some models); None: any."""
        lo, hi, ok = self.start_ranges(duration, earliest, latest, allowed=allowed)
        if lo.size < count:
            return None
        if count == 1:
            return int(lo.min())
        group = self.sweep_groups(ok, together=together)
        if (int(group.max()) + 1) * (int(latest) - int(earliest) + 1) < FOREVER:
            return first_reached_packed(count, lo, hi, group, earliest, latest)
        return first_reached_lexsorted(count, lo, hi, group)

    def start_ranges(self, duration: int, earliest: int, latest: int, *,
                     allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The first and last start (`lo`, `hi`, closed, both within [earliest, latest]) of each gap that can hold the
        window somewhere in [earliest, latest], and which of all gaps those are (`ok`, for :meth:`sweep_groups`)."""
        lo = np.maximum(self.gap_from, earliest)
        hi = self.gap_to - duration  # the last start the gap takes
        ok = (lo <= hi) & (lo <= latest)
        if allowed is not None:
            ok &= allowed[self.gap_gpu]
        return lo[ok], np.minimum(hi[ok], latest), ok

    def sweep_groups(self, ok: np.ndarray, *, together: bool) -> np.ndarray:
        """Each of those gaps' group for the sweep: its node when the GPUs must be together, else 0 (the pool)."""
        return self.gpu_node[self.gap_gpu[ok]] if together else np.zeros(int(ok.sum()), dtype=np.int64)


# The sweep of FreeTimeline.earliest: each gap counts from its first to its last start (closed), per group. A GPU's
# gaps are disjoint, so the count at a time is the number of GPUs free for the window starting then; the answer is
# the first time it reaches `count`. Two ways to order the events (group, then time, then opens before closes).

def first_reached_packed(count: int, lo: np.ndarray, hi: np.ndarray, group: np.ndarray, earliest: int,
                         latest: int) -> int | None:
    """The sweep with each event as one integer, sorted by NumPy's stable sort: a merge of the runs it finds, and the
    gaps come in runs (built in GPU order, most closes at `latest`), where sorting three keys with lexsort took twenty
    times as long (0.55-0.75 ms a call on the 12,400 gaps of a 1,213-node pool: most of planning a request for several
    GPUs). Only where (groups x (latest - earliest + 1)) fits well inside an int64 (FOREVER). A gap's open and close
    are in the same group, so the running count is back to 0 at each group's end."""
    width = int(latest) - int(earliest) + 1
    opens = (group * width + (lo - earliest)) << 1
    events = np.sort(np.concatenate([opens, ((group * width + (hi - earliest)) << 1) | 1]), kind="stable")
    reached = np.flatnonzero(np.cumsum(1 - ((events & 1) << 1)) >= count)
    if reached.size == 0:
        return None
    return int(((events[reached] >> 1) % width).min()) + earliest


def first_reached_lexsorted(count: int, lo: np.ndarray, hi: np.ndarray, group: np.ndarray) -> int | None:
    """The sweep with the three keys sorted by lexsort: for times too wide to pack (first_reached_packed)."""
    times = np.concatenate([lo, hi])
    steps = np.concatenate([np.ones(lo.size, dtype=np.int64), -np.ones(hi.size, dtype=np.int64)])
    order = np.lexsort((-steps, times, np.concatenate([group, group])))  # at one time, gaps open before others close
    reached = np.flatnonzero(np.cumsum(steps[order]) >= count)
    if reached.size == 0:
        return None
    return int(times[order][reached].min())


class WholeGpuState(ClusterState):
    """A ClusterState whose holdings are whole-card bookings held as NumPy columns, so the arrays for a
    window are a mask, not a walk over every holding. Book more with :meth:`hold`; `holdings` stays empty
    (the columns are the holdings)."""

    # Holdings are kept in two sets of columns: the many booked first (a pool's bookings) and the few added
    # since (a plan's, one request at a time), so adding one copies only the few; the few join the many
    # once there are MERGE_AT of them.
    MERGE_AT = 1024

    def __init__(self, nodes: Sequence[NodeInfo]) -> None:
        super().__init__(nodes=nodes)
        empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64),
                 np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self._many = self._few = empty  # (node, slot, start, end, group, serial) columns each
        # Each holding's serial number (0, 1, 2, ... in the order held): window_arrays tells which holdings entered
        # or left the window since its last call by them.
        self._serials = 0
        self._groups: dict[Hashable, int] = {}
        self._last: tuple[tuple[float, float, int], ClusterArrays] | None = None
        self._kept: tuple | None = None  # window_arrays' arrays, and what its last window hit

    def copy(self) -> WholeGpuState:
        twin = WholeGpuState.__new__(WholeGpuState)
        twin.__dict__.update(self.__dict__)
        twin._groups = dict(self._groups)
        twin._kept = None  # window_arrays writes its arrays in place: a copy keeps its own
        return twin  # the columns are replaced, never written in place, by hold and release

    def hold(self, whole: Sequence[tuple[Hashable, Time, Time, Hashable]]) -> None:
        """Add whole-card holdings: (GPU id, start, end, reservation id) each."""
        if whole:
            self.hold_columns([gpu_id for gpu_id, _, _, _ in whole], [to_seconds(start) for _, start, _, _ in whole],
                              [to_seconds(end) for _, _, end, _ in whole], [rid for _, _, _, rid in whole])

    def hold_columns(self, gpu_ids: Sequence[Hashable], starts: Sequence[float], ends: Sequence[float],
                     reservation_ids: Sequence[Hashable]) -> None:
        """hold, given as columns (starts and ends in seconds, as `to_seconds` gives them)."""
        slots = [self.gpu_slot(gpu_id) for gpu_id in gpu_ids]
        self.hold_slots(np.array([n for n, _ in slots], dtype=np.int64),
                        np.array([slot for _, slot in slots], dtype=np.int64), starts, ends, reservation_ids)

    def hold_slots(self, nodes: np.ndarray, slots: np.ndarray, starts: Sequence[float], ends: Sequence[float],
                   reservation_ids: Sequence[Hashable] | np.ndarray) -> None:
        """hold_columns, given each GPU as its (node, slot) in the state (gpu_slot's answer) already: a queue board
        knows them for every GPU of its pool, and looking 6,212 of them up one by one was a tenth of its build.
        `reservation_ids` may be an integer column."""
        serials = np.arange(self._serials, self._serials + len(nodes), dtype=np.int64)
        self._serials += len(nodes)
        if isinstance(reservation_ids, np.ndarray):
            # One look-up per reservation, not per holding. (A group is only a label: which number a reservation
            # gets plays no part in the arrays.)
            kinds, inverse = np.unique(reservation_ids, return_inverse=True)
            keys, known = kinds.tolist(), self._groups
            fresh = [rid for rid in keys if rid not in known]
            known.update(zip(fresh, range(len(known), len(known) + len(fresh))))
            groups = np.fromiter(map(known.__getitem__, keys), dtype=np.int64, count=len(keys))[inverse.reshape(-1)]
        else:
            groups = np.array([self._groups.setdefault(rid, len(self._groups)) for rid in reservation_ids],
                              dtype=np.int64)
        added = (np.asarray(nodes, dtype=np.int64), np.asarray(slots, dtype=np.int64),
                 np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64), groups, serials)
        self._few = tuple(np.concatenate([few, more]) for few, more in zip(self._few, added, strict=True))
        if self._few[0].size >= self.MERGE_AT:
            self._many = tuple(np.concatenate([many, few]) for many, few in zip(self._many, self._few, strict=True))
            self._few = tuple(column[:0] for column in self._few)
        self._last = None

    def release(self, reservation_id: Hashable) -> None:
        """Drop every holding of the reservation."""
        group = self._groups.get(reservation_id)
        if group is None:
            return
        for name in ("_few", "_many"):
            columns = getattr(self, name)
            keep = columns[4] != group
            if not keep.all():
                setattr(self, name, tuple(column[keep] for column in columns))
        self._last = None

    def whole_fit_when_free(self, demand: Demand) -> np.ndarray:
        """(nodes, max GPUs) bool: the cards the engine fits the whole-GPU `demand` on where nothing holds them in the
        window: feasibility's gpu_fit on a node node_resources_ok passes, on the empty cluster's arrays. In any window
        the engine fits exactly these cards less those a holding hits, as holdings here take whole cards only
        (`_mark` writes no other column a whole-GPU fit or a node's check reads)."""
        if demand.kind is not Kind.WHOLE:
            raise ValueError("whole GPUs only")
        base = self.base_arrays()
        return gpu_fit(base, demand) & node_resources_ok(base, demand)[:, None]

    def _hit_masks(self, ws: float, we: float) -> tuple[np.ndarray, np.ndarray]:
        """Per holding of the many and of the few, whether it holds a card at some instant of [ws, we)."""
        return tuple((start_s < we) & (end_s > ws) & (end_s > start_s)
                     for _, _, start_s, end_s, _, _ in (self._many, self._few))

    def _hits(self, masks: tuple[np.ndarray, np.ndarray], column: int) -> np.ndarray:
        """One column of the holdings `masks` pick (node 0, slot 1, group 4, serial 5), the many's then the few's."""
        return np.concatenate([self._many[column][masks[0]], self._few[column][masks[1]]])

    def _mark(self, arrays: ClusterArrays, n: np.ndarray, slot: np.ndarray, group: np.ndarray) -> None:
        """Take the cards these holdings hold in `arrays` (their rows as the empty cluster has them)."""
        arrays.gpu_free[n, slot] = 0
        mig = arrays.mig_capable[n, slot]
        arrays.mig_used[n[mig], slot[mig]] = FULL_MASK
        # Clustering tags: each reservation's whole cards on a node are one k-card task.
        groups = len(self._groups) + 1
        tasks, cards = np.unique(n * groups + group, return_counts=True)
        if tasks.size * 8 < arrays.n_nodes:
            # A few tasks (window_arrays' one or two rows): counted into their cells alone, not into a count of
            # every cell of the table added to it whole.
            np.add.at(arrays.affinity, (tasks // groups, np.minimum(cards, AFFINITY_BIG)), 1)
        else:
            cells = (tasks // groups) * arrays.affinity.shape[1] + np.minimum(cards, AFFINITY_BIG)
            arrays.affinity += np.bincount(cells, minlength=arrays.affinity.size).reshape(
                arrays.affinity.shape).astype(arrays.affinity.dtype)

    def arrays_for_window(self, start: Time, end: Time) -> ClusterArrays:
        ws, we = to_seconds(start), to_seconds(end)
        if not we > ws:
            raise ValueError("window must end after it starts")
        key = (ws, we, self._many[0].size + self._few[0].size)
        if self._last is None or self._last[0] != key:
            arrays = self.base_arrays().copy()
            hit = self._hit_masks(ws, we)
            self._mark(arrays, self._hits(hit, 0), self._hits(hit, 1), self._hits(hit, 4))
            arrays.version += 1
            self._last = (key, arrays)
        return self._last[1].copy()

    def window_arrays(self, start: Time, end: Time) -> ClusterArrays:
        """What arrays_for_window gives, in one ClusterArrays kept from call to call (the caller must not change
        it): only the rows of the nodes where a holding entered or left the window since the last call (or was
        held or released meanwhile) are written again, and only their versions move, so a ScoreCache rescores
        those nodes alone. A queue plan asks window after window of one pool, and between two of them a couple
        of its thousand nodes change; arrays_for_window copies and masks every row each time."""
        ws, we = to_seconds(start), to_seconds(end)
        if not we > ws:
            raise ValueError("window must end after it starts")
        many, few = self._many, self._few
        many_hit, few_hit = self._hit_masks(ws, we)
        few_node, few_serial = few[0][few_hit], few[5][few_hit]
        if self._kept is None or self._kept[1] is not many:
            # The first call, or the many changed (the few joined them, or a release dropped some): every row.
            arrays = self._kept[0] if self._kept is not None else self.base_arrays().copy()
            dirty = np.arange(arrays.n_nodes)
        else:
            arrays, _, was_many_hit, was_few_serial, was_few_node = self._kept
            # The many are the same columns as last time: compare their masks. The few change with every holding
            # the plan adds: compare the serials they hit (serials only grow, so each set is a mask over them).
            was, now = np.zeros(self._serials, dtype=bool), np.zeros(self._serials, dtype=bool)
            was[was_few_serial] = True
            now[few_serial] = True
            dirty = np.unique(np.concatenate([many[0][many_hit != was_many_hit], few_node[~was[few_serial]],
                                              was_few_node[~now[was_few_serial]]]))
        if dirty.size:
            base = self.base_arrays()
            arrays.gpu_free[dirty] = base.gpu_free[dirty]
            arrays.mig_used[dirty] = base.mig_used[dirty]
            arrays.affinity[dirty] = base.affinity[dirty]
            on = np.zeros(arrays.n_nodes, dtype=bool)
            on[dirty] = True
            mine = (many_hit & on[many[0]], few_hit & on[few[0]])
            self._mark(arrays, self._hits(mine, 0), self._hits(mine, 1), self._hits(mine, 4))
            arrays.version[dirty] += 1
        self._kept = (arrays, many, many_hit, few_serial, few_node)
        return arrays
