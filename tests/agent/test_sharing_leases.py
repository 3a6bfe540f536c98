"""Shared GPUs on the host: what each sharing mode's lease writes into the reservation's env file, the
MPS control daemons (recorded on a simulated host, started and stopped through the real command where
it exists), and MIG leases checked against the instances the host has."""
from __future__ import annotations

import json
import os
import stat
from datetime import datetime, timedelta, timezone

from agent.__main__ import Agent
from agent.leases import LeaseStore
from agent.mps import MpsDaemons
from agent.simulated import SimulatedBackend

NOW = datetime.now(timezone.utc)
GPU_A, GPU_B = "GPU-aaaaaaaa-0001", "GPU-bbbbbbbb-0002"


def lease(reservation: int, gpu: str, mode: str, index: int = 0, **extra) -> dict:
    device = extra.get("mig_uuid", gpu)
    return {"key": f"{reservation}:{device}", "reservation": reservation, "team": "ml", "user": "ann",
            "gpu_uuid": gpu, "gpu_index": index, "ends_at": (NOW + timedelta(hours=1)).isoformat(), "mode": mode,
            **extra}


def env(path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_time_slicing_carries_the_gpu_uuid(tmp_path):
    LeaseStore(tmp_path).replace([lease(1, GPU_A, "time_slicing", shares=2, replicas=4)])
    values = env(tmp_path / "reservation-1.env")
    assert values["CUDA_VISIBLE_DEVICES"] == GPU_A
    assert values["GPUPOOL_MODE"] == "time_slicing" and values["GPUPOOL_SHARES"] == "2/4"


def test_an_exclusive_lease_is_as_before(tmp_path):
    LeaseStore(tmp_path).replace([{k: v for k, v in lease(1, GPU_A, "exclusive").items() if k != "mode"}])
    values = env(tmp_path / "reservation-1.env")
    assert values["CUDA_VISIBLE_DEVICES"] == GPU_A and values["GPUPOOL_MODE"] == "exclusive"
    assert not [k for k in values if k.startswith(("CUDA_MPS", "CUDA_DEVICE"))]


def test_an_mps_lease_carries_its_limits_and_the_simulated_host_records_the_daemon(tmp_path):
    store = LeaseStore(tmp_path, simulated=True)
    held, problems = store.replace([lease(3, GPU_A, "mps", shares=1, replicas=4, memory_mib=20389, cores_pct=25)])
    assert held == [f"3:{GPU_A}"] and problems == {}
    values = env(tmp_path / "reservation-3.env")
    pipe = str(tmp_path / "mps" / GPU_A / "pipe")
    assert values["CUDA_VISIBLE_DEVICES"] == GPU_A
    assert values["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert values["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20389M"
    assert values["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    record = json.loads((tmp_path / "mps-daemons.json").read_text())
    assert record == {GPU_A: {
        "command": "nvidia-cuda-mps-control -d", "running": False, "would_start": True, "why": "simulated host",
        "env": {"CUDA_VISIBLE_DEVICES": GPU_A, "CUDA_MPS_PIPE_DIRECTORY": pipe,
                "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps" / GPU_A / "log")}}}
    store.replace([])  # no MPS lease left: no daemon wanted
    assert json.loads((tmp_path / "mps-daemons.json").read_text()) == {}


def test_an_mps_lease_on_two_gpus_limits_each_by_its_position(tmp_path):
    LeaseStore(tmp_path, simulated=True).replace([
        lease(4, GPU_A, "mps", shares=2, replicas=4, memory_mib=40000, cores_pct=50),
        lease(4, GPU_B, "mps", index=1, shares=2, replicas=4, memory_mib=40000, cores_pct=50)])
    values = env(tmp_path / "reservation-4.env")
    assert values["CUDA_VISIBLE_DEVICES"] == f"{GPU_A},{GPU_B}"
    assert values["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40000M,1=40000M"
    assert values["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in values  # one client talks to one daemon: the launcher picks
    assert values["GPUPOOL_MPS_PIPE_DIRECTORIES"].count("=") == 2


def fake_mps_control(tmp_path, monkeypatch):
    """An `nvidia-cuda-mps-control` on PATH that behaves like the real one as far as the agent can see: -d
    leaves a process behind and its pid in the pipe directory; `quit` on stdin ends it. It logs each call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    script = bin_dir / "nvidia-cuda-mps-control"
    script.write_text(f"""#!/bin/sh
echo "$* visible=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY" >> {calls}
if [ "$1" = "-d" ]; then
  sleep 300 </dev/null >/dev/null 2>&1 &
  echo $! > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
  exit 0
fi
read command
[ "$command" = quit ] && kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")"
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return calls


def test_where_the_command_exists_one_daemon_per_gpu_is_started_and_stopped(tmp_path, monkeypatch):
    calls = fake_mps_control(tmp_path, monkeypatch)
    state = tmp_path / "state"
    store = LeaseStore(state)
    two = [lease(5, GPU_A, "mps", shares=1, replicas=2, memory_mib=1000, cores_pct=50),
           lease(6, GPU_A, "mps", shares=1, replicas=2, memory_mib=1000, cores_pct=50),
           lease(7, GPU_B, "mps", index=1, shares=1, replicas=2, memory_mib=1000, cores_pct=50)]
    held, problems = store.replace(two)
    assert len(held) == 3 and problems == {}
    log = calls.read_text().splitlines()
    assert sorted(log) == sorted([f"-d visible={GPU_A} pipe={state}/mps/{GPU_A}/pipe",
                                  f"-d visible={GPU_B} pipe={state}/mps/{GPU_B}/pipe"])  # one per GPU, not lease
    record = json.loads((state / "mps-daemons.json").read_text())
    assert record[GPU_A]["running"] and record[GPU_B]["running"]
    pid_a = int((state / "mps" / GPU_A / "pipe" / "nvidia-cuda-mps-control.pid").read_text())
    pid_b = int((state / "mps" / GPU_B / "pipe" / "nvidia-cuda-mps-control.pid").read_text())
    try:
        store.replace(two)  # same leases: nothing started again
        assert len(calls.read_text().splitlines()) == 2
        store.replace(two[:2])  # GPU B's only lease ended: its daemon is told to quit
        assert calls.read_text().splitlines()[-1] == f" visible={GPU_B} pipe={state}/mps/{GPU_B}/pipe"
        assert set(json.loads((state / "mps-daemons.json").read_text())) == {GPU_A}
        assert _gone(pid_b)
    finally:
        store.replace([])
        for pid in (pid_a, pid_b):
            if not _gone(pid):
                os.kill(pid, 9)


def _gone(pid: int) -> bool:
    import time

    for _ in range(50):  # the daemon is not our child: a zombie nobody reaped yet counts as gone
        try:
            with open(f"/proc/{pid}/status") as status:
                if any(line.startswith("State:") and "Z" in line for line in status):
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_a_daemon_that_cannot_start_refuses_its_gpus_leases_with_the_reason(tmp_path):
    def failing(*args, **kwargs):
        raise OSError("permission denied")

    store = LeaseStore(tmp_path, mps=MpsDaemons(tmp_path, run=failing, binary="sh"))  # `sh` is on PATH
    held, problems = store.replace([lease(8, GPU_A, "mps", shares=1, replicas=2, memory_mib=1, cores_pct=50),
                                    lease(9, GPU_B, "time_slicing", index=1, shares=1, replicas=2)])
    assert held == [f"9:{GPU_B}"]
    assert "cannot start the MPS control daemon" in problems[f"8:{GPU_A}"]


def test_a_vgpu_lease_carries_the_hami_core_limits(tmp_path):
    LeaseStore(tmp_path).replace([lease(10, GPU_A, "vgpu", memory_mib=20000, cores_pct=30),
                                  lease(10, GPU_B, "vgpu", index=1, memory_mib=20000, cores_pct=30)])
    values = env(tmp_path / "reservation-10.env")
    assert values["CUDA_VISIBLE_DEVICES"] == f"{GPU_A},{GPU_B}"
    assert values["CUDA_DEVICE_MEMORY_LIMIT_0"] == values["CUDA_DEVICE_MEMORY_LIMIT_1"] == "20000m"
    assert values["CUDA_DEVICE_SM_LIMIT"] == "30"


class FakePortal:
    def __init__(self, leases):
        self.desired = leases
        self.reports = []

    def leases(self, *, held, failed=None, unleased_in_use=None):
        self.reports.append((list(held), dict(failed or {})))
        return {"leases": self.desired}


def test_a_mig_lease_names_its_instances_and_one_the_gpu_does_not_have_is_refused(tmp_path):
    backend = SimulatedBackend("1xA100-80GB:mig=all-1g.10gb", "h")
    gpu = backend.inventory()[0]
    first, second = gpu.mig_devices[0], gpu.mig_devices[3]
    leases = [lease(11, gpu.uuid, "mig", mig_uuid=d["uuid"], mig_profile=d["profile"], mig_start=d["start"],
                    memory_mib=d["memory_mib"]) for d in (first, second)]
    stranger = lease(12, gpu.uuid, "mig", mig_uuid=f"{gpu.uuid}/4", mig_profile="3g.40gb", mig_start=4)
    portal = FakePortal([*leases, stranger])
    agent = Agent(portal, backend, "h", heartbeat=1, leases=LeaseStore(tmp_path))
    agent.sync_leases()
    held, failed = portal.reports[-1]
    assert held == sorted(f"11:{d['uuid']}" for d in (first, second))
    assert failed == {f"12:{gpu.uuid}/4": f"MIG instance {gpu.uuid}/4 (3g.40gb at slice 4) is not on GPU "
                                          f"{gpu.uuid} of host h; this agent does not change MIG layouts (start it "
                                          "with --allow-mig-reconfigure to let a dynamic MIG pool carve instances "
                                          "here)"}
    values = env(tmp_path / "reservation-11.env")
    assert values["CUDA_VISIBLE_DEVICES"] == f"{first['uuid']},{second['uuid']}"
    assert values["GPUPOOL_MODE"] == "mig"
    from agent.leases import main

    assert main(["--team", "ml", "--state-dir", str(tmp_path)]) == 0  # the launcher's helper names instances too
