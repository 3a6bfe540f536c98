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

from common.agent_threads import on_agent_threads
from monitoring import live, selectors
from monitoring.ws_auth import current_user

# Close codes in the 4000 range are ours: refused before the handshake completes.
REFUSED = 4403
UNAUTHORIZED = 4401  # a host token unknown or revoked (as the agents' lease channel closes)
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


class AgentTelemetryConsumer(AsyncWebsocketConsumer):
    """`/ws/agent/telemetry/` with `Authorization: Host <key>`: a host agent's telemetry, one text frame per
    request body as `POST /api/v1/agent/telemetry/` takes it; each is answered `{"type": "ack", "accepted",
    "ack", "rejected", "clamped"}` or `{"type": "error", "status", "field", "rule", "message"}` (the status
    the HTTP answer would have had). Frames are ingested together with other agents' (monitoring.gather).
    The token is looked at again every RECHECK_SECONDS; a revoked one closes the socket with 4401."""

    token = None
    # It takes frames and answers them; nothing is ever sent to it through the channel layer (the ingest
    # publishes to the dashboards' groups itself). Without a layer a socket open costs no channel name and
    # no Redis SUBSCRIBE (channels_redis's new_channel), 1,250 of each at fleet size.
    channel_layer_alias = None

    async def connect(self) -> None:
        self.token = await self._token()
        if self.token is None:
            await self.close(code=UNAUTHORIZED)
            return
        self.recheck_at = _next_recheck()
        await self.accept()

    async def _token(self):
        from inventory import services

        for key, value in self.scope.get("headers", []):
            if key.lower() == b"authorization":
                parts = value.decode("latin-1").split()
                if len(parts) == 2 and parts[0] == "Host":
                    return await on_agent_threads(services.host_token_for_key)(parts[1])
        return None

    async def dispatch(self, message: dict) -> None:
        # Frames come here straight, not through Channels' dispatch: it closes stale database connections
        # before every handler, a thread hop per frame; the ingest's own thread does that.
        if message["type"] == "websocket.receive":
            await self.frame(message.get("text"), message.get("bytes"))
        else:
            await super().dispatch(message)

    async def frame(self, text: str | None, data: bytes | None) -> None:
        from django.conf import settings
        from django.utils.translation import gettext as _

        from monitoring import gather, ingest

        if self.token is None:
            return
        if time.monotonic() >= self.recheck_at:
            self.recheck_at = _next_recheck()
            if await self._token() is None:
                self.token = None
                await self.close(code=UNAUTHORIZED)
                return
        body = data if data is not None else (text or "").encode()
        if len(body) > settings.TELEMETRY_MAX_BODY_BYTES:
            answer = {"type": "error", "status": 413, "field": "body", "rule": "too_large",
                      "message": _("The request body is larger than %(limit)d bytes; send fewer batches at once.")
                      % {"limit": settings.TELEMETRY_MAX_BODY_BYTES}}
        else:
            try:
                payload = ingest.decode_body(body)
            except ValueError as error:
                payload = None
                answer = {"type": "error", "status": 400, "field": "body", "rule": "parse_error",
                          "message": _("JSON parse error - %(error)s") % {"error": error}}
            if payload is not None:
                try:
                    answer = {"type": "ack", **(await gather.gatherer().ingest(self.token, payload)).as_dict()}
                except Exception as error:  # noqa: BLE001 - answered, as the HTTP view would answer it
                    answer = gather.refusal(error)
        await self.send(text_data=json.dumps(answer))
