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

import logging
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


@dataclass
class Batch:
    seq: int
    t: float
    gpus: list[dict]

    def as_dict(self) -> dict:
        return {"seq": self.seq, "t": self.t, "gpus": self.gpus}


class TelemetryBuffer:
    """Batches not yet acknowledged, oldest first, at most `capacity` (the oldest go first when full)."""

    def __init__(self, capacity: int = 600) -> None:
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
                 buffer: TelemetryBuffer | None = None, max_per_request: int = 60,
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


def start(client, backend: GpuBackend, stop: threading.Event, ready: Callable[[], bool],
          interval: float = 1.0) -> TelemetrySender:
    sender = TelemetrySender(backend, http_post(client), interval=interval)
    threading.Thread(target=sender.run, args=(stop, ready), name="telemetry", daemon=True).start()
    return sender
