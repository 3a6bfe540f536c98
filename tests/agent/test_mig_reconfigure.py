"""Dynamic MIG on the host: the agent carves the instances a lease names only when started with
--allow-mig-reconfigure, destroying only unleased instances in the way; without it, it changes nothing and
refuses the lease, saying why. On a simulated host (new instances get new UUIDs) and through a fake NVML
(the hardware edge: the calls a real GPU would get)."""
from __future__ import annotations

from types import SimpleNamespace

from agent.__main__ import Agent, main
from agent.leases import LeaseStore
from agent.nvml import NvmlBackend
from agent.simulated import SimulatedBackend
from tests.agent.test_sharing_leases import FakePortal, env, lease


def mig_lease(reservation: int, gpu: str, profile: str, start: int, device: str | None = None) -> dict:
    return lease(reservation, gpu, "mig", mig_uuid=device or f"{gpu}/{start}", mig_profile=profile, mig_start=start)


def test_without_the_opt_in_the_agent_changes_no_mig_and_says_why(tmp_path):
    backend = SimulatedBackend("1xA100-80GB:mig=all-enabled", "h")
    gpu = backend.inventory()[0].uuid
    portal = FakePortal([mig_lease(5, gpu, "3g.40gb", 4)])
    agent = Agent(portal, backend, "h", heartbeat=1, leases=LeaseStore(tmp_path))
    agent.sync_leases()
    held, failed = portal.reports[-1]
    assert held == [] and "--allow-mig-reconfigure" in failed[f"5:{gpu}/4"]
    assert backend.mig_changes == [] and backend.inventory()[0].mig_devices == ()


def test_with_the_opt_in_the_agent_carves_around_the_leased_instances(tmp_path):
    backend = SimulatedBackend("1xA100-80GB:mig=all-balanced", "h")  # 2g@0, 1g@2, 1g@3, 3g@4
    gpu = backend.inventory()[0]
    three_g = next(d for d in gpu.mig_devices if d["profile"] == "3g.40gb")
    keep = mig_lease(6, gpu.uuid, "3g.40gb", 4, three_g["uuid"])
    portal = FakePortal([keep, mig_lease(7, gpu.uuid, "3g.40gb", 0),  # needs 0-3: the free 2g and 1gs go
                         mig_lease(8, gpu.uuid, "1g.10gb", 5)])  # inside the leased 3g: refused
    agent = Agent(portal, backend, "h", heartbeat=1, leases=LeaseStore(tmp_path), allow_mig_reconfigure=True)
    agent.registered = True
    agent.sync_leases()
    held, failed = portal.reports[-1]
    assert sorted(held) == [f"6:{three_g['uuid']}", f"7:{gpu.uuid}/0"]
    assert failed == {f"8:{gpu.uuid}/5": f"cannot carve MIG instance on GPU {gpu.uuid}: 1g.10gb at slice 5 overlaps "
                                         f"3g.40gb at slice 4, which a lease holds"}
    assert backend.mig_changes == [("destroy", gpu.uuid, "2g.20gb", 0), ("destroy", gpu.uuid, "1g.10gb", 2),
                                   ("destroy", gpu.uuid, "1g.10gb", 3), ("create", gpu.uuid, "3g.40gb", 0)]
    devices = backend.inventory()[0].mig_devices
    assert [(d["profile"], d["start"]) for d in devices] == [("3g.40gb", 0), ("3g.40gb", 4)]
    new = devices[0]["uuid"]
    assert new.startswith("MIG-") and new not in {d["uuid"] for d in gpu.mig_devices}  # a new instance, a new UUID
    assert devices[1]["uuid"] == three_g["uuid"]  # the leased one untouched
    assert env(tmp_path / "reservation-7.env")["CUDA_VISIBLE_DEVICES"] == new
    assert agent.registered is False  # registers again, so the portal learns the new UUID
    changes = len(backend.mig_changes)
    agent.sync_leases()  # the same leases again: nothing more to change
    assert len(backend.mig_changes) == changes


