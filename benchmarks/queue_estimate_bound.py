"""What any estimate could reach on the queue benchmark: `python -m benchmarks.queue_estimate_bound --json FILE`
(DATABASE_URL must name PostgreSQL).

Issue 20 asks the first `likely_start` of a request that waits to be within 15 % of its real wait for half of them
(p50) and within 50 % for nine in ten (p90). How close could any estimate come, knowing what the portal knows when
the request arrives: the bookings running (each one's booked window and how much of it has run), the queue, and how
early the pool's past bookings ended? This replays benchmarks.queue's windows (the same requests, pool and
history) and, at the pass where each request gets its first estimate, draws `--samples` possible futures from that
knowledge, each planned with the estimate's own plan (`PoolQueue.estimate`, run with `SampledEnds` standing where
`EarlyRelease` stands):

* every running booking ends at a share of its booked window drawn from the past bookings of its length that ran
  longer than it has so far (the estimate's own conditional distribution, `EarlyRelease.shares`), one draw per
  booking shared by its grants and its team's window;
* every request planned ahead of it holds for a share of its duration drawn from the same history.

Each draw gives the request one possible start; with the promise as a bound (the pass clamps the estimate to
`start_by`), one possible wait. From the draws, per request:

* the best any point estimate L could do: the largest share of draws with |L - wait| <= 0.15 wait (and 0.5 wait),
  over every L. Averaged over the requests, that is the share of requests an estimate knowing exactly this
  distribution would put within 15 % (50 %) of the real wait, were the real waits drawn from it: against the
  target's 50 % (90 %);
* calibration: where the real wait falls among the draws (its rank, 0-1). Were the draws the real distribution of
  the wait, the ranks would be uniform: the share of real waits inside the draws' middle 80 % is the check;
* what three point estimates drawn from the same draws reach on the real waits: the draws' median (what
  `EarlyRelease.likely_ends` approximates in closed form), and the points that maximise the share of draws within
  15 % and within 50 %.

The figures the queue benchmark reports for the portal's own estimate are printed beside them, from the same replay.
"""
from __future__ import annotations

import argparse
import bisect
import contextlib
import logging
import math
import statistics
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from benchmarks.api import django_on_postgresql, write_json
from benchmarks.queue import (EPOCH, add_replay_arguments, clear, estimate_error, history_tasks, percentile, replay,
                              sample_nodes, whole_gpu_tasks)


class SampledEnds:
    """One possible future, standing where allocations.queue.EarlyRelease stands in PoolQueue.estimate: the same
    calls (`used`, `likely_ends`, `expected_duration`), answered with draws instead of medians. Each booking is drawn
    once (by its reservation, start and end) and `team_ends` gives a team's windows the draws of its own bookings,
    so a booking ends at the same moment on its GPUs and in its team's quota."""

    def __init__(self, history, rng: np.random.Generator) -> None:
        self.history = history
        self.used = history.used
        self.rng = rng
        self._drawn: dict[tuple[int, int, int], int] = {}  # (reservation, start, end) -> the end drawn

    def _draw_end(self, start: int, end: int, now: int) -> int:
        """A draw of when a booking [start, end) (micros) ends, given it has not ended by `now`."""
        shares = self.history.shares(timedelta(microseconds=end - start))
        ran = max(0.0, (now - start) / (end - start))
        later = shares[bisect.bisect_right(shares, ran):]
        if not later:
            return end
        share = later[int(self.rng.integers(len(later)))]
        return int(min(end, max(now, start + round((end - start) * share))))

    def end_of(self, reservation: int | None, start: int, end: int, now: int) -> int:
        """The drawn end of a reservation's window (the same on every call); None: a window of no known booking,
        drawn afresh."""
        if end <= start or end <= now:
            return end
        if reservation is None:
            return self._draw_end(start, end, now)
        key = (reservation, start, end)
        if key not in self._drawn:
            self._drawn[key] = self._draw_end(start, end, now)
        return self._drawn[key]

    def likely_ends(self, starts: np.ndarray, ends: np.ndarray, now: int, bookings: np.ndarray | None = None,
                    groups: np.ndarray | None = None) -> np.ndarray:
        """The pool's grants (`bookings`: their reservations), each ending at its booking's draw. (`groups`: the
        estimate's teams' windows, which name no reservation; drawing_futures gives the estimate team_ends
        instead, so these are drawn one a window.)"""
        if len(self.used) < self.history.MIN_HISTORY:
            return ends.copy()
        ids = bookings.tolist() if bookings is not None else [None] * len(starts)
        return np.array([self.end_of(r, start, end, now) for r, start, end in
                         zip(ids, starts.tolist(), ends.tolist(), strict=True)], dtype=np.int64)

    def team_ends(self, windows: list[tuple[int, int, int, float]], now: int):
        """A team's windows in the pool, one per reservation (reservation, start, end, GE), as the estimate's
        allocations.queue.Windows, each ending at its booking's draw."""
        from allocations.queue import Windows

        if len(self.used) < self.history.MIN_HISTORY:
            ends = [end for _, _, end, _ in windows]
        else:
            ends = [self.end_of(r, start, end, now) for r, start, end, _ in windows]
        return Windows(columns=(np.array([start for _, start, _, _ in windows], dtype=np.int64),
                                np.array(ends, dtype=np.int64),
                                np.array([ge for _, _, _, ge in windows], dtype=np.float64)))

    def expected_duration(self, duration: timedelta) -> timedelta:
        # PoolQueue.estimate asks this once for each request the plan holds (its hold_for): a draw a request.
        if len(self.used) < self.history.MIN_HISTORY:
            return duration
        shares = self.history.shares(duration)
        return duration * max(shares[int(self.rng.integers(len(shares)))], 0.01)


