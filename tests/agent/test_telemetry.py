"""The agent's telemetry sender: bounded buffer, acks, and resending what the portal missed during an outage."""
from __future__ import annotations

import pytest

from agent.portal_client import PortalClient, PortalError, PortalUnreachable
from agent.simulated import SimulatedBackend
from agent.telemetry import TelemetryBuffer, TelemetrySender, http_post


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FlakyPortal:
    """Acks what it receives (like the real one: highest seq held), or is down."""

    def __init__(self) -> None:
        self.down = False
        self.received: list[dict] = []
        self.requests = 0

    def __call__(self, payload: dict) -> dict:
        self.requests += 1
        if self.down:
            raise PortalUnreachable("connection refused")
        held = {b["seq"] for b in self.received}
        self.received.extend(b for b in payload["batches"] if b["seq"] not in held)
        return {"ack": max(b["seq"] for b in self.received), "accepted": len(payload["batches"])}


def sender(portal, capacity=600, max_per_request=60):
    return TelemetrySender(SimulatedBackend("2xL4", "host-t", seed=1), portal, buffer=TelemetryBuffer(capacity),
                           max_per_request=max_per_request, clock=Clock())


def test_each_tick_sends_one_batch_of_every_gpu_and_forgets_it_once_acked():
    portal = FlakyPortal()
    s = sender(portal)
    s.tick()
    assert len(portal.received) == 1 and len(portal.received[0]["gpus"]) == 2
    assert {"uuid", "utilization_gpu_pct", "memory_used_mib", "temperature_c", "power_w", "processes"} <= set(
        portal.received[0]["gpus"][0])
    assert len(s.buffer) == 0


def test_batches_buffered_during_an_outage_are_resent_in_order_once_the_portal_is_back():
    portal = FlakyPortal()
    s = sender(portal, max_per_request=4)
    s.tick()
    portal.down = True
    for _ in range(10):
        s.clock.t += 1
        s.tick()
    assert len(s.buffer) == 10 and len(portal.received) == 1
    portal.down = False
    s.clock.t += 1
    s.tick()
    assert [b["seq"] for b in portal.received] == list(range(1, 13))
    assert [b["t"] for b in portal.received] == sorted(b["t"] for b in portal.received)
    assert len(s.buffer) == 0


def test_the_buffer_is_bounded_and_drops_the_oldest():
    portal = FlakyPortal()
    portal.down = True
    s = sender(portal, capacity=5)
    for _ in range(12):
        s.tick()
    assert len(s.buffer) == 5 and s.buffer.dropped == 7
    portal.down = False
    s.flush()
    assert [b["seq"] for b in portal.received] == [8, 9, 10, 11, 12]


def test_a_lost_answer_resends_but_the_portal_keeps_one_copy():
    portal = FlakyPortal()
    s = sender(portal)
    s.sample()

    def answer_lost(payload):
        portal(payload)
        raise PortalUnreachable("timed out reading the answer")

    s.post = answer_lost
    s.flush()
    s.post = portal
    s.flush()
    assert [b["seq"] for b in portal.received] == [1] and portal.requests == 2


def test_a_refused_token_stops_telemetry_and_a_refused_chunk_is_dropped():
    def refuse(status):
        def post(payload):
            raise PortalError(status, "no")
        return post

    s = sender(refuse(401))
    s.tick()
    assert s.refused and len(s.buffer) == 1
    s = sender(refuse(400))
    s.tick()
    assert not s.refused and len(s.buffer) == 0


@pytest.mark.django_db(transaction=True)
def test_the_agent_resends_to_the_real_portal_after_an_outage(live_server, world):
    """Against the real ingest: samples taken while the portal was unreachable all land in history."""
    import time

    from inventory import services
    from inventory.models import Gpu, Node
    from monitoring.models import Sample

    node = Node.objects.get(name="node-c")
    _, key = services.host_token_create(actor=world.staff, cluster=node.cluster, host_name=node.name)
    uuids = list(Gpu.objects.filter(node=node).order_by("index").values_list("uuid", flat=True))
    real = http_post(PortalClient(live_server.url, key))
    state = {"down": True}

    def post(payload):
        if state["down"]:
            raise PortalUnreachable("connection refused")
        return real(payload)

    s = TelemetrySender(SimulatedBackend("2xL4", node.name, seed=2, uuids=uuids), post)
    base = time.time() - 20
    for i in range(15):
        s.clock = lambda i=i: base + i
        s.tick()
    assert len(s.buffer) == 15 and not Sample.objects.exists()
    state["down"] = False
    s.clock = lambda: base + 15
    s.tick()
    assert len(s.buffer) == 0
    assert Sample.objects.count() == 2 * 16
    assert sorted(set(Sample.objects.values_list("ts", flat=True))) == [int(base) + i for i in range(16)]


def test_while_frames_are_answered_on_the_socket_only_every_sixth_heartbeat_goes_over_http():
    """The portal takes each telemetry frame as a sign of life; an HTTP heartbeat now and then still tells
    the agent whether the portal knows its host."""
    import threading

    from agent.__main__ import HEARTBEATS_WHILE_STREAMING, Agent

    class Portal:
        beats = 0

        def register(self, **_):
            return {"heartbeat_seconds": 0.001}

        def heartbeat(self):
            Portal.beats += 1
            if Portal.beats == 3:
                agent.stop.set()
            return {}

    agent = Agent(Portal(), SimulatedBackend("1xL4", "h"), "h", heartbeat=0.001)
    agent.telemetry_socket_open.set()
    ticks = []
    original = agent.stop.wait
    agent.stop.wait = lambda t: ticks.append(t) or original(0)
    threading.Thread(target=agent.run, daemon=True).start()
    assert original(5) or agent.stop.is_set()
    # register, then 3 heartbeats: one every HEARTBEATS_WHILE_STREAMING intervals after the registration's
    assert len(ticks) in (3 * HEARTBEATS_WHILE_STREAMING, 3 * HEARTBEATS_WHILE_STREAMING + 1)