def test_the_opt_in_is_a_command_line_flag(monkeypatch):
    seen = {}

    class Stop(Exception):
        pass

    def capture(self, *args, **kwargs):
        seen["allow"] = kwargs.get("allow_mig_reconfigure")
        raise Stop

    monkeypatch.setattr(Agent, "__init__", capture)
    for argv, allow in ((["--allow-mig-reconfigure"], True), ([], False)):
        try:
            main(["--portal", "http://127.0.0.1:9", "--token", "t", "--simulate", "1xA100-80GB:mig=all-enabled",
                  "--no-lease-channel", "--telemetry-interval", "0", *argv])
        except Stop:
            pass
        assert seen["allow"] is allow


class FakeMigNvml:
    """An A100-80GB in MIG mode with a 3g.40gb at slice 4, as NVML's MIG calls see it; records every change."""

    NVMLError = LookupError
    NVML_GPU_INSTANCE_PROFILE_COUNT = 8
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
    NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 2
    PROFILES = {0: ("MIG 1g.10gb", 1, 10240), 5: ("MIG 3g.40gb", 3, 40960), 2: ("MIG 2g.20gb", 2, 20480)}

    def __init__(self):
        self.instances = {1: (5, 4, "MIG-old-3g")}  # GI id -> (profile code, start, device UUID)
        self.calls: list[tuple] = []

    class c_nvmlGpuInstancePlacement_t(SimpleNamespace):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return "gpu"

    def nvmlDeviceGetUUID(self, handle):
        return "GPU-a" if handle == "gpu" else self.instances[int(handle[3:])][2]

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetMigMode(self, handle):
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        ids = sorted(self.instances)
        if index >= len(ids):
            raise LookupError("not found")
        return f"mig{ids[index]}"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=self.PROFILES[self.instances[int(handle[3:])][0]][2] * 1024**2)

    def nvmlDeviceGetGpuInstanceId(self, device):
        return int(device[3:])

    def nvmlDeviceGetComputeInstanceId(self, device):
        return 0

    def nvmlDeviceGetGpuInstanceById(self, handle, gi):
        return f"gi{gi}"

    def nvmlGpuInstanceGetInfo(self, gi):
        code, start, _ = self.instances[int(gi[2:])]
        return SimpleNamespace(profileId=code, placement=SimpleNamespace(start=start))

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle, code):
        if code not in self.PROFILES:
            raise LookupError("not offered")
        name, slices, mib = self.PROFILES[code]
        return SimpleNamespace(id=code, name=name.encode(), sliceCount=slices, memorySizeMB=mib)

    def nvmlGpuInstanceGetComputeInstanceById(self, gi, ci):
        return f"ci{gi[2:]}"

    def nvmlComputeInstanceDestroy(self, ci):
        self.calls.append(("destroy compute instance", ci))

    def nvmlGpuInstanceDestroy(self, gi):
        self.calls.append(("destroy GPU instance", gi))
        del self.instances[int(gi[2:])]

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle, profile_id, placement):
        self.calls.append(("create GPU instance", profile_id, placement.start, placement.size))
        gi = max(self.instances, default=0) + 1
        self.instances[gi] = (profile_id, placement.start, f"MIG-new-{gi}")
        return f"gi{gi}"

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, profile, engine):
        return SimpleNamespace(id=profile)

    def nvmlGpuInstanceCreateComputeInstance(self, gi, profile_id):
        self.calls.append(("create compute instance", gi, profile_id))

    def nvmlInit(self):
        pass


def test_nvml_creates_a_gpu_instance_at_the_start_and_a_compute_instance_spanning_it():
    nvml = FakeMigNvml()
    backend = NvmlBackend(nvml)
    assert backend.mig_board("GPU-a") == "A100-80GB"
    device = backend.mig_create("GPU-a", "3g.40gb", 0)
    assert device == {"uuid": "MIG-new-2", "profile": "3g.40gb", "start": 0, "memory_mib": 40960}
    backend.mig_destroy("GPU-a", 4)
    assert nvml.calls == [("create GPU instance", 5, 0, 4), ("create compute instance", "gi2", 2),
                          ("destroy compute instance", "ci1"), ("destroy GPU instance", "gi1")]
    assert [(d["profile"], d["start"]) for d in backend.mig_devices("gpu")] == [("3g.40gb", 0)]
