"""WebSocket routes of every app: live telemetry for a pool, a node or a team; host agents' lease channel."""
from django.urls import path

from allocations.consumers import AgentLeaseConsumer
from monitoring.consumers import NodeConsumer, PoolConsumer, TeamConsumer

websocket_urlpatterns: list = [
    path("ws/pools/<slug:key>/", PoolConsumer.as_asgi()),
    path("ws/nodes/<int:key>/", NodeConsumer.as_asgi()),
    path("ws/teams/<slug:key>/", TeamConsumer.as_asgi()),
    path("ws/agent/", AgentLeaseConsumer.as_asgi()),  # host agents: their GPU leases
]
