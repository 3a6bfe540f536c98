"""Where the WebSocket process runs host agents' database work: a few threads of their own.

Channels runs `database_sync_to_async` work on one thread per process by default (thread-sensitive),
which suits a browser's socket but not 1,250 hosts: every lease channel that opens reads its token, its
node and its leases, every `held` answer is written, and every telemetry socket checks its token, and on
one thread all of that queued behind itself. In the fleet benchmark only 32 of 1,250 lease channels were
open after the 20 s warm-up, while the WebSocket process used under half a core: waiting, not computing.
These calls share nothing that needs one thread (each opens and returns its own pooled connection), so
they run AGENT_DB_THREADS at a time. Telemetry ingests keep their own single thread (monitoring.gather).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from channels.db import database_sync_to_async

# A few, not many: each holds a database connection while it runs (DB_POOL_MAX_SIZE is per process) and
# the work is short round trips, so a handful keeps the database busy without crowding the pool.
AGENT_DB_THREADS = 4
_executor = ThreadPoolExecutor(max_workers=AGENT_DB_THREADS, thread_name_prefix="agent-db")


def on_agent_threads(function):
    """`function` as a coroutine function that runs on the agents' threads, with Django's connection handling."""
    return database_sync_to_async(function, thread_sensitive=False, executor=_executor)
