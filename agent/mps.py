"""MPS control daemons: one per GPU that an MPS lease uses, started and stopped by the agent.

A GPU of an MPS pool is shared by its leases' processes through NVIDIA's Multi-Process
Service. The agent keeps one control daemon per such GPU (``nvidia-cuda-mps-control -d``
with ``CUDA_VISIBLE_DEVICES`` set to that GPU's UUID and its own
``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY`` under the state folder, so the
daemons of two GPUs never meet) and stops it (``echo quit | nvidia-cuda-mps-control`` on
its pipe directory) once no lease needs it. Each lease's env file names its GPU's pipe
directory; the per-client caps (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``,
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) are in the env file too, since MPS reads them from
the client's environment.

On a simulated host, or where ``nvidia-cuda-mps-control`` is not on PATH, nothing is
started: ``mps-daemons.json`` records what would have been (command, environment, why not),
so the behaviour can be checked without a GPU. The agent changes no GPU setting here either
(not the compute mode); it only runs the daemon NVIDIA ships for this.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger("agent.mps")

BINARY = "nvidia-cuda-mps-control"


class MpsDaemons:
    def __init__(self, state_dir: Path, *, simulated: bool = False, binary: str = BINARY,
                 run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> None:
        self.root = state_dir / "mps"
        self.record = state_dir / "mps-daemons.json"
        self.simulated = simulated
        self.binary = binary
        self.run = run

    def pipe_dir(self, gpu_uuid: str) -> Path:
        return self.root / gpu_uuid / "pipe"

    def log_dir(self, gpu_uuid: str) -> Path:
        return self.root / gpu_uuid / "log"

    def env(self, gpu_uuid: str) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": gpu_uuid, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(gpu_uuid)),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(gpu_uuid))}

    def read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.record.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def apply(self, gpu_uuids: Iterable[str]) -> dict[str, str]:
        """Keep a daemon for exactly these GPUs; returns {GPU UUID: problem} for those that could not start."""
        from agent.leases import _write  # one atomic writer for every file of the state folder

        wanted = sorted(set(gpu_uuids))
        record, problems = self.read(), {}
        for gpu in [g for g in record if g not in wanted]:
            if record[gpu].get("running"):
                self._stop(gpu)
            del record[gpu]
        binary = None if self.simulated or not wanted else shutil.which(self.binary)
        for gpu in wanted:
            entry = {"command": f"{self.binary} -d", "env": self.env(gpu)}
            if binary is None:
                entry.update(running=False, would_start=True,
                             why="simulated host" if self.simulated else f"{self.binary} is not on PATH")
                if record.get(gpu) != entry:
                    log.info("MPS control daemon for GPU %s not started (%s): would run %s with %s", gpu,
                             entry["why"], entry["command"], entry["env"])
                record[gpu] = entry
                continue
            if self._alive(gpu):  # ours, still running (also after an agent restart)
                record[gpu] = {**entry, "running": True}
                continue
            try:
                for folder in (self.pipe_dir(gpu), self.log_dir(gpu)):
                    folder.mkdir(parents=True, exist_ok=True)
                # -d forks the daemon and returns; no pipes to it, or run() would wait on the daemon's output.
                self.run([binary, "-d"], env={**os.environ, **self.env(gpu)}, check=True, timeout=30,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            except (OSError, subprocess.SubprocessError) as error:
                problems[gpu] = f"cannot start the MPS control daemon for GPU {gpu}: {error}"
                record.pop(gpu, None)
                continue
            log.info("MPS control daemon started for GPU %s (pipe %s)", gpu, self.pipe_dir(gpu))
            record[gpu] = {**entry, "running": True}
        if record or self.record.exists():
            _write(self.record, json.dumps(record, indent=1, sort_keys=True))
        return problems

    def _alive(self, gpu: str) -> bool:
        """The daemon writes its pid into its pipe directory; is that process still there?"""
        try:
            os.kill(int((self.pipe_dir(gpu) / "nvidia-cuda-mps-control.pid").read_text().strip()), 0)
            return True
        except (OSError, ValueError):
            return False

    def _stop(self, gpu: str) -> None:
        binary = shutil.which(self.binary) or self.binary
        try:
            self.run([binary], input="quit\n", text=True, env={**os.environ, **self.env(gpu)}, check=True,
                     capture_output=True, timeout=30)
            log.info("MPS control daemon stopped for GPU %s", gpu)
        except (OSError, subprocess.SubprocessError) as error:
            log.warning("could not stop the MPS control daemon for GPU %s: %s", gpu, error)
