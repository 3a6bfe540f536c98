"""Processes in the agent's telemetry: their owner (from /proc, named as the portal user), their MIG
instance on a GPU in MIG mode (a fake of pynvml answering per MIG device handle), and the simulated
backend's processes for the leases it holds."""
from __future__ import annotations

import os
import pwd
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from agent.__main__ import Agent
from agent.gpus import process_owner
from agent.leases import LeaseStore
from agent.nvml import NvmlBackend
from agent.simulated import SimulatedBackend
from agent.telemetry import TelemetryBuffer, TelemetrySender

MIB = 1024 * 1024
ME = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture
def proc(tmp_path):
    """A /proc with processes 4242 (ours), 4343 (uid 987654, which has no name) and nothing else."""
    for pid, uid in ((4242, os.getuid()), (4343, 987654)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(f"Name:\tpython\nPid:\t{pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    return tmp_path


def test_a_process_owner_is_read_from_proc_and_named_as_the_portal_knows_them(proc):
    assert process_owner(4242, str(proc)) == ME
    assert process_owner(4242, str(proc), {ME: "alice"}) == "alice"  # --user-map {"alice": ME}, read backwards
    assert process_owner(4343, str(proc)) == "987654"  # no name in the password database: the uid
    assert process_owner(5555, str(proc)) == ""  # gone, or in another PID namespace


class NotSupported(Exception):
    pass


def fake_mig_nvml():
    """GPU h0 in MIG mode with instances m0 (GPU instance 7) and m2 (GPU instance 9) at indexes 0 and 2;
    GPU h1 whole. Processes are listed per MIG device handle, as NVML does on MIG."""
    listed = {"m0": [SimpleNamespace(pid=4242, usedGpuMemory=3000 * MIB)],
              "m2": [SimpleNamespace(pid=4343, usedGpuMemory=5000 * MIB), SimpleNamespace(pid=99, usedGpuMemory=None)],
              "h0": [], "h1": [SimpleNamespace(pid=4242, usedGpuMemory=512 * MIB)]}

    def mig_device(handle, index):
        if handle != "h0" or index not in (0, 2):
            raise NotSupported()
        return f"m{index}"

    return SimpleNamespace(
        NVMLError=NotSupported, NVML_TEMPERATURE_GPU=0, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetUUID=lambda h: f"MIG-{h}" if h.startswith("m") else f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=81559 * MIB, used=9000 * MIB),
        nvmlDeviceGetMigMode=lambda h: (1, 1) if h == "h0" else (0, 0),
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7,
        nvmlDeviceGetMigDeviceHandleByIndex=mig_device,
        nvmlDeviceGetGpuInstanceId=lambda m: {"m0": 7, "m2": 9}[m],
        nvmlDeviceGetComputeRunningProcesses=lambda h: listed[h],
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=50, memory=20),
        nvmlDeviceGetTemperature=lambda h, sensor: 55, nvmlDeviceGetPowerUsage=lambda h: 250000,
    )


def test_nvml_lists_processes_per_mig_instance_with_owner_instance_uuid_and_id(proc):
    backend = NvmlBackend(fake_mig_nvml())
    backend.proc_dir = str(proc)
    backend.portal_users = {ME: "alice"}
    mig, whole = backend.sample()
    assert [(p.pid, p.used_memory_mib, p.user, p.mig_uuid, p.gpu_instance_id) for p in mig.processes] == [
        (4242, 3000, "alice", "MIG-m0", 7), (4343, 5000, "987654", "MIG-m2", 9), (99, 0, "", "MIG-m2", 9)]
    assert [(p.pid, p.user, p.mig_uuid, p.gpu_instance_id) for p in whole.processes] == [(4242, "alice", "", None)]
    assert mig.as_dict()["processes"][0] == {"pid": 4242, "used_memory_mib": 3000, "user": "alice",
                                             "mig_uuid": "MIG-m0", "gpu_instance_id": 7}


def test_nvml_falls_back_to_the_gpus_own_list_when_no_instance_answers(proc):
    nv = fake_mig_nvml()
    nv.nvmlDeviceGetMigDeviceHandleByIndex = lambda h, i: (_ for _ in ()).throw(NotSupported())
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [SimpleNamespace(pid=4242, usedGpuMemory=MIB)]
    backend = NvmlBackend(nv)
    backend.proc_dir = str(proc)
    assert [(p.pid, p.user, p.mig_uuid) for p in backend.sample()[0].processes] == [(4242, ME, "")]


def _lease(backend, gpu: int, reservation: int, user: str, **mode) -> dict:
    ends = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    return {"key": f"{reservation}:{backend.uuids[gpu]}", "reservation": reservation, "team": "ml", "user": user,
            "gpu_uuid": backend.uuids[gpu], "gpu_index": gpu, "ends_at": ends, **mode}


def test_a_simulated_host_runs_one_process_per_lease_within_its_share():
    backend = SimulatedBackend("3xH100", "host-s", seed=4)
    leases = [_lease(backend, 0, 1, "bob", mode="time_slicing", shares=1, replicas=4),
              _lease(backend, 0, 2, "carol", mode="time_slicing", shares=2, replicas=4),
              _lease(backend, 1, 3, "dave", mode="mig", mig_uuid="MIG-1111", mig_profile="1g.10gb", memory_mib=9984),
              _lease(backend, 1, 4, "erin")]  # an older portal's lease: no mode fields at all
    backend.lease_source = lambda: leases
    for _ in range(50):
        shared, carved, free = backend.sample()
        by_user = {p.user: p for p in shared.processes}
        assert set(by_user) == {"bob", "carol"}
        assert 0 < by_user["bob"].used_memory_mib <= 81559 // 4 and 0 < by_user["carol"].used_memory_mib <= 81559 // 2
        assert shared.memory_used_mib >= sum(p.used_memory_mib for p in shared.processes)
        assert [(p.user, p.mig_uuid) for p in carved.processes] == [("dave", "MIG-1111"), ("erin", "")]
        assert carved.processes[0].used_memory_mib <= 9984
        assert free.processes == [] or free.processes[0].user == ""  # unleased: idle, bar a rare stray
    assert len({p.pid for p in shared.processes + carved.processes}) == 4  # one stable pid per lease


def test_a_lease_file_that_cannot_be_read_only_costs_the_processes():
    backend = SimulatedBackend("1xL4", "host-s", seed=1)
    backend.lease_source = lambda: 1 / 0
    assert len(backend.sample()) == 1


def test_the_agent_gives_a_simulated_backend_its_leases_and_telemetry_sends_the_processes(tmp_path):
    backend = SimulatedBackend("1xH100", "host-s", seed=2)
    store = LeaseStore(tmp_path)
    Agent(client=None, backend=backend, hostname="host-s", heartbeat=10, leases=store)
    store.replace([_lease(backend, 0, 7, "bob", mode="exclusive")])
    received = []
    sender = TelemetrySender(backend, lambda body: received.append(body) or {"ack": 1}, buffer=TelemetryBuffer())
    sender.tick()
    (process,) = received[0]["batches"][0]["gpus"][0]["processes"]
    assert process["user"] == "bob" and process["mig_uuid"] == "" and process["used_memory_mib"] > 0
