"""GPU leases on a bare-metal host: which team (and user) may use which GPU until when.

The portal decides; the agent keeps the host's copy in a state folder, every file written
atomically (temp file + rename) so a job launcher never reads half a file:

* ``leases.json``: every lease in force, for the agent itself;
* ``reservation-<id>.env``: one per reservation, ``CUDA_VISIBLE_DEVICES`` (the leased GPU
  UUIDs, which CUDA accepts in place of indexes; for MIG the leased instances' MIG device
  UUIDs) plus ``GPUPOOL_TEAM``, ``GPUPOOL_USER``, ``GPUPOOL_RESERVATION``,
  ``GPUPOOL_ENDS_AT``, ``GPUPOOL_MODE`` and what the pool's sharing mode needs
  (:func:`mode_env`); a launcher sources it, or asks ``python -m agent.leases --team
  vision``. It is removed when the lease ends.

A lease says its mode (the grant's: ``exclusive``, ``time_slicing``, ``mps``, ``vgpu``,
``mig``; none means exclusive, as the portal sent before it shared GPUs). The portal sends
one lease per reservation and GPU (``"shares": k`` of ``"replicas": N`` for time-slicing
and MPS, with ``memory_mib``/``cores_pct`` for MPS and vGPU), and one per MIG instance
(``mig_uuid``, ``mig_profile``, ``mig_start``, keyed by the instance).

With ``--user-map`` (portal user → local account) and running as root, the agent also
hands each exclusively leased GPU's device node (``/dev/nvidia<index>``) to the lease's
user (owner, mode 0600) and gives it back as it was when the lease ends; a shared GPU's
node stays as it is, since other leases' users need it too. Leases past their end are
dropped even if the portal cannot be reached, so a host cut off from the portal does not
keep handing out GPUs it no longer may.
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from agent.mps import MpsDaemons


def _default_dir() -> str:
    """/run/gpupool for the system service (root); the user's state folder otherwise."""
    if os.environ.get("GPUPOOL_STATE_DIR"):
        return os.environ["GPUPOOL_STATE_DIR"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return "/run/gpupool"
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "gpupool")


DEFAULT_DIR = _default_dir()


def _ends(lease: dict) -> datetime:
    return datetime.fromisoformat(lease["ends_at"].replace("Z", "+00:00"))


def mode_of(lease: dict) -> str:
    return lease.get("mode") or "exclusive"


def device_of(lease: dict) -> str:
    """What CUDA_VISIBLE_DEVICES names for a lease: its MIG instance, else its GPU."""
    return (lease.get("mig_uuid") or lease["gpu_uuid"]) if mode_of(lease) == "mig" else lease["gpu_uuid"]


