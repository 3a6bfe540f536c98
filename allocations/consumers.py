"""The lease channel of host agents: `/ws/agent/` with `Authorization: Host <key>`.

The portal sends `{"type": "leases", "leases": [...]}` on connect and whenever the host's
leases change (a `leases.changed` event on the host's group, sent by the agent backend);
the agent answers `{"type": "held", "held": [keys], "failed": {key: why},
"unleased_in_use": [uuids]}`. A bad message gets `{"type": "error", ...}`; a wrong or
revoked token closes the connection (4401), also one revoked or deleted while the
connection is open, or whose host was deleted (an `agent.recheck` event on the host's
group, sent when a token or node changes, makes an idle connection look again at once).
"""
from __future__ import annotations

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from allocations.api.agent import LeasesInput
from allocations.apply.backends.agent import agent_group, host_lease_report, host_leases
from common.agent_threads import on_agent_threads

def _header(scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


@on_agent_threads
def _node_for(key: str):
    from inventory import services

    token = services.host_token_for_key(key)
    return None if token is None else token.registered_node()


class AgentLeaseConsumer(AsyncJsonWebsocketConsumer):
    node = None
    key = ""

    async def connect(self) -> None:
        parts = _header(self.scope, b"authorization").split()
        if len(parts) == 2 and parts[0] == "Host":
            self.key = parts[1]
            self.node = await _node_for(self.key)
        if self.node is None:
            await self.close(code=4401)  # unknown or revoked token, or a host that never registered
            return
        await self.channel_layer.group_add(agent_group(self.node.pk), self.channel_name)
        await self.accept()
        await self.send_leases()

    async def disconnect(self, code: int) -> None:
        if self.node is not None:
            await self.channel_layer.group_discard(agent_group(self.node.pk), self.channel_name)

    async def still_authorized(self) -> bool:
        """Whether the token still opens this host; if not, the connection is closed (4401).

        Checked at connect only, a token revoked or deleted (or a host deleted) later kept the
        channel open: leases kept coming and the agent's answers were recorded, or failed on
        the deleted host's row. The token lookup is cached, and any change to a token drops
        its entry; messages on this channel are a few a minute."""
        if self.node is None:
            return False  # already closed
        node = await _node_for(self.key)
        if node is not None and node.pk == self.node.pk:
            return True
        await self.channel_layer.group_discard(agent_group(self.node.pk), self.channel_name)
        self.node = None
        await self.close(code=4401)
        return False

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        if not await self.still_authorized():
            return
        # Channels' JSON consumer raises on a binary or empty frame, which drops the connection
        # with a server error: answer it like any other bad message instead.
        if not text_data:
            await self.send_json({"type": "error", "field": "type", "message": "expected a JSON text frame"})
            return
        await super().receive(text_data=text_data, **kwargs)

    async def receive_json(self, content, **kwargs) -> None:
        if not isinstance(content, dict) or content.get("type") != "held":
            await self.send_json({"type": "error", "field": "type", "message": "expected a 'held' message"})
            return
        data = LeasesInput(data=content)  # the same rules as the HTTP fallback
        if not data.is_valid():
            field, problems = next(iter(data.errors.items()))
            await self.send_json({"type": "error", "field": field, "message": str(problems)})
            return
        await on_agent_threads(host_lease_report)(node=self.node, **data.validated_data)

    async def leases_changed(self, event) -> None:
        if await self.still_authorized():
            await self.send_leases()

    async def agent_recheck(self, event) -> None:
        """The host's token or node changed (allocations/apps.py): close if it no longer opens this host."""
        await self.still_authorized()

    async def send_leases(self) -> None:
        leases = await on_agent_threads(host_leases)(self.node)
        await self.send_json({"type": "leases", "leases": leases})

    @classmethod
    async def decode_json(cls, text_data):
        try:
            return await super().decode_json(text_data)
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the decoder's recursion limit
            return None
