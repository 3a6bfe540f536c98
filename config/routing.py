"""WebSocket routes of every app: live telemetry for a pool, a node or a team; host agents' lease channel."""
from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import path, re_path

from allocations.consumers import AgentLeaseConsumer
from monitoring.consumers import AgentTelemetryConsumer, NodeConsumer, PoolConsumer, TeamConsumer

NO_SUCH_SOCKET = 4404


class NoSuchSocket(AsyncWebsocketConsumer):
    """Any other path (a typo, a node id too long for a route): refused with 4404 at the handshake.
    Without it Channels' router raises "No route found" and the server logs a traceback."""

    async def connect(self) -> None:
        await self.close(code=NO_SUCH_SOCKET)

# Host agents' sockets: each consumer checks the `Authorization: Host <key>` header itself, so they need no
# session, cookie or user (config.asgi routes them past that stack).
agent_urlpatterns: list = [
    path("ws/agent/", AgentLeaseConsumer.as_asgi()),  # host agents: their GPU leases
    path("ws/agent/telemetry/", AgentTelemetryConsumer.as_asgi()),  # host agents: their samples
]

# People's sockets (browsers with their session, scripts with a Token), then anything else.
websocket_urlpatterns: list = [
    path("ws/pools/<slug:key>/", PoolConsumer.as_asgi()),
    path("ws/nodes/<int:key>/", NodeConsumer.as_asgi()),
    path("ws/teams/<slug:key>/", TeamConsumer.as_asgi()),
    re_path(r"", NoSuchSocket.as_asgi()),  # last: everything no route above took
]
