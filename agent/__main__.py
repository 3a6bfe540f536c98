"""`python -m agent --portal URL --token TOKEN [--simulate SPEC]`: register, then heartbeat forever.

A refused token (401/403) ends the agent with exit code 2: it was revoked or is wrong,
and retrying cannot fix that. An unreachable portal is retried with exponential backoff
(with jitter, capped), and the agent registers again once the portal answers, so a
restarted portal or agent converges by itself.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import socket
import sys
import threading
from collections import defaultdict
from pathlib import Path

from agent import __version__, mig
from agent.gpus import GpuBackend
from agent import lease_channel
from agent.leases import DEFAULT_DIR, LeaseStore
from agent.portal_client import PortalClient, PortalError, PortalUnreachable

log = logging.getLogger("agent")


def make_backend(simulate: str | None, hostname: str) -> GpuBackend:
    if simulate:
        from agent.simulated import SimulatedBackend

        log.warning("SIMULATED NVML: reporting %s on %s; these are not real GPUs", simulate, hostname)
        return SimulatedBackend(simulate, hostname)
    from agent.nvml import NvmlBackend

    return NvmlBackend()


def _instance(lease: dict, gpu) -> dict | None:
    """The MIG device of `gpu` a lease names: by its UUID, else by profile and start slice."""
    for device in gpu.mig_devices:
        if device["uuid"] == lease.get("mig_uuid"):
            return device
    for device in gpu.mig_devices:
        if device.get("profile") == lease.get("mig_profile") and device.get("start") == lease.get("mig_start"):
            return device
    return None


HEARTBEATS_WHILE_STREAMING = 6


class Agent:
    def __init__(self, client: PortalClient, backend: GpuBackend, hostname: str, *, heartbeat: float,
                 max_backoff: float = 60.0, leases: LeaseStore | None = None,
                 allow_mig_reconfigure: bool = False) -> None:
        self.client = client
        self.backend = backend
        self.hostname = hostname
        self.heartbeat = heartbeat
        self.max_backoff = max_backoff
        self.stop = threading.Event()
        self.registered = False
        self.leases = leases
        # Create and destroy MIG instances as a dynamic MIG pool's leases ask (--allow-mig-reconfigure); off, a
        # lease for an instance the GPU does not have is refused, saying so.
        self.allow_mig_reconfigure = allow_mig_reconfigure
        self.lease_lock = threading.Lock()
        self.lease_channel_open = threading.Event()  # set by the lease channel while its WebSocket is up
        # Set while telemetry goes over its WebSocket: the portal then takes each frame as a sign of life, and
        # an HTTP heartbeat is sent only every HEARTBEATS_WHILE_STREAMING intervals, to learn that the portal
        # still knows this host (a 404 there makes it register again).
        self.telemetry_socket_open = threading.Event()
        self._quiet_beats = 0
        self._last_held: list[str] | None = None
        self._inventory = None
        if leases is not None and hasattr(backend, "lease_source"):
            backend.lease_source = leases.read  # a simulated host runs a process for each lease it holds

    def register(self) -> None:
        gpus = [gpu.as_dict() for gpu in self.backend.inventory()]
        answer = self.client.register(hostname=self.hostname, backend=self.backend.name,
                                      agent_version=__version__, gpus=gpus)
        self.heartbeat = float(answer.get("heartbeat_seconds", self.heartbeat))
        self.registered = True
        log.info("registered %s as node %s with %d GPUs", self.hostname, answer.get("node"), len(gpus))

    def take_leases(self, leases: list[dict]) -> dict:
        """Hold `leases` (refusing any for a GPU this host does not have); returns the report for the portal."""
        with self.lease_lock:
            own = {gpu.uuid: gpu for gpu in self.gpus()}
            failed: dict[str, str] = {}
            if self.allow_mig_reconfigure:
                failed.update(self._carve(leases, own))
                own = {gpu.uuid: gpu for gpu in self.gpus()}
            leases = [self._named(lease, own) for lease in leases]
            failed.update({lease["key"]: problem for lease in leases
                           if lease["key"] not in failed and (problem := self._foreign(lease, own))})
            try:
                held, problems = self.leases.replace([lease for lease in leases if lease["key"] not in failed])
            except OSError as error:  # the portal keeps waiting for a confirmation; say why here
                log.error("cannot write the leases in %s: %s", self.leases.dir, error)
                return {"held": self.leases.held_keys(), "failed": failed, "unleased_in_use": []}
            failed.update(problems)
            if held != self._last_held:
                log.info("now holding %d GPU lease(s): %s", len(held), ", ".join(held) or "none")
                self._last_held = held
            for key, problem in failed.items():
                log.error("lease %s refused: %s", key, problem)
            return {"held": held, "failed": failed, "unleased_in_use": self.unleased_in_use()}

    def _foreign(self, lease: dict, own: dict) -> str | None:
        """Why this host cannot hold `lease`: a GPU it does not have, or a MIG instance its GPU does not
        have (checked where the GPU reports MIG instances); None when it can."""
        gpu = own.get(lease.get("gpu_uuid"))
        if gpu is None:
            return f"GPU {lease.get('gpu_uuid')} is not on host {self.hostname}"
        if lease.get("mode") == "mig" and (gpu.mig_devices or gpu.mig_mode):
            if _instance(lease, gpu) is None:
                problem = (f"MIG instance {lease.get('mig_uuid')} ({lease.get('mig_profile')} at slice "
                           f"{lease.get('mig_start')}) is not on GPU {gpu.uuid} of host {self.hostname}")
                if not self.allow_mig_reconfigure:
                    problem += ("; this agent does not change MIG layouts (start it with --allow-mig-reconfigure "
                                "to let a dynamic MIG pool carve instances here)")
                return problem
        return None

    @staticmethod
    def _named(lease: dict, own: dict) -> dict:
        """A MIG lease with the instance's device UUID in mig_uuid, where the portal named it by GPU and start
        slice ("<GPU UUID>/<start>") before the host reported it: CUDA_VISIBLE_DEVICES takes the UUID."""
        gpu = own.get(lease.get("gpu_uuid"))
        device = _instance(lease, gpu) if gpu is not None and lease.get("mode") == "mig" else None
        return {**lease, "mig_uuid": device["uuid"]} if device and device["uuid"] != lease.get("mig_uuid") else lease

    def _carve(self, leases: list[dict], own: dict) -> dict[str, str]:
        """Create the MIG instances `leases` name that their GPUs lack (a dynamic MIG pool's), destroying only
        unleased instances in their way; returns the leases it could not serve, with why. A change makes the
        agent register again, so the portal learns the new instances' UUIDs."""
        on_gpu: dict[str, list[dict]] = defaultdict(list)
        for lease in leases:
            if lease.get("mode") == "mig" and lease.get("gpu_uuid") in own and lease.get("mig_start") is not None:
                on_gpu[lease["gpu_uuid"]].append(lease)
        failed: dict[str, str] = {}
        changed = False
        for gpu_uuid, gpu_leases in on_gpu.items():
            gpu = own[gpu_uuid]
            missing = [lease for lease in gpu_leases if _instance(lease, gpu) is None]
            if not missing:
                continue
            board = self.backend.mig_board(gpu_uuid) if hasattr(self.backend, "mig_board") else ""
            if not board:
                for lease in missing:
                    failed[lease["key"]] = (f"GPU {gpu_uuid} of host {self.hostname} is not in MIG mode (or not a "
                                            "board this agent can carve): the agent never changes MIG mode")
                continue
            wanted = [(lease.get("mig_profile"), int(lease["mig_start"])) for lease in gpu_leases]
            destroy, create, refused = mig.carve_plan(board, list(gpu.mig_devices), wanted)
            for lease in missing:
                why = refused.get((lease.get("mig_profile"), int(lease["mig_start"])))
                if why:
                    failed[lease["key"]] = f"cannot carve MIG instance on GPU {gpu_uuid}: {why}"
            if not create:
                continue
            log.warning("MIG on GPU %s: destroying the unleased instances at slices %s, creating %s", gpu_uuid,
                        destroy or "none", ", ".join(f"{p} at slice {s}" for p, s in create))
            try:
                for start in destroy:
                    self.backend.mig_destroy(gpu_uuid, start)
                for profile, start in create:
                    self.backend.mig_create(gpu_uuid, profile, start)
            except Exception as error:  # the driver refused (in use, not root, ...): those leases fail, say why
                log.error("MIG on GPU %s: %s", gpu_uuid, error)
                for lease in missing:
                    failed.setdefault(lease["key"], f"cannot carve MIG instance on GPU {gpu_uuid}: {error}")
            changed = True
        if changed:
            self._inventory = None
            self.registered = False  # report the new instances (their UUIDs) with the next registration
        return failed

    def gpus(self):
        if self._inventory is None:
            self._inventory = self.backend.inventory()
        return self._inventory

    def unleased_in_use(self) -> list[str]:
        """GPUs running processes that no lease covers (someone bypassed the portal)."""
        leased = {lease["gpu_uuid"] for lease in self.leases.read()}
        try:
            return sorted(s.uuid for s in self.backend.sample() if s.processes and s.uuid not in leased)
        except Exception as error:  # a sampling hiccup must not stop the lease exchange
            log.warning("could not read GPU processes: %s", error)
            return []

    def sync_leases(self) -> None:
        """HTTP fallback of the lease channel: say what this host holds, take what it should hold."""
        report = {"held": self.leases.held_keys(), "failed": {}, "unleased_in_use": self.unleased_in_use()}
        answer = self.client.leases(**report)
        taken = self.take_leases(answer.get("leases", []))
        if taken["held"] != report["held"] or taken["failed"]:
            self.client.leases(**taken)  # confirm at once, so an apply does not wait a whole interval

    def run(self) -> int:
        failures = 0
        while not self.stop.is_set():
            try:
                if not self.registered:
                    self.register()
                elif self.telemetry_socket_open.is_set() and self._quiet_beats < HEARTBEATS_WHILE_STREAMING - 1:
                    self._quiet_beats += 1
                else:
                    self._quiet_beats = 0
                    self.client.heartbeat()
                if self.leases is not None and not self.lease_channel_open.is_set():
                    self.sync_leases()  # the WebSocket is down (or off): poll instead
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
    parser.add_argument("--simulate", metavar="SPEC",
                        help="SIMULATED GPUs instead of NVML, e.g. 8xH100 or 2xA100-80GB:mig=all-1g.10gb")
    parser.add_argument("--ws-url", default=os.environ.get("GPUPOOL_AGENT_WS_URL"),
                        help="the lease channel's WebSocket URL, when the portal serves WebSockets at another "
                             "address than --portal (e.g. wss://ws.gpupool.example.com/ws/agent/); default: "
                             "--portal's /ws/agent/, as an ingress routing /ws/ to the ws process serves it")
    parser.add_argument("--hostname", default=socket.gethostname())
    parser.add_argument("--heartbeat", type=float, default=10.0, help="seconds between heartbeats")
    parser.add_argument("--state-dir", default=DEFAULT_DIR,
                        help="where this host's GPU leases are kept for job launchers (see agent.leases)")
    parser.add_argument("--user-map", metavar="FILE",
                        help="JSON {portal user: local account}: as root, hand leased device nodes to that account")
    parser.add_argument("--device-dir", default="/dev", help=argparse.SUPPRESS)  # tests point it elsewhere
    parser.add_argument("--no-lease-channel", action="store_true",
                        help="poll leases over HTTP only (no WebSocket)")
    parser.add_argument("--allow-mig-reconfigure", action="store_true",
                        help="create and destroy MIG instances on GPUs already in MIG mode as a dynamic MIG pool's "
                             "leases ask (only unleased instances are destroyed; the MIG mode is never changed). "
                             "Without it the agent never changes MIG and refuses such leases, saying why")
    parser.add_argument("--telemetry-interval", type=float, default=1.0,
                        help="seconds between GPU samples sent to the portal (0: no telemetry)")
    parser.add_argument("--telemetry-over", choices=["websocket", "http"], default="websocket",
                        help="send samples on a WebSocket beside the lease channel (the default; over HTTP "
                             "while it cannot be opened) or as HTTP requests only")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s agent: %(message)s")
    if not args.token:
        parser.error("--token (or GPUPOOL_AGENT_TOKEN) is required")

    backend = make_backend(args.simulate, args.hostname)
    user_map = json.loads(Path(args.user_map).read_text()) if args.user_map else {}
    agent = Agent(PortalClient(args.portal, args.token), backend, args.hostname, heartbeat=args.heartbeat,
                  leases=LeaseStore(args.state_dir, user_map=user_map, device_dir=args.device_dir,
                                    simulated=bool(args.simulate)),
                  allow_mig_reconfigure=args.allow_mig_reconfigure)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop.set())
    # Telemetry names a process's owner as the portal knows them: the user map read backwards.
    backend.portal_users = {local: user for user, local in user_map.items()}
    if not args.no_lease_channel:
        channel = lease_channel.LeaseChannel(args.portal, args.token, agent.take_leases, agent.stop,
                                             ready=lambda: agent.registered, url=args.ws_url)
        channel.connected = agent.lease_channel_open
        lease_channel.start(channel)
    if args.telemetry_interval > 0:
        from agent import telemetry

        telemetry_socket = (telemetry.socket_url(args.ws_url or lease_channel.ws_url(args.portal))
                            if args.telemetry_over == "websocket" else None)
        telemetry.start(agent.client, backend, agent.stop, lambda: agent.registered, args.telemetry_interval,
                        socket=telemetry_socket, socket_open=agent.telemetry_socket_open,
                        lease_channel_open=agent.lease_channel_open)
    try:
        return agent.run()
    finally:
        backend.close()


if __name__ == "__main__":
    sys.exit(main())