def _fraction_pct(lease: dict) -> int:
    """A share lease's compute cap in %: what the portal sent, else k/N of 100 (at least 1)."""
    if lease.get("cores_pct"):
        return int(lease["cores_pct"])
    return max(1, 100 * int(lease.get("shares") or 1) // max(1, int(lease.get("replicas") or 1)))


def mode_env(group: list[dict], mps_pipes: dict[str, str]) -> list[tuple[str, str]]:
    """The variables beyond CUDA_VISIBLE_DEVICES that one reservation's leases need, by its mode.

    ``i`` below is a GPU's 0-based position in CUDA_VISIBLE_DEVICES, which is how the client sees it.
    * mps: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (k/N of 100), CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
      ("i=<MiB>M" per GPU: by position, not UUID, which MPS does not apply reliably) and the
      pipe directory of the GPU's control daemon (CUDA_MPS_PIPE_DIRECTORY when it is one GPU;
      GPUPOOL_MPS_PIPE_DIRECTORIES, "<uuid>=<dir>" per GPU, always: one client talks to one daemon);
    * vgpu: HAMi-core's CUDA_DEVICE_MEMORY_LIMIT_<i> ("<MiB>m") and CUDA_DEVICE_SM_LIMIT (cores %),
      which bind only where libvgpu.so is preloaded (LD_PRELOAD);
    * time_slicing: GPUPOOL_SHARES ("k/N"), for the record: time-slicing isolates nothing;
    * exclusive and mig: nothing more (the devices say it all).
    """
    mode = mode_of(group[0])
    if mode == "mps":
        limits = ",".join(f"{i}={int(lease['memory_mib'])}M" for i, lease in enumerate(group)
                          if lease.get("memory_mib"))
        env = [("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(min(_fraction_pct(lease) for lease in group)))]
        if limits:
            env.append(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", limits))
        pipes = [(lease["gpu_uuid"], mps_pipes[lease["gpu_uuid"]]) for lease in group if lease["gpu_uuid"] in mps_pipes]
        if len(pipes) == 1:
            env.append(("CUDA_MPS_PIPE_DIRECTORY", pipes[0][1]))
        env.append(("GPUPOOL_MPS_PIPE_DIRECTORIES", ",".join(f"{gpu}={pipe}" for gpu, pipe in pipes)))
        return env
    if mode == "vgpu":
        env = [(f"CUDA_DEVICE_MEMORY_LIMIT_{i}", f"{int(lease['memory_mib'])}m") for i, lease in enumerate(group)
               if lease.get("memory_mib")]
        cores = [int(lease["cores_pct"]) for lease in group if lease.get("cores_pct")]
        if cores:
            env.append(("CUDA_DEVICE_SM_LIMIT", str(min(cores))))
        return env
    if mode == "time_slicing":
        return [("GPUPOOL_SHARES", ",".join(f"{int(lease.get('shares') or 1)}/{int(lease.get('replicas') or 1)}"
                                            for lease in group))]
    return []


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class DeviceGrants:
    """Hands device nodes to lease users and back. Only acts as root with a user map."""

    def __init__(self, state_dir: Path, user_map: dict[str, str], device_dir: str = "/dev") -> None:
        self.record = state_dir / "devices.json"  # what each device looked like before we touched it
        self.user_map = user_map
        self.device_dir = Path(device_dir)

    @property
    def active(self) -> bool:
        return bool(self.user_map) and os.geteuid() == 0

    def _saved(self) -> dict:
        try:
            return json.loads(self.record.read_text())
        except (OSError, ValueError):
            return {}

    def apply(self, leases: list[dict]) -> dict[str, str]:
        """Grant what `leases` say, restore the rest; returns {lease key: problem} for grants that failed."""
        if not self.active:
            return {}
        saved, problems, wanted = self._saved(), {}, {}
        for lease in leases:
            local = self.user_map.get(lease.get("user") or "")
            if local and mode_of(lease) == "exclusive":  # a shared GPU's node serves every lease on it
                wanted[str(self.device_dir / f"nvidia{lease['gpu_index']}")] = (lease["key"], local)
        for device, before in list(saved.items()):
            if device not in wanted or wanted[device][1] != before.get("granted_to"):
                try:
                    os.chown(device, before["uid"], before["gid"])
                    os.chmod(device, before["mode"])
                except OSError:
                    pass  # the device is gone (driver reload): nothing to give back
                del saved[device]
        for device, (key, local) in wanted.items():
            if device in saved:
                continue
            try:
                st = os.stat(device)
                uid = pwd.getpwnam(local).pw_uid
                saved[device] = {"uid": st.st_uid, "gid": st.st_gid, "mode": st.st_mode & 0o7777, "granted_to": local}
                os.chown(device, uid, st.st_gid)
                os.chmod(device, 0o600)
            except (OSError, KeyError) as error:
                saved.pop(device, None)
                problems[key] = f"cannot hand {device} to {local}: {error}"
        _write(self.record, json.dumps(saved, indent=1), 0o600)
        return problems


class LeaseStore:
    def __init__(self, state_dir: str | Path = DEFAULT_DIR, *, user_map: dict[str, str] | None = None,
                 device_dir: str = "/dev", simulated: bool = False, mps: MpsDaemons | None = None) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / "leases.json"
        self.devices = DeviceGrants(self.dir, user_map or {}, device_dir)
        # On a simulated host the MPS daemons are only recorded, never started.
        self.mps = mps or MpsDaemons(self.dir, simulated=simulated)

    def read(self, now: datetime | None = None) -> list[dict]:
        """The leases in force now (an unreadable or missing file holds none)."""
        now = now or datetime.now(timezone.utc)
        try:
            leases = json.loads(self.path.read_text()).get("leases", [])
        except (OSError, ValueError, AttributeError):
            return []
        return [lease for lease in leases if _ends(lease) > now]

    def replace(self, leases: list[dict], now: datetime | None = None) -> tuple[list[str], dict[str, str]]:
        """Hold exactly `leases` (minus expired ones); returns the keys now held and {key: problem} for
        leases that could not be applied."""
        now = now or datetime.now(timezone.utc)
        current = [lease for lease in leases if _ends(lease) > now]
        problems = self.devices.apply(current)
        mps_gpus = {lease["gpu_uuid"] for lease in current if mode_of(lease) == "mps" and lease["key"] not in problems}
        mps_problems = self.mps.apply(mps_gpus)
        problems.update({lease["key"]: mps_problems[lease["gpu_uuid"]] for lease in current
                         if mode_of(lease) == "mps" and lease["gpu_uuid"] in mps_problems})
        current = [lease for lease in current if lease["key"] not in problems]
        if current != self.read(now) or not self.path.exists():
            _write(self.path, json.dumps({"updated_at": now.isoformat(), "leases": current}, indent=1))
        self._write_env_files(current, {gpu: str(self.mps.pipe_dir(gpu)) for gpu in mps_gpus - set(mps_problems)})
        return sorted(lease["key"] for lease in current), problems

    def _write_env_files(self, leases: list[dict], mps_pipes: dict[str, str]) -> None:
        by_reservation: dict[int, list[dict]] = {}
        for lease in leases:
            by_reservation.setdefault(int(lease["reservation"]), []).append(lease)
        for reservation, group in by_reservation.items():
            first = group[0]
            text = "".join(f"{k}={v}\n" for k, v in (
                ("CUDA_VISIBLE_DEVICES", ",".join(dict.fromkeys(device_of(lease) for lease in group))),
                ("GPUPOOL_RESERVATION", reservation), ("GPUPOOL_TEAM", first["team"]),
                ("GPUPOOL_USER", first.get("user") or ""), ("GPUPOOL_ENDS_AT", first["ends_at"]),
                ("GPUPOOL_MODE", mode_of(first)), *mode_env(group, mps_pipes)))
            path = self.dir / f"reservation-{reservation}.env"
            if not path.exists() or path.read_text() != text:
                _write(path, text)
        for stale in self.dir.glob("reservation-*.env"):
            if stale.stem.removeprefix("reservation-") not in {str(r) for r in by_reservation}:
                stale.unlink(missing_ok=True)

    def held_keys(self) -> list[str]:
        return sorted(lease["key"] for lease in self.read())

    def visible_devices(self, team: str) -> str:
        return ",".join(dict.fromkeys(device_of(lease) for lease in self.read() if lease["team"] == team))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.leases",
                                     description="Print CUDA_VISIBLE_DEVICES for a team's GPU leases on this host.")
    parser.add_argument("--team", required=True)
    parser.add_argument("--state-dir", default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    devices = LeaseStore(args.state_dir).visible_devices(args.team)
    if not devices:
        print(f"team {args.team} holds no GPU on this host now", file=sys.stderr)
        return 1
    print(f"CUDA_VISIBLE_DEVICES={devices}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
