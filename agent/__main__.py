"""`python -m agent --portal URL --token TOKEN [--simulate SPEC]`: register, then heartbeat forever.

A refused token (401/403) ends the agent with exit code 2: it was revoked or is wrong,
and retrying cannot fix that. An unreachable portal is retried with exponential backoff
(with jitter, capped), and the agent registers again once the portal answers, so a
restarted portal or agent converges by itself.
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import socket
import sys
import threading

from agent import __version__
from agent.gpus import GpuBackend
from agent.leases import DEFAULT_FILE, LeaseStore
from agent.portal_client import PortalClient, PortalError, PortalUnreachable

log = logging.getLogger("agent")


def make_backend(simulate: str | None, hostname: str) -> GpuBackend:
    if simulate:
        from agent.simulated import SimulatedBackend

        log.warning("SIMULATED NVML: reporting %s on %s; these are not real GPUs", simulate, hostname)
        return SimulatedBackend(simulate, hostname)
    from agent.nvml import NvmlBackend

    return NvmlBackend()


class Agent:
    def __init__(self, client: PortalClient, backend: GpuBackend, hostname: str, *, heartbeat: float,
                 max_backoff: float = 60.0, leases: LeaseStore | None = None) -> None:
        self.client = client
        self.backend = backend
        self.hostname = hostname
        self.heartbeat = heartbeat
        self.max_backoff = max_backoff
        self.stop = threading.Event()
        self.registered = False
        self.leases = leases

    def register(self) -> None:
        gpus = [gpu.as_dict() for gpu in self.backend.inventory()]
        answer = self.client.register(hostname=self.hostname, backend=self.backend.name,
                                      agent_version=__version__, gpus=gpus)
        self.heartbeat = float(answer.get("heartbeat_seconds", self.heartbeat))
        self.registered = True
        log.info("registered %s as node %s with %d GPUs", self.hostname, answer.get("node"), len(gpus))

    def sync_leases(self) -> None:
        """Tell the portal which leases this host holds and take the ones it should hold."""
        reported = self.leases.held_keys()
        answer = self.client.leases(held=reported)
        try:
            held = self.leases.replace(answer.get("leases", []))
        except OSError as error:  # the portal keeps waiting for a confirmation; say why here
            log.error("cannot write the lease file %s: %s", self.leases.path, error)
            return
        if held != reported:
            self.client.leases(held=held)  # confirm at once, so an apply does not wait a whole interval
            log.info("now holding %d GPU lease(s): %s", len(held), ", ".join(held) or "none")

    def run(self) -> int:
        failures = 0
        while not self.stop.is_set():
            try:
                if not self.registered:
                    self.register()
                else:
                    self.client.heartbeat()
                if self.leases is not None:
                    self.sync_leases()
                failures = 0
                wait = self.heartbeat
            except PortalError as error:
                if error.status in (401, 403):
                    log.error("the portal refused this host's token (%s): revoked or wrong; stopping", error.status)
                    return 2
                log.error("the portal refused a report: %s", error)
                self.registered = False
                failures += 1
                wait = self._backoff(failures)
            except PortalUnreachable as error:
                failures += 1
                self.registered = False  # the portal may have lost us; say who we are again
                wait = self._backoff(failures)
                log.warning("portal unreachable (%s); retrying in %.1f s", error, wait)
            self.stop.wait(wait)
        return 0

    def _backoff(self, failures: int) -> float:
        return min(self.max_backoff, 2 ** min(failures, 10)) * random.uniform(0.5, 1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--portal", required=True, help="the portal's base URL, e.g. https://gpupool.example.com")
    parser.add_argument("--token", default=os.environ.get("GPUPOOL_AGENT_TOKEN"),
                        help="this host's token (or GPUPOOL_AGENT_TOKEN)")
    parser.add_argument("--simulate", metavar="SPEC", help="SIMULATED GPUs instead of NVML, e.g. 8xH100")
    parser.add_argument("--hostname", default=socket.gethostname())
    parser.add_argument("--heartbeat", type=float, default=10.0, help="seconds between heartbeats")
    parser.add_argument("--lease-file", default=DEFAULT_FILE,
                        help="where this host's GPU leases are kept for job launchers (see agent.leases)")
    parser.add_argument("--telemetry-interval", type=float, default=1.0,
                        help="seconds between GPU samples sent to the portal (0: no telemetry)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s agent: %(message)s")
    if not args.token:
        parser.error("--token (or GPUPOOL_AGENT_TOKEN) is required")

    backend = make_backend(args.simulate, args.hostname)
    agent = Agent(PortalClient(args.portal, args.token), backend, args.hostname, heartbeat=args.heartbeat,
                  leases=LeaseStore(args.lease_file))
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop.set())
    if args.telemetry_interval > 0:
        from agent import telemetry

        telemetry.start(agent.client, backend, agent.stop, lambda: agent.registered, args.telemetry_interval)
    try:
        return agent.run()
    finally:
        backend.close()


if __name__ == "__main__":
    sys.exit(main())