def team_windows(pool_id: int, team_ids, start: datetime, end: datetime) -> dict[int, list]:
    """Each team's windows in the pool over [start, end) as the queue reads them (selectors.teams_window_micros),
    but one per reservation, not summed per window: (reservation, start, end, GE) in micros."""
    from allocations import selectors
    from common import sql

    among, params = sql.in_list("r.team_id", list(team_ids))
    query, more = selectors._team_window_query(among, pool_id, start, end, None)
    rows = sql.fetch_all("SELECT r.team_id, a.reservation_id, " + query
                         + " GROUP BY r.team_id, a.reservation_id, a.starts_at, a.ends_at", [*params, *more])
    out: dict[int, list] = {team_id: [] for team_id in team_ids}
    for team_id, reservation, first, last, ge in rows:
        if not isinstance(first, int):
            first, last = sql.instant_micros(first), sql.instant_micros(last)
        out[team_id].append((reservation, first, last, float(ge)))
    return out


@contextlib.contextmanager
def drawing_futures(samples: int, seed: int, record: dict[int, dict], known=None):
    """While open, every PoolQueue.estimate call also plans `samples` drawn futures and records, for each waiting
    request seen for the first time, the starts they give it (`record[reservation id]`). The futures are drawn from
    the pool's history as the estimate reads it, or from `known` (an EarlyRelease) where given."""
    from allocations import queue

    original_estimate, original_history, original_ending = (queue.PoolQueue.estimate, queue.early_release,
                                                            queue._ending_as_usual)
    rng = np.random.default_rng(seed)

    def estimate(self):
        planned = original_estimate(self)
        new = [p.waiting.reservation_id for p in planned if p.waiting.reservation_id not in record]
        if not new:
            return planned
        history = known if known is not None else original_history(self.pool.pk, self.now)
        held = list(self.teams)  # estimate() hands _ending_as_usual each team's in_pool and everywhere, in this order
        windows = team_windows(self.pool.pk, held, self.now, self.horizon)
        now = queue.micro(self.now)
        draws: list[dict[int, datetime | None]] = []

        def ending(future, sets, _now):
            # A team's windows in the pool from its own reservations' draws; any other (a team-wide cap's windows
            # in other pools) drawn one a window.
            return [future.team_ends(windows[held[k // 2]], now) if k % 2 == 0 else
                    future.team_ends([(None, a, b, g) for a, b, g in zip(*(c.tolist() for c in s.columns()),
                                                                        strict=True)], now)
                    for k, s in enumerate(sets)]

        try:
            queue._ending_as_usual = ending
            for _ in range(samples):
                future = SampledEnds(history, rng)
                queue.early_release = lambda pool_id, now, future=future: future
                draws.append({p.waiting.reservation_id: p.start for p in original_estimate(self)})
        finally:
            queue.early_release, queue._ending_as_usual = original_history, original_ending
        for pk in new:
            record[pk] = {"now": self.now, "starts": [d.get(pk) for d in draws]}
        return planned

    queue.PoolQueue.estimate = estimate
    try:
        yield record
    finally:
        queue.PoolQueue.estimate = original_estimate


def window_shares(tasks):
    """The replayed tasks' own early release, as the estimate's history reads a pool's: each one's booked length
    and the share of it its runtime used."""
    from allocations.queue import EarlyRelease

    pairs = [(t.booked.total_seconds(), min(1.0, t.runtime / t.booked.total_seconds())) for t in tasks]
    return EarlyRelease(tuple(sorted(used for _, used in pairs)), tuple(pairs))


def best_point(waits: np.ndarray, within: float) -> tuple[float, float]:
    """The point L with the largest share of `waits` w within `within` w of it (|L - w| <= within w), and that
    share. w is within of L where L / (1 + within) <= w <= L / (1 - within): a window of fixed ratio in w, so the
    best L puts such a window's low end on one of the waits."""
    w = np.sort(waits[waits > 0])
    if not w.size:
        return float("nan"), 0.0
    ratio = (1 + within) / (1 - within)
    reach = np.searchsorted(w, w * ratio * (1 + 1e-12), "right") - np.arange(w.size)  # waits in [w_i, ratio w_i]
    i = int(np.argmax(reach))
    return float(w[i] * (1 + within)), float(reach[i] / waits.size)


def analyse(rows: list[dict]) -> dict:
    """The figures of one configuration from its requests (each with its real wait and its drawn waits)."""
    out: dict = {"requests": len(rows)}
    if not rows:
        return out
    ranks, inside, best15, best50 = [], 0, [], []
    points: dict[str, list[float]] = {"portal": [], "draws_median": [], "best_within_15": [], "best_within_50": []}
    for row in rows:
        waits, real = np.array(row["drawn_waits"]), row["wait"]
        # Ties (a draw equal to the real wait, e.g. both at the promise) count half, as a random rank would.
        ranks.append(float((np.sum(waits < real) + 0.5 * np.sum(waits == real)) / waits.size))
        low, high = np.quantile(waits, [0.1, 0.9])
        inside += low <= real <= high
        l15, p15 = best_point(waits, 0.15)
        l50, p50 = best_point(waits, 0.5)
        best15.append(p15)
        best50.append(p50)
        for name, point in (("portal", row["portal_wait"]), ("draws_median", float(np.median(waits))),
                            ("best_within_15", l15), ("best_within_50", l50)):
            if point is not None and np.isfinite(point):
                points[name].append(estimate_error(point, real, 0.0))  # waits: from the arrival, at 0
    out["calibration"] = {"inside_middle_80": inside / len(rows),
                          "rank_deciles": np.histogram(ranks, bins=10, range=(0, 1))[0].tolist()}
    out["bound"] = {"mean_best_share_within_15": statistics.fmean(best15),
                    "mean_best_share_within_50": statistics.fmean(best50)}
    out["estimates"] = {name: {"n": len(errors), "p50": percentile(errors, 50), "p90": percentile(errors, 90)}
                        for name, errors in points.items()}
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip", type=int, nargs="+", default=[1000], help="windows: whole-GPU tasks skipped")
    add_replay_arguments(parser)
    parser.add_argument("--backfill", choices=("on", "off", "both"), default="on")
    parser.add_argument("--samples", type=int, default=200, help="futures drawn at each request's first estimate")
    parser.add_argument("--draw-from", choices=("history", "window"), default="history",
                        help="how early bookings end in the drawn futures: as the pool's history says (what the "
                             "estimate knows), or as the replayed window's own tasks did (the future's own shares: "
                             "what no estimate can know, a bound for any estimate that learns shares)")
    parser.add_argument("--seed", type=int, default=7, help="the pool's nodes (as benchmarks.queue) and the draws")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    django_on_postgresql()
    from django.core.management import call_command

    from allocations.models import QueueEntry

    logging.getLogger("common.notifications").setLevel(logging.WARNING)
    call_command("migrate", verbosity=0)
    clear()
    nodes = sample_nodes(args.nodes, args.seed)
    result: dict = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "windows": {}}
    seconds = lambda moment: (moment - EPOCH).total_seconds()  # noqa: E731
    for skip in args.skip:
        tasks = whole_gpu_tasks(args.trace, skip=skip, count=args.requests, speedup=args.speedup,
                                max_hours=args.max_hours, teams=args.teams)
        past = history_tasks(args.trace, skip=skip, count=args.history, max_hours=args.max_hours, teams=args.teams)
        known = window_shares(tasks) if args.draw_from == "window" else None
        for backfill in {"on": (True,), "off": (False,), "both": (True, False)}[args.backfill]:
            name = f"skip {skip} fcfs/{'backfill' if backfill else 'strict'}" + (
                ", drawn from the window" if args.draw_from == "window" else "")
            record: dict[int, dict] = {}
            began = time.perf_counter()
            with drawing_futures(args.samples, args.seed, record, known):
                run = replay(tasks, nodes, ordering="fcfs", backfill=backfill, teams=args.teams,
                             quota_factor=args.quota_factor, past=past)
            firsts = dict(QueueEntry.objects.filter(pk__in=list(record)).values_list("pk", "first_start_by"))
            clear()
            # Each request that waited got its record at its create's pass: both lists are in arrival order (the
            # replay creates in the tasks' order; reservation ids grow with it).
            assert len(run["waited_requests"]) == len(record), (len(run["waited_requests"]), len(record))
            rows = []
            for w, (pk, r) in zip(run["waited_requests"], sorted(record.items()), strict=True):
                if w["start"] is None or w["start"] <= w["arrival"] or w["first_likely_start"] is None:
                    continue
                # A draw as the pass writes an estimate: not before now, not after the promise; no start, the promise.
                promise = seconds(firsts[pk]) if firsts.get(pk) else math.inf
                drawn = [promise if s is None else min(max(seconds(s), w["arrival"]), promise) for s in r["starts"]]
                drawn = [s for s in drawn if s != math.inf]
                rows.append({"arrival": w["arrival"], "wait": w["start"] - w["arrival"],
                             "portal_wait": w["first_likely_start"] - w["arrival"],
                             "drawn_waits": [s - w["arrival"] for s in drawn]})
            figures = analyse(rows)
            figures["portal_reported"] = {"p50": run["estimate_error_p50"], "p90": run["estimate_error_p90"]}
            figures["replay_s"] = time.perf_counter() - began
            figures["rows"] = rows
            result["windows"][name] = figures
            print(format_line(name, figures), flush=True)
    write_json(args.json, result)
    return result


def format_line(name: str, f: dict) -> str:
    def pct(value):
        return "-" if value is None else f"{100 * value:.0f}%"

    if not f["requests"]:
        return f"{name}: no request waited"
    e = f["estimates"]
    return (f"{name}: {f['requests']} waited; best any estimate could do with these draws: "
            f"{pct(f['bound']['mean_best_share_within_15'])} within 15% (target 50%), "
            f"{pct(f['bound']['mean_best_share_within_50'])} within 50% (target 90%); real waits inside the "
            f"draws' middle 80%: {pct(f['calibration']['inside_middle_80'])}, rank deciles "
            f"{f['calibration']['rank_deciles']}; "
            "error p50/p90 on the real waits: "
            + ", ".join(f"{k} {pct(v['p50'])}/{pct(v['p90'])}" for k, v in e.items())
            + f" (the benchmark's own figure for portal {pct(f['portal_reported']['p50'])}/"
              f"{pct(f['portal_reported']['p90'])}); {f['replay_s']:.0f} s")


if __name__ == "__main__":
    main()
