"""Live telemetry over WebSockets: /ws/pools/<slug>/, /ws/nodes/<id>/, /ws/teams/<slug>/.

Thin: authenticate (session cookie, or `Authorization: Token …` for scripts), ask the
selector which group this user may join, join it, then forward what the group gets.
The one database read is at connect; each message is text serialized once by live.send,
so there is no per-client work beyond writing it to the socket. Access is looked at again
on the first message after RECHECK_SECONDS: a user who left the team, lost the pool's
quota, was deactivated, logged out or whose token was deleted stops receiving then (the
socket closes with REFUSED), not only at the next connect.
"""
from __future__ import annotations

import json
import random
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from monitoring import live, selectors
from monitoring.ws_auth import current_user

# Close codes in the 4000 range are ours: refused before the handshake completes.
REFUSED = 4403
# How stale a socket's permission may get: one database read per socket per interval, at most. The
# telemetry ingest's host map (which GPUs feed which team group) is cached as long.
RECHECK_SECONDS = 30


def _next_recheck() -> float:
    """When to look again: RECHECK_SECONDS on average, spread over half to one and a half of it.
    Sockets connect in waves (1,000 dashboards after a deploy); unspread, their re-checks came due
    together and held that second's messages behind 1,000 database reads (p95 549 and 845 ms in
    those seconds of the telemetry benchmark, ~80 ms in the others)."""
    return time.monotonic() + RECHECK_SECONDS * random.uniform(0.5, 1.5)


class LiveConsumer(AsyncWebsocketConsumer):
    kind = ""

    async def group_for(self, user) -> str | None:
        """The group this socket's URL names, if `user` may watch it (selectors.live_group)."""
        if not user:
            return None
        key = str(self.scope["url_route"]["kwargs"]["key"])
        return await database_sync_to_async(selectors.live_group)(user, self.kind, key)

    async def connect(self) -> None:
        group = await self.group_for(self.scope.get("user"))
        if group is None:
            await self.close(code=REFUSED)
            return
        self.group = group
        self.recheck_at = _next_recheck()
        await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send(text_data=json.dumps({"type": "hello", "group": group}))

    async def disconnect(self, code: int) -> None:
        group = getattr(self, "group", None)
        if group:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None) -> None:
        """Clients only listen; anything they send is ignored."""

    async def dispatch(self, message: dict) -> None:
        # A live message is forwarded here rather than through a handler: Channels' dispatch
        # closes stale database connections before every handler, through a thread hop, and
        # at 1,000 sockets that hop was a sixth of the delivery cost. Forwarding text never
        # touches the database.
        if message["type"] == live.EVENT:
            if time.monotonic() >= self.recheck_at and not await self.still_allowed():
                return
            if getattr(self, "group", None):  # none once refused: what was already queued is dropped
                await self.send(text_data=message["text"])
        else:
            await super().dispatch(message)

    async def still_allowed(self) -> bool:
        """Whether the user may still watch this group; if not, the socket leaves it and is closed."""
        self.recheck_at = _next_recheck()
        if not getattr(self, "group", None):
            return False
        if await self.group_for(await current_user(self.scope)) == self.group:
            return True
        await self.channel_layer.group_discard(self.group, self.channel_name)
        self.group = None
        await self.close(code=REFUSED)
        return False


class PoolConsumer(LiveConsumer):
    kind = "pool"


class NodeConsumer(LiveConsumer):
    kind = "node"


class TeamConsumer(LiveConsumer):
    kind = "team"
