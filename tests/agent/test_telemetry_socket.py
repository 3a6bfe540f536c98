"""The agent's telemetry socket against real WebSocket servers: a refused socket sends over HTTP, a busy one
keeps the samples and backs off instead (HTTP would load the portal further)."""
from __future__ import annotations

import json
import socket as sockets
import threading
from http import HTTPStatus

import pytest
from websockets.sync.server import serve

from agent.portal_client import PortalUnreachable
from agent.telemetry import SocketPost


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Http:
    """The HTTP fallback: records what it was given."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def __call__(self, payload: dict) -> dict:
        self.bodies.append(payload)
        return {"ack": payload["batches"][-1]["seq"], "accepted": 1}


def _ack_frames(connection) -> None:
    for frame in connection:
        body = json.loads(frame)
        connection.send(json.dumps({"type": "ack", "ack": body["batches"][-1]["seq"], "accepted": 1}))


@pytest.fixture
def portal_socket():
    """A WebSocket server that acks every frame; its URL."""
    with serve(_ack_frames, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}/ws/agent/telemetry/"
        server.shutdown()


@pytest.fixture
def refusing_socket():
    """A server that answers the upgrade with 404, as a portal without the socket (or a proxy) does."""
    def refuse(connection, request):
        return connection.respond(HTTPStatus.NOT_FOUND, "no such socket\n")

    with serve(_ack_frames, "127.0.0.1", 0, process_request=refuse) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}/ws/agent/telemetry/"
        server.shutdown()


@pytest.fixture
def busy_socket():
    """A port whose kernel takes the connection but nothing ever answers the handshake: a process too busy to."""
    listener = sockets.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    yield f"ws://127.0.0.1:{listener.getsockname()[1]}/ws/agent/telemetry/"
    listener.close()


def batch(seq: int) -> dict:
    return {"stream": "s", "batches": [{"seq": seq, "t": 0.0, "gpus": []}]}


def post_to(url: str, timeout: float = 0.3, **kwargs) -> tuple[SocketPost, Http, Clock]:
    """Short timeouts, for the sockets that never answer; one that answers gets `timeout=5` (a loaded machine
    must not turn its 404 or its answer into a timeout)."""
    http, clock = Http(), Clock()
    return SocketPost(url, "token", http, timeout=timeout, clock=clock, jitter=lambda: 1.0, **kwargs), http, clock


def test_a_refused_socket_sends_over_http_and_tries_the_socket_again_after_retry_seconds(refusing_socket):
    post, http, clock = post_to(refusing_socket, timeout=5, retry_seconds=60)  # refused: HTTP at once, no tries first
    assert post(batch(1))["ack"] == 1
    assert len(http.bodies) == 1 and post.over_http
    clock.t += 59
    post(batch(2))
    assert len(http.bodies) == 2 and post.retry_at == 1060  # not tried again yet


def test_a_socket_that_times_out_while_the_lease_channel_is_up_keeps_the_samples_and_backs_off(busy_socket):
    lease_channel_open = threading.Event()
    lease_channel_open.set()
    post, http, clock = post_to(busy_socket, websockets_pass=lease_channel_open, backoff_cap=30)
    with pytest.raises(PortalUnreachable):
        post(batch(1))
    assert http.bodies == [] and not post.over_http
    assert post.retry_at == clock.t + 2  # 2 s, then 4, 8, ... up to the cap
    with pytest.raises(PortalUnreachable, match="busy"):
        post(batch(1))  # within the backoff: no new attempt, still no HTTP
    clock.t = post.retry_at
    with pytest.raises(PortalUnreachable):
        post(batch(1))
    assert post.retry_at == clock.t + 4 and http.bodies == []
    post.busy_failures = 10
    clock.t = post.retry_at
    with pytest.raises(PortalUnreachable):
        post(batch(1))
    assert post.retry_at == clock.t + 30


def test_timeouts_with_no_sign_that_websockets_pass_send_over_http_after_a_few_tries(busy_socket):
    """A proxy that swallows upgrades looks like a busy portal; without a lease channel up or an earlier answer
    there is no telling them apart for long, and samples must not wait forever: the first timeouts are taken
    for a busy (or starting) portal, the next one sends over HTTP."""
    post, http, clock = post_to(busy_socket, timeouts_before_http=2)
    for _ in range(2):
        with pytest.raises(PortalUnreachable):
            post(batch(1))
        clock.t = post.retry_at
    assert http.bodies == [] and post.busy_failures == 2
    assert post(batch(1))["ack"] == 1
    assert len(http.bodies) == 1 and post.over_http and post.busy_failures == 0


def test_once_answered_a_socket_that_stops_answering_backs_off_and_comes_back_to_the_socket(portal_socket,
                                                                                          busy_socket):
    post, http, clock = post_to(portal_socket, timeout=5)
    assert post(batch(1))["type"] == "ack" and post.answered and post.open_event.is_set()
    post.close()
    post.url, post.timeout = busy_socket, 0.3  # the same portal, now too busy to open a socket
    with pytest.raises(PortalUnreachable):
        post(batch(2))
    assert http.bodies == [] and post.busy_failures == 1
    post.url, post.timeout = portal_socket, 5
    clock.t = post.retry_at
    assert post(batch(2))["type"] == "ack"
    assert post.busy_failures == 0 and http.bodies == []
