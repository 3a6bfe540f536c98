"""The host's copy of its GPU leases: atomic file, expiry without the portal, and the agent's exchange."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from agent.__main__ import Agent
from agent.leases import LeaseStore, main
from agent.simulated import SimulatedBackend

NOW = datetime(2026, 11, 23, 12, tzinfo=timezone.utc)


def lease(key_id: int, uuid: str, team: str = "ml", hours: float = 1.0) -> dict:
    return {"key": f"{key_id}:{uuid}", "reservation": key_id, "team": team, "gpu_uuid": uuid, "gpu_index": 0,
            "ends_at": (NOW + timedelta(hours=hours)).isoformat()}


def test_the_store_holds_what_it_is_given_and_drops_expired_leases(tmp_path):
    store = LeaseStore(tmp_path / "sub" / "leases.json")
    assert store.read(NOW) == []  # no file yet: nothing held
    held = store.replace([lease(1, "GPU-aaaaaaaa-1"), lease(2, "GPU-bbbbbbbb-2", hours=-1)], now=NOW)
    assert held == ["1:GPU-aaaaaaaa-1"]  # the one already over is not taken
    assert json.loads((tmp_path / "sub" / "leases.json").read_text())["leases"][0]["gpu_uuid"] == "GPU-aaaaaaaa-1"
    # Cut off from the portal, the lease still ends on time.
    assert store.read(NOW + timedelta(hours=2)) == []
    assert not list((tmp_path / "sub").glob(".leases-*"))  # no temp file left behind


def test_a_damaged_file_holds_nothing(tmp_path):
    path = tmp_path / "leases.json"
    path.write_text("{not json")
    assert LeaseStore(path).read(NOW) == []


def test_a_launcher_gets_cuda_visible_devices_for_its_team(tmp_path, capsys):
    store = LeaseStore(tmp_path / "leases.json")
    future = datetime.now(timezone.utc)
    store.replace([dict(lease(1, "GPU-aaaaaaaa-1"), ends_at=(future + timedelta(hours=1)).isoformat()),
                   dict(lease(1, "GPU-cccccccc-3"), key="1:GPU-cccccccc-3", ends_at=(future + timedelta(hours=1)).isoformat()),
                   dict(lease(2, "GPU-bbbbbbbb-2", team="vision"), ends_at=(future + timedelta(hours=1)).isoformat())])
    assert main(["--team", "ml", "--file", str(tmp_path / "leases.json")]) == 0
    assert capsys.readouterr().out.strip() == "CUDA_VISIBLE_DEVICES=GPU-aaaaaaaa-1,GPU-cccccccc-3"
    assert main(["--team", "nlp", "--file", str(tmp_path / "leases.json")]) == 1


class FakePortal:
    def __init__(self, leases):
        self.desired = leases
        self.reports = []

    def leases(self, *, held):
        self.reports.append(list(held))
        return {"leases": self.desired}


def test_the_agent_takes_its_leases_and_confirms_them_at_once(tmp_path):
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    portal = FakePortal([dict(lease(7, "GPU-aaaaaaaa-1"), ends_at=later)])
    agent = Agent(portal, SimulatedBackend("1xH100", "h"), "h", heartbeat=1, leases=LeaseStore(tmp_path / "l.json"))
    agent.sync_leases()
    assert portal.reports == [[], ["7:GPU-aaaaaaaa-1"]]  # told what it held, then confirmed the new set
    agent.sync_leases()
    assert portal.reports[-1] == ["7:GPU-aaaaaaaa-1"] and len(portal.reports) == 3  # nothing new: one call
    portal.desired = []
    agent.sync_leases()
    assert portal.reports[-1] == [] and LeaseStore(tmp_path / "l.json").held_keys() == []
