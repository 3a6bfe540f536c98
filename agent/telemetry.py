"""Telemetry: sample every GPU once a second and send the samples to the portal, losing none on a short outage.

Each second the backend (NVML, or the simulation) is read once for all GPUs; the result
is one *batch* {"seq", "t", "gpus": [...]} appended to a bounded buffer. The sender
POSTs everything not yet acknowledged (oldest first, at most `max_per_request` batches
per request) to /api/v1/agent/telemetry/ with this run's `stream` id; the portal answers
the highest seq it holds (`ack`) and the buffer forgets up to it. While the portal is
unreachable batches pile up to `capacity` (default 600: ten minutes), then the oldest
are dropped and counted; once the portal answers again the backlog drains. The portal
ignores a seq it already holds, so a request whose answer was lost can be resent.
"""
from __future__ import annotations

import json
import logging
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from agent.gpus import GpuBackend
from agent.portal_client import PortalError, PortalUnreachable

log = logging.getLogger("agent.telemetry")

PATH = "/api/v1/agent/telemetry/"

# Defaults, named so that the benchmarks' agents (benchmarks.telemetry.agent_loop) mirror them rather than copy them.
BUFFER_BATCHES = 600  # ten minutes at 1 Hz
BATCHES_PER_REQUEST = 60
SOCKET_RETRY_SECONDS = 60.0  # after a refusal: HTTP for this long, then the socket again
SOCKET_BACKOFF_CAP_SECONDS = 30.0  # while the socket is only busy
TIMEOUTS_BEFORE_HTTP = 4


@dataclass
class Batch:
    seq: int
    t: float
    gpus: list[dict]

    def as_dict(self) -> dict:
        return {"seq": self.seq, "t": self.t, "gpus": self.gpus}


class TelemetryBuffer:
    """Batches not yet acknowledged, oldest first, at most `capacity` (the oldest go first when full)."""

    def __init__(self, capacity: int = BUFFER_BATCHES) -> None:
        self.batches: deque[Batch] = deque()
        self.capacity = capacity
        self.next_seq = 1
        self.dropped = 0
        self.lock = threading.Lock()

    def add(self, t: float, gpus: list[dict]) -> Batch:
        with self.lock:
            batch = Batch(self.next_seq, t, gpus)
            self.next_seq += 1
            self.batches.append(batch)
            while len(self.batches) > self.capacity:
                self.batches.popleft()
                self.dropped += 1
            return batch

    def pending(self, limit: int) -> list[Batch]:
        with self.lock:
            return list(self.batches)[:limit]

    def ack(self, seq: int) -> None:
        with self.lock:
            while self.batches and self.batches[0].seq <= seq:
                self.batches.popleft()

    def __len__(self) -> int:
        return len(self.batches)


class TelemetrySender:
    def __init__(self, backend: GpuBackend, post: Callable[[dict], dict], *, interval: float = 1.0,
                 buffer: TelemetryBuffer | None = None, max_per_request: int = BATCHES_PER_REQUEST,
                 clock: Callable[[], float] = time.time) -> None:
        self.backend = backend
        self.post = post
        self.interval = interval
        self.buffer = buffer if buffer is not None else TelemetryBuffer()
        self.max_per_request = max_per_request
        self.clock = clock
        self.stream = uuid.uuid4().hex
        self.refused = False  # the portal refused our token: stop
        self._unreachable = False

    def sample(self) -> Batch:
        gpus = [s.as_dict() for s in self.backend.sample()]
        return self.buffer.add(self.clock(), gpus)

    def flush(self) -> int:
        """Send what is pending until the buffer is empty or the portal is unreachable; returns batches acked."""
        sent = 0
        while len(self.buffer) and not self.refused:
            chunk = self.buffer.pending(self.max_per_request)
            try:
                answer = self.post({"stream": self.stream, "batches": [b.as_dict() for b in chunk]})
            except PortalUnreachable as error:
                if not self._unreachable:
                    log.warning("telemetry: portal unreachable (%s); buffering (%d batches held)", error,
                                len(self.buffer))
                self._unreachable = True
                return sent
            except PortalError as error:
                if error.status in (401, 403):
                    log.error("telemetry: the portal refused this host's token; stopping telemetry")
                    self.refused = True
                    return sent
                if error.status == 429:
                    return sent  # flooding: keep the data, try again next tick
                # 400/413: this chunk can never be accepted as it is; drop it rather than retry forever.
                log.error("telemetry: the portal refused %d batches (%s); dropping them", len(chunk), error)
                self.buffer.ack(chunk[-1].seq)
                continue
            if self._unreachable:
                log.info("telemetry: portal reachable again")
                self._unreachable = False
            ack = answer.get("ack")
            if ack is None:
                ack = chunk[-1].seq
            self.buffer.ack(int(ack))
            sent += len(chunk)
            rejected = answer.get("rejected") or {}
            if rejected:
                log.warning("telemetry: the portal rejected samples: %s", rejected)
            if int(ack) < chunk[-1].seq:
                return sent  # the portal holds less than we sent; try the rest next tick
        return sent

    def tick(self) -> None:
        self.sample()
        self.flush()

    def run(self, stop: threading.Event, ready: Callable[[], bool] = lambda: True) -> None:
        """Sample on each whole interval until `stop`; send once `ready()` (the host is registered)."""
        while not stop.is_set() and not self.refused:
            try:
                self.sample()
                if ready():
                    self.flush()
            except Exception:  # noqa: BLE001 - a bad read must not end the telemetry thread
                log.exception("telemetry: sampling failed")
            now = self.clock()
            stop.wait(self.interval - (now % self.interval))


