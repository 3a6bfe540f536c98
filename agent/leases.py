"""GPU leases on a bare-metal host: which team (and user) may use which GPU until when.

The portal decides; the agent keeps the host's copy in a state folder, every file written
atomically (temp file + rename) so a job launcher never reads half a file:

* ``leases.json``: every lease in force, for the agent itself;
* ``reservation-<id>.env``: one per reservation, ``CUDA_VISIBLE_DEVICES`` (the leased GPU
  UUIDs, which CUDA accepts in place of indexes) plus ``GPUPOOL_TEAM``, ``GPUPOOL_USER``,
  ``GPUPOOL_RESERVATION`` and ``GPUPOOL_ENDS_AT``; a launcher sources it, or asks
  ``python -m agent.leases --team vision``. It is removed when the lease ends.

With ``--user-map`` (portal user → local account) and running as root, the agent also
hands each leased GPU's device node (``/dev/nvidia<index>``) to the lease's user (owner,
mode 0600) and gives it back as it was when the lease ends. Leases past their end are
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
            if local:
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
                 device_dir: str = "/dev") -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / "leases.json"
        self.devices = DeviceGrants(self.dir, user_map or {}, device_dir)

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
        current = [lease for lease in current if lease["key"] not in problems]
        if current != self.read(now) or not self.path.exists():
            _write(self.path, json.dumps({"updated_at": now.isoformat(), "leases": current}, indent=1))
        self._write_env_files(current)
        return sorted(lease["key"] for lease in current), problems

    def _write_env_files(self, leases: list[dict]) -> None:
        by_reservation: dict[int, list[dict]] = {}
        for lease in leases:
            by_reservation.setdefault(int(lease["reservation"]), []).append(lease)
        for reservation, group in by_reservation.items():
            first = group[0]
            text = "".join(f"{k}={v}\n" for k, v in (
                ("CUDA_VISIBLE_DEVICES", ",".join(lease["gpu_uuid"] for lease in group)),
                ("GPUPOOL_RESERVATION", reservation), ("GPUPOOL_TEAM", first["team"]),
                ("GPUPOOL_USER", first.get("user") or ""), ("GPUPOOL_ENDS_AT", first["ends_at"])))
            path = self.dir / f"reservation-{reservation}.env"
            if not path.exists() or path.read_text() != text:
                _write(path, text)
        for stale in self.dir.glob("reservation-*.env"):
            if stale.stem.removeprefix("reservation-") not in {str(r) for r in by_reservation}:
                stale.unlink(missing_ok=True)

    def held_keys(self) -> list[str]:
        return sorted(lease["key"] for lease in self.read())

    def visible_devices(self, team: str) -> str:
        return ",".join(lease["gpu_uuid"] for lease in self.read() if lease["team"] == team)


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
