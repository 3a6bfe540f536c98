"""Two beat processes on one Redis (RedBeat): one sends the periodic tasks, the other waits on the lock;
when the active one is killed (SIGKILL, no goodbye) the other takes over within the lock's timeout, and
at no time do both send."""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from datetime import datetime

import pytest

from tests.conftest import start_server, stop_process_group, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
SENT = re.compile(rb"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] Scheduler: Sending due task "
                  rb"sweep reservations")


def _sends(log) -> list[datetime]:
    return [datetime.strptime(m.group(1).decode(), "%Y-%m-%d %H:%M:%S,%f") for m in SENT.finditer(log.read_bytes())]


def test_one_beat_of_two_sends_and_the_other_takes_over_when_it_dies(worker_env, tmp_path):
    import redis

    redis.Redis.from_url(worker_env["REDIS_URL"]).flushdb()
    env = {**worker_env, "BEAT_LOCK_SECONDS": "3", "BEAT_TICK_SECONDS": "0.5"}
    beats, logs = [], []
    for n in range(2):
        log = tmp_path / f"beat-{n}.log"
        beats.append(start_server([sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel=INFO"],
                                  env=env, log_path=log, what=f"beat {n}", ready=lambda log=log: log.exists()))
        logs.append(log)
    try:
        wait_for(lambda: any(len(_sends(log)) >= 3 for log in logs), timeout=30, message="sweeps being sent")
        time.sleep(3)
        active = next(n for n in range(2) if _sends(logs[n]))
        standby = 1 - active
        assert _sends(logs[standby]) == [], "both beats sent the sweep"
        os.killpg(beats[active].pid, signal.SIGKILL)
        killed_at = datetime.now()
        last_before = _sends(logs[active])[-1]
        wait_for(lambda: _sends(logs[standby]), timeout=20, message="the standby beat taking over")
        first_after = _sends(logs[standby])[0]
        # The lock (3 s) lapses, the standby's next try (a tick) takes it, then the sweep (every 1 s) is due.
        assert (first_after - last_before).total_seconds() < 3 + 0.5 + 1 + 1.5, (last_before, killed_at, first_after)
        time.sleep(3)
        assert len(_sends(logs[standby])) >= 3
    finally:
        for beat in beats:
            stop_process_group(beat)
