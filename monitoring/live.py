"""The one way live data leaves the portal: typed JSON messages to WebSocket groups.

Groups are `pool.<id>`, `node.<id>` and `team.<id>`. A message is serialized once here
and every consumer forwards the same text, so a group of 1,000 browsers costs one
serialization, not 1,000. Types (the `type` field of what the browser receives):

- `telemetry.samples`: {"type", "t", "samples": [{"gpu", "uuid", "util", "mem_util",
  "mem_used", "mem_total", "temp", "power", "processes": [[pid, used MiB], ...]}, ...]}: the newest sample of each GPU of the
  group that one agent batch carried (one message per group per batch, never per GPU). A GPU
  held now also has "shares": [{"reservation", "team", "instance" (a MIG instance's id, or ""),
  "allocated", "used"}] (MiB; a team's group lists only its own shares).
- `alert.changed`: {"type", "alert": {"id", "rule", "subject", "state", "value", "severity"}}.
"""
from __future__ import annotations

import logging
from typing import Any

import orjson
from django.db import transaction

from common.channel_layer import send_to_groups

log = logging.getLogger(__name__)

# The type of every live message (LiveConsumer.dispatch forwards its text to the socket).
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
        try:
            send_to_groups(events)
        except Exception:  # noqa: BLE001 - live data is best effort; history is in the database
            log.exception("could not publish live telemetry to %d groups", len(events))

    if on_commit:
        transaction.on_commit(push)
    else:
        push()
