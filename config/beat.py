"""Beat's scheduler: RedBeat (the schedule and a lock in Redis, so replicas of beat send one at a time),
made to ride out a Redis outage as the worker does (config/broker.py).

RedBeat renews its lock at every tick; while Redis does not answer, the renewal fails and plain RedBeat
lets the error out of the tick, which stops beat (and a worker started with -B). Here a tick that cannot
reach Redis waits and tries again; a lock that lapsed meanwhile (the outage outlasted BEAT_LOCK_SECONDS)
may have been taken by another beat, so this one waits to take it again before it sends anything,
then writes the schedule back (a Redis restarted without its data lost it with the lock).
"""
from __future__ import annotations

import logging

from redbeat import RedBeatScheduler
from redbeat.schedulers import acquire_distributed_beat_lock
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import LockError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)


class _Sender:
    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler


class ResilientRedBeatScheduler(RedBeatScheduler):
    def tick(self, *args, **kwargs):
        try:
            return super().tick(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError) as error:
            log.warning("beat: Redis unreachable, trying again in %ss: %s", self.max_interval, error)
            return self.max_interval
        except LockError:
            log.warning("beat: the lock lapsed (Redis was away longer than its timeout); waiting to hold it again")
            self.lock = None
            # Blocks until this beat holds the lock again: another may be sending meanwhile.
            acquire_distributed_beat_lock(_Sender(self))
            # A Redis that came back empty (it keeps nothing on disk) lost the schedule too: without this
            # no task would ever be due again.
            self.setup_schedule()
            return 0
