"""The host's copy of its GPU leases: atomic files, per-reservation env files, device hand-over, expiry
without the portal, and the agent's side of the exchange."""
from __future__ import annotations

import json
import os
import stat
from datetime import datetime, timedelta, timezone

import pytest

from agent.__main__ import Agent
from agent.lease_channel import ws_url
from agent.leases import LeaseStore, main
from agent.simulated import SimulatedBackend

NOW = datetime.now(timezone.utc)


def lease(reservation: int, uuid: str, team: str = "ml", hours: float = 1.0, index: int = 0, user: str = "ann") -> dict:
    return {"key": f"{reservation}:{uuid}", "reservation": reservation, "team": team, "user": user,
            "gpu_uuid": uuid, "gpu_index": index, "ends_at": (NOW + timedelta(hours=hours)).isoformat()}


def test_the_store_holds_what_it_is_given_and_drops_expired_leases(tmp_path):
    store = LeaseStore(tmp_path / "state")
    assert store.read(NOW) == []  # no file yet: nothing held
    held, problems = store.replace([lease(1, "GPU-aaaaaaaa-1"), lease(2, "GPU-bbbbbbbb-2", hours=-1)], now=NOW)
    assert held == ["1:GPU-aaaaaaaa-1"] and problems == {}  # the one already over is not taken
    data = json.loads((tmp_path / "state" / "leases.json").read_text())
    assert data["leases"][0]["gpu_uuid"] == "GPU-aaaaaaaa-1"
    # Cut off from the portal, the lease still ends on time.
    assert store.read(NOW + timedelta(hours=2)) == []
    assert not list((tmp_path / "state").glob(".*"))  # no temp file left behind


def test_each_reservation_gets_an_env_file_that_goes_when_its_lease_ends(tmp_path):
    store = LeaseStore(tmp_path)
    store.replace([lease(1, "GPU-aaaaaaaa-1"), lease(1, "GPU-cccccccc-3", index=2),
                   lease(2, "GPU-bbbbbbbb-2", team="vision", user="bo")])
    assert (tmp_path / "reservation-1.env").read_text().splitlines()[:4] == [
        "CUDA_VISIBLE_DEVICES=GPU-aaaaaaaa-1,GPU-cccccccc-3", "GPUPOOL_RESERVATION=1", "GPUPOOL_TEAM=ml",
        "GPUPOOL_USER=ann"]
    assert "GPUPOOL_TEAM=vision" in (tmp_path / "reservation-2.env").read_text()
    store.replace([lease(2, "GPU-bbbbbbbb-2", team="vision", user="bo")])
    assert not (tmp_path / "reservation-1.env").exists() and (tmp_path / "reservation-2.env").exists()


def test_a_damaged_file_holds_nothing(tmp_path):
    (tmp_path / "leases.json").write_text("{not json")
    assert LeaseStore(tmp_path).read(NOW) == []


def test_a_launcher_gets_cuda_visible_devices_for_its_team(tmp_path, capsys):
    LeaseStore(tmp_path).replace([lease(1, "GPU-aaaaaaaa-1"), lease(1, "GPU-cccccccc-3"),
                                  lease(2, "GPU-bbbbbbbb-2", team="vision")])
    assert main(["--team", "ml", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "CUDA_VISIBLE_DEVICES=GPU-aaaaaaaa-1,GPU-cccccccc-3"
    assert main(["--team", "nlp", "--state-dir", str(tmp_path)]) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="handing device nodes over needs root")
def test_as_root_a_leased_device_node_goes_to_the_user_and_comes_back(tmp_path):
    import pwd

    devices = tmp_path / "dev"
    devices.mkdir()
    node = devices / "nvidia2"
    node.write_text("")
    os.chmod(node, 0o666)
    local = pwd.getpwuid(65534).pw_name  # nobody
    store = LeaseStore(tmp_path / "state", user_map={"ann": local}, device_dir=str(devices))
    held, problems = store.replace([lease(1, "GPU-aaaaaaaa-1", index=2)])
    assert held == ["1:GPU-aaaaaaaa-1"] and problems == {}
    st = os.stat(node)
    assert st.st_uid == 65534 and stat.S_IMODE(st.st_mode) == 0o600
    store.replace([])
    st = os.stat(node)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o666
    # A device that is not there: the lease is refused with the reason, not half-applied.
    held, problems = store.replace([lease(3, "GPU-dddddddd-4", index=7)])
    assert held == [] and "cannot hand" in problems["3:GPU-dddddddd-4"]


class FakePortal:
    def __init__(self, leases):
        self.desired = leases
        self.reports = []

    def leases(self, *, held, failed=None, unleased_in_use=None):
        self.reports.append((list(held), dict(failed or {})))
        return {"leases": self.desired}


def test_the_agent_takes_its_leases_refuses_foreign_gpus_and_confirms_at_once(tmp_path):
    backend = SimulatedBackend("1xH100", "h")
    mine = backend.inventory()[0].uuid
    portal = FakePortal([lease(7, mine), lease(8, "GPU-00000000-not-here")])
    agent = Agent(portal, backend, "h", heartbeat=1, leases=LeaseStore(tmp_path))
    agent.sync_leases()
    assert portal.reports[0] == ([], {})
    assert portal.reports[1] == ([f"7:{mine}"], {"8:GPU-00000000-not-here": "GPU GPU-00000000-not-here is not on host h"})
    portal.desired = [lease(7, mine)]
    agent.sync_leases()
    assert portal.reports[-1] == ([f"7:{mine}"], {}) and len(portal.reports) == 3  # nothing new: one call
    portal.desired = []
    agent.sync_leases()
    assert portal.reports[-1][0] == [] and LeaseStore(tmp_path).held_keys() == []


def test_the_lease_channel_address_follows_the_portals_scheme():
    assert ws_url("https://gpupool.example.com/") == "wss://gpupool.example.com/ws/agent/"
    assert ws_url("http://127.0.0.1:8000") == "ws://127.0.0.1:8000/ws/agent/"
