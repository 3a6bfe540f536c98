"""The agent's WebSocket to the portal, on which the portal pushes the host's leases.

`wss://<portal>/ws/agent/` with `Authorization: Host <token>`. On connect (and so after
every restart or reconnect) the portal sends the host's current leases; after that it
sends them again whenever they change. The agent applies each set and answers what it
holds, what it could not apply and which GPUs run processes without a lease. The HTTP
lease poll in the main loop stays as a fallback for networks that block WebSockets.
"""
from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable

log = logging.getLogger("agent.leases")


def ws_url(portal: str) -> str:
    base = portal.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base[len("https://"):] + "/ws/agent/"
    return "ws://" + base.removeprefix("http://") + "/ws/agent/"


class LeaseChannel:
    def __init__(self, portal: str, token: str, handle: Callable[[list[dict]], dict], stop: threading.Event,
                 max_backoff: float = 30.0, ready: Callable[[], bool] = lambda: True, url: str | None = None
                 ) -> None:
        self.url = url or ws_url(portal)
        self.token = token
        self.handle = handle  # leases -> the report to send back
        self.stop = stop
        self.ready = ready  # the portal knows this host only once it has registered
        self.max_backoff = max_backoff
        self.connected = threading.Event()

    def run(self) -> None:
        from websockets.exceptions import InvalidStatus, WebSocketException
        from websockets.sync.client import connect

        failures = 0
        while not self.stop.is_set():
            if not self.ready():
                self.stop.wait(0.2)
                continue
            try:
                with connect(self.url, additional_headers={"Authorization": f"Host {self.token}"},
                             open_timeout=10, close_timeout=2) as ws:
                    self.connected.set()
                    failures = 0
                    log.info("lease channel open")
                    while not self.stop.is_set():
                        try:
                            message = json.loads(ws.recv(timeout=1.0))
                        except TimeoutError:
                            continue
                        if message.get("type") == "leases":
                            ws.send(json.dumps({"type": "held", **self.handle(message.get("leases", []))}))
            except InvalidStatus as error:
                status = error.response.status_code
                hint = {401: ": token revoked or wrong", 403: ": token revoked or wrong",
                        404: f": nothing serves WebSockets at {self.url}; route /ws/ to the portal's ws process "
                             "or give its address with --ws-url (leases still arrive by the HTTP poll)"}
                log.error("the portal refused the lease channel (%s)%s", status, hint.get(status, ""))
            except (OSError, TimeoutError, WebSocketException, ValueError) as error:
                log.warning("lease channel: %s", error)
            self.connected.clear()
            failures += 1
            self.stop.wait(min(self.max_backoff, 2 ** min(failures, 6)) * random.uniform(0.5, 1.0))


def start(channel: LeaseChannel) -> threading.Thread:
    thread = threading.Thread(target=channel.run, name="lease-channel", daemon=True)
    thread.start()
    return thread
