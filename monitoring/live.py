"""The one way live data leaves the portal: typed JSON messages to WebSocket groups.

Groups are `pool.<id>`, `node.<id>` and `team.<id>`. A message is serialized once here
and every consumer forwards the same text, so a group of 1,000 browsers costs one
`json.dumps`, not 1,000. Types (the `type` field of what the browser receives):

- `telemetry.samples`: {"type", "t", "samples": [{"gpu", "uuid", "util", "mem_util",
  "mem_used", "mem_total", "temp", "power"}, ...]}: the newest sample of each GPU of the
  group that one agent batch carried (one message per group per batch, never per GPU).
- `alert.changed`: {"type", "alert": {"id", "rule", "subject", "state", "value", "severity"}}.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

import orjson
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)

# The consumers' handler for every live message (LiveConsumer.live_message).
EVENT = "live.message"


def group_name(kind: str, key: int) -> str:
    return f"{kind}.{key}"


def send(groups: dict[str, dict[str, Any]], *, on_commit: bool = True) -> None:
    """Send each group its payload (a dict with a `type`), after the surrounding transaction commits.

    A dropped message only costs a chart point, so a channel-layer error is logged, never raised.
    """
    if not groups:
        return
    events = {group: {"type": EVENT, "text": orjson.dumps(payload).decode()} for group, payload in groups.items()}

    def push() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        if settings.EMBEDDED:
            # The in-memory layer lives in the server's event loop: send from there.
            try:
                async_to_sync(_send_all)(layer, events)
            except Exception:  # noqa: BLE001 - live data is best effort; history is in the database
                log.exception("could not publish live telemetry to %d groups", len(events))
        else:
            _Publisher.get().submit(layer, events)

    if on_commit:
        transaction.on_commit(push)
    else:
        push()


async def _send_all(layer, events: dict[str, dict]) -> None:
    await asyncio.gather(*(layer.group_send(group, event) for group, event in events.items()))


class _Publisher:
    """One event loop per process, on a daemon thread, that sends to the Redis channel layer.

    A WSGI worker has no event loop; async_to_sync would make a new one per request, and
    channels-redis a new Redis connection with it. This loop keeps its connections, and
    the request does not wait for the fan-out: it hands the messages over and answers.
    """

    _instance: _Publisher | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        threading.Thread(target=self.loop.run_forever, name="live-publisher", daemon=True).start()

    @classmethod
    def get(cls) -> _Publisher:
        with cls._lock:
            # A forked worker (gunicorn) must not reuse its parent's loop thread.
            if cls._instance is None or cls._instance.pid != os.getpid():
                cls._instance = cls()
            return cls._instance

    def submit(self, layer, events: dict[str, dict]) -> None:
        future = asyncio.run_coroutine_threadsafe(_send_all(layer, events), self.loop)
        future.add_done_callback(_log_failure)


def _log_failure(future) -> None:
    if future.exception() is not None:
        log.error("could not publish live telemetry: %r", future.exception())
