"""GPU leases on a bare-metal host: which team may use which GPU until when.

The portal decides; the agent keeps the host's copy in one JSON file, written atomically
(temp file + rename) so a job launcher never reads half a file. A launcher asks
``python -m agent.leases --team vision`` for ``CUDA_VISIBLE_DEVICES`` (the leased GPU
UUIDs, which CUDA accepts in place of indexes). Leases past their end are dropped even if
the portal cannot be reached, so a host cut off from the portal does not keep handing out
GPUs it no longer may.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path



def _default_file() -> str:
    """/run/gpupool for the system service (root); the user's state folder otherwise."""
    if os.environ.get("GPUPOOL_LEASE_FILE"):
        return os.environ["GPUPOOL_LEASE_FILE"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return "/run/gpupool/leases.json"
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "gpupool", "leases.json")


DEFAULT_FILE = _default_file()


def _ends(lease: dict) -> datetime:
    return datetime.fromisoformat(lease["ends_at"].replace("Z", "+00:00"))


class LeaseStore:
    def __init__(self, path: str | Path = DEFAULT_FILE) -> None:
        self.path = Path(path)

    def read(self, now: datetime | None = None) -> list[dict]:
        """The leases in force now (an unreadable or missing file holds none)."""
        now = now or datetime.now(timezone.utc)
        try:
            leases = json.loads(self.path.read_text()).get("leases", [])
        except (OSError, ValueError, AttributeError):
            return []
        return [lease for lease in leases if _ends(lease) > now]

    def replace(self, leases: list[dict], now: datetime | None = None) -> list[str]:
        """Hold exactly `leases` (minus expired ones); returns the keys now held."""
        now = now or datetime.now(timezone.utc)
        current = [lease for lease in leases if _ends(lease) > now]
        if current != self.read(now) or not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".leases-")
            with os.fdopen(fd, "w") as out:
                json.dump({"updated_at": now.isoformat(), "leases": current}, out, indent=1)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        return sorted(lease["key"] for lease in current)

    def held_keys(self) -> list[str]:
        return sorted(lease["key"] for lease in self.read())

    def visible_devices(self, team: str) -> str:
        return ",".join(lease["gpu_uuid"] for lease in self.read() if lease["team"] == team)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.leases",
                                     description="Print CUDA_VISIBLE_DEVICES for a team's GPU leases on this host.")
    parser.add_argument("--team", required=True)
    parser.add_argument("--file", default=DEFAULT_FILE)
    args = parser.parse_args(argv)
    devices = LeaseStore(args.file).visible_devices(args.team)
    if not devices:
        print(f"team {args.team} holds no GPU on this host now", file=sys.stderr)
        return 1
    print(f"CUDA_VISIBLE_DEVICES={devices}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
