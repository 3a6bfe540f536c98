"""Worker recovery benchmark: `python -m benchmarks.worker_recovery [--runs N] [--json FILE]`.

How long the Celery worker takes to recover, with the production defaults of config/settings.py
(sweep every 5 s, apply-job lease 15 s, lost messages re-driven after 30 s, retries capped at 60 s):

* after a Redis outage (6 s, `shutdown nosave`-like: everything in Redis is lost) under a load
  of 3 reservations/s: when the worker reconnected, and when every reservation booked before,
  during and after the outage was active;
* after the worker was killed (SIGKILL) while an apply job was blocked on a silent Kubernetes
  API server: when the orphaned job was taken back and started again by a new worker.

It runs the two scenarios of tests/integration/test_worker_outages.py (real worker, beat and
Redis processes) with WORKER_RECOVERY_TIMINGS=production and reads the figures they print.
Needs what those tests need: DATABASE_URL (PostgreSQL), REDIS_URL, SECRET_KEY.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

from benchmarks.api import ROOT

TESTS = "tests/integration/test_worker_outages.py"
FIGURES = {
    "worker_reconnected_s": re.compile(r"RECOVERY worker reconnected ([\d.]+)s"),
    "all_reservations_active_s": re.compile(r"reservations active ([\d.]+)s after Redis came back"),
    "orphaned_job_taken_back_s": re.compile(r"RECOVERY orphaned running job taken back .*? ([\d.]+)s after"),
}


def run_once() -> dict[str, float]:
    env = dict(os.environ, WORKER_RECOVERY_TIMINGS="production")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:logging", TESTS], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        sys.exit(f"the scenarios failed:\n{done.stdout[-4000:]}{done.stderr[-2000:]}")
    return {name: float(pattern.search(done.stdout).group(1)) for name, pattern in FIGURES.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    runs = [run_once() for _ in range(args.runs)]
    result = {"settings": "production defaults", "runs": runs,
              "max": {name: max(run[name] for run in runs) for name in FIGURES}}
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
