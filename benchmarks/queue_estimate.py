"""Where the queue's estimate errs: `python -m benchmarks.queue_estimate FILE...` reads `python -m benchmarks.queue
--json FILE` runs (no database) and breaks each configuration's estimate error down.

Per configuration, over the requests that waited (as benchmarks.queue counts them): the error |first likely_start -
real start| / real wait, p50 and p90; its sign (the median of (first likely_start - real start) / real wait, and the
share of estimates later than the real start); the error by the wait's length (under 10 minutes or not) and by the
first reason the request waited; and the error of the last estimate before it started (the last pass's).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.queue import estimate_error, percentile


def breakdown(waited: list[dict]) -> dict:
    rows = [w for w in waited if w["start"] is not None and w["first_likely_start"] is not None
            and w["start"] > w["arrival"]]

    def errors(subset, key="first_likely_start"):
        return [estimate_error(w[key], w["start"], w["arrival"]) for w in subset if w.get(key) is not None]

    def p50_p90(subset, key="first_likely_start"):
        values = errors(subset, key)
        return {"n": len(values), "p50": percentile(values, 50), "p90": percentile(values, 90)}

    signed = [(w["first_likely_start"] - w["start"]) / (w["start"] - w["arrival"]) for w in rows]
    reasons = sorted({w.get("first_reason", "") for w in rows})
    return {
        "all": p50_p90(rows),
        "signed_median": percentile(signed, 50),
        "late_share": sum(s > 0 for s in signed) / len(signed) if signed else None,
        "wait_under_10_min": p50_p90([w for w in rows if w["start"] - w["arrival"] < 600]),
        "wait_10_min_or_more": p50_p90([w for w in rows if w["start"] - w["arrival"] >= 600]),
        "by_first_reason": {reason: p50_p90([w for w in rows if w.get("first_reason", "") == reason])
                            for reason in reasons},
        "last_estimate": p50_p90(rows, "last_likely_start"),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs="+")
    args = parser.parse_args(argv)

    def pct(value):
        return "-" if value is None else f"{100 * value:.0f}%"

    def pair(d):
        return f"{pct(d['p50'])}/{pct(d['p90'])} (n {d['n']})"

    out = {}
    for path in args.files:
        run = json.loads(path.read_text())
        for name, config in run["configs"].items():
            b = out[f"{path.name} {name}"] = breakdown(config.get("waited_requests", []))
            print(f"{path.name} {name}: error p50/p90 {pair(b['all'])}; signed median {pct(b['signed_median'])}, "
                  f"late {pct(b['late_share'])}; wait < 10 min {pair(b['wait_under_10_min'])}, >= 10 min "
                  f"{pair(b['wait_10_min_or_more'])}; by first reason "
                  + ", ".join(f"{reason or '-'} {pair(d)}" for reason, d in b["by_first_reason"].items())
                  + f"; last estimate {pair(b['last_estimate'])}")
    return out


if __name__ == "__main__":
    main()
