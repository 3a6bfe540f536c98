"""The one way a Celery task is queued: by name, after the commit of the transaction that made it due.

Callers name the task ("allocations.tasks.activate_reservation") rather than import it: the
tasks call the services, so a service that imported its tasks made an import loop. The name
is resolved in the Celery app's registry when the message is sent.

The database is the truth and a task is only a nudge (the beat sweep activates, expires and
re-drives whatever is due), so a task that cannot be queued because the broker is unreachable
is logged and left to the sweep: the request that committed the change still succeeds.
"""
from __future__ import annotations

import logging

from celery import current_app
from django.db import transaction

from common import redis_cache
from common.outages import REDIS_UNREACHABLE

log = logging.getLogger(__name__)



def _task(name: str):
    """The registered task called `name`. Celery registers the apps' tasks modules only when a worker
    starts (autodiscovery on its import signal), so a web process loads them at its first dispatch."""
    if name not in current_app.tasks:
        current_app.loader.import_default_modules()
    return current_app.tasks[name]


def enqueue(task_name: str, *args, countdown: float = 0.0) -> None:
    """Queue the task named `task_name` with `args` now; a broker that does not answer leaves it to the sweep."""
    task = _task(task_name)
    if redis_cache.outage.is_down and not redis_cache.outage.admit():
        # The cache found Redis (the same server) unreachable a moment ago: do not wait for the broker's retries.
        log.warning("not queued, Redis unreachable (the sweep will do it): %s%r", task.name, args)
        return
    try:
        if countdown:
            task.apply_async(args, countdown=countdown)
        else:
            task.delay(*args)
    except REDIS_UNREACHABLE as error:
        redis_cache.outage.failed()
        log.warning("not queued, broker unreachable (the sweep will do it): %s%r: %s", task.name, args, error)


def enqueue_after_commit(task_name: str, *args, countdown: float = 0.0) -> None:
    """Queue the task named `task_name` with `args` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: enqueue(task_name, *args, countdown=countdown))