def http_post(client) -> Callable[[dict], dict]:
    """The portal client's authenticated POST to the telemetry endpoint."""
    return lambda payload: client._post(PATH, payload)


class SocketPost:
    """Sends each request body as a text frame on `/ws/agent/telemetry/` and returns the portal's answer;
    while the socket cannot be opened (an older portal without it answers 404, a proxy that blocks
    WebSockets) it POSTs over HTTP instead and tries the socket again `retry_seconds` later.

    Except when the socket is only slow: an open or an answer that times out means the ws process is busy,
    not absent, while WebSockets are known to pass (this socket was answered in this run, or
    `websockets_pass` is set: the lease channel is up), and for the first `timeouts_before_http` timeouts in
    a row in any case (a proxy that blocks WebSockets refuses them, it seldom lets them hang; and a portal
    starting up, or a fleet of agents starting at once, makes every socket wait). Then the samples stay in
    the buffer and the socket is tried again after a backoff (doubling to `backoff_cap`, jittered). Sending
    them over HTTP instead would load the web process, which shares the portal's cores, so more sockets
    would time out: at 1,250 hosts that loop sent 7,039 batches over HTTP in a minute (README, fleet scale).

    Why a socket: the portal ingests the frames of many hosts together (monitoring.gather), where each
    HTTP request pays the web server's per-request cost; at a thousand hosts sending every second that
    cost is most of the portal's CPU. The answers are the HTTP answers' bodies, with the status of a
    refusal inside: the sender treats both paths alike."""

    def __init__(self, url: str, token: str, fallback: Callable[[dict], dict], *, timeout: float = 10.0,
                 retry_seconds: float = SOCKET_RETRY_SECONDS, backoff_cap: float = SOCKET_BACKOFF_CAP_SECONDS,
                 timeouts_before_http: int = TIMEOUTS_BEFORE_HTTP,
                 clock: Callable[[], float] = time.monotonic,
                 open_event: threading.Event | None = None, websockets_pass: threading.Event | None = None,
                 jitter: Callable[[], float] = lambda: random.uniform(0.5, 1.0)) -> None:
        self.url = url
        self.open_event = open_event or threading.Event()  # set while frames are answered on the socket
        self.websockets_pass = websockets_pass or threading.Event()
        self.token = token
        self.fallback = fallback
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.backoff_cap = backoff_cap
        self.timeouts_before_http = timeouts_before_http
        self.clock = clock
        self.jitter = jitter
        self.socket = None
        self.retry_at = 0.0
        self.over_http = False  # the socket was refused or is unreachable: POST until retry_at
        self.answered = False  # a frame was answered on the socket in this run
        self.busy_failures = 0  # timeouts in a row while the socket is only slow

    def _open(self):
        from websockets.exceptions import InvalidStatus, WebSocketException
        from websockets.sync.client import connect

        if self.socket is None and self.clock() >= self.retry_at:
            try:
                self.socket = connect(self.url, additional_headers={"Authorization": f"Host {self.token}"},
                                      open_timeout=self.timeout, close_timeout=2, max_size=None,
                                      legacy=True)  # kept across calls, not a with-block
                self.over_http = False
                log.info("telemetry: sending over %s", self.url)
            except TimeoutError as error:
                if not self._only_slow():
                    self._post_over_http(error)
                else:
                    self._back_off(f"opening it timed out ({error})")
            except (OSError, InvalidStatus, WebSocketException) as error:
                self._post_over_http(error)
        return self.socket

    def _only_slow(self) -> bool:
        """A timeout here means a busy portal, not a network that blocks WebSockets."""
        return self.answered or self.websockets_pass.is_set() or self.busy_failures < self.timeouts_before_http

    def _post_over_http(self, error: Exception) -> None:
        self.busy_failures = 0
        log.warning("telemetry: no WebSocket at %s (%s); sending over HTTP, trying again in %.0f s",
                    self.url, error, self.retry_seconds)
        self.over_http = True
        self.retry_at = self.clock() + self.retry_seconds

    def _back_off(self, why: str) -> None:
        self.busy_failures += 1
        delay = min(self.backoff_cap, 2.0 ** self.busy_failures) * self.jitter()
        log.warning("telemetry: the portal's socket is busy: %s; keeping the samples, trying again in %.1f s",
                    why, delay)
        self.over_http = False
        self.retry_at = self.clock() + delay

    def close(self) -> None:
        self.open_event.clear()
        if self.socket is not None:
            self.socket.close()
            self.socket = None

    def __call__(self, payload: dict) -> dict:
        from websockets.exceptions import ConnectionClosed, WebSocketException

        socket = self._open()
        if socket is None:
            if self.over_http:
                return self.fallback(payload)
            raise PortalUnreachable(f"telemetry socket busy; trying again in {self.retry_at - self.clock():.0f} s")
        try:
            socket.send(json.dumps(payload))
            answer = json.loads(socket.recv(timeout=self.timeout))
        except TimeoutError as error:
            self.close()  # an answer may still come on it: never read one request's answer for another's
            self._back_off(f"no answer in {self.timeout:.0f} s")
            raise PortalUnreachable(f"telemetry socket: {error}") from error
        except ConnectionClosed as error:
            self.socket = None
            self.open_event.clear()
            code = error.rcvd.code if error.rcvd is not None else None
            if code == 4401:
                raise PortalError(401, "the portal closed the telemetry socket: token revoked or wrong") from error
            raise PortalUnreachable(f"telemetry socket closed ({code})") from error
        except (OSError, WebSocketException, ValueError) as error:
            self.close()  # an answer may still come on it: never read one request's answer for another's
            raise PortalUnreachable(f"telemetry socket: {error}") from error
        if answer.get("type") == "ack":
            self.open_event.set()
            self.answered = True
            self.busy_failures = 0
            return answer
        status = int(answer.get("status") or 400)
        if status >= 500:
            raise PortalUnreachable(f"portal answered {status}: {answer.get('message', '')}")
        raise PortalError(status, json.dumps(answer))


def socket_url(lease_channel_url: str) -> str:
    """The telemetry socket beside the lease channel (…/ws/agent/ → …/ws/agent/telemetry/)."""
    return lease_channel_url.rstrip("/") + "/telemetry/"


def start(client, backend: GpuBackend, stop: threading.Event, ready: Callable[[], bool],
          interval: float = 1.0, socket: str | None = None,
          socket_open: threading.Event | None = None,
          lease_channel_open: threading.Event | None = None) -> TelemetrySender:
    """Sample and send in a thread of its own: over the WebSocket at `socket` when given (HTTP while it is
    refused; `socket_open` is set while frames are answered there; `lease_channel_open`, set while the lease
    channel's WebSocket is up, tells a busy socket from a blocked one), else over HTTP."""
    post = http_post(client)
    if socket:
        post = SocketPost(socket, client.token, post, timeout=client.timeout, open_event=socket_open,
                          websockets_pass=lease_channel_open)
    sender = TelemetrySender(backend, post, interval=interval)
    threading.Thread(target=sender.run, args=(stop, ready), name="telemetry", daemon=True).start()
    return sender
