"""MIG on the host: simulated layouts, NVML discovery (through a fake pynvml), and the agent's table of
simulated boards agreeing with the portal's (allocations.placement.mig)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from agent import mig
from agent.nvml import NvmlBackend
from agent.simulated import SimulatedBackend, SpecError, parse_layouts
from allocations.placement import mig as portal_mig


def test_a_simulated_mig_host_reports_its_instances_with_stable_uuids():
    gpus = SimulatedBackend("2xA100-80GB:mig=all-1g.10gb", "host-a").inventory()
    assert [g.mig_mode for g in gpus] == [True, True]
    for gpu in gpus:
        assert [(d["profile"], d["start"], d["memory_mib"]) for d in gpu.mig_devices] == [
            ("1g.10gb", start, 10240) for start in range(7)]
        assert all(d["uuid"].startswith("MIG-") for d in gpu.mig_devices)
    again = SimulatedBackend("2xA100-80GB:mig=all-1g.10gb", "host-a").inventory()
    assert [g.mig_devices for g in gpus] == [g.mig_devices for g in again]  # same after a restart
    uuids = [d["uuid"] for g in gpus for d in g.mig_devices]
    assert len(set(uuids)) == 14  # distinct across GPUs and starts
    assert gpus[0].as_dict()["mig_devices"][0] == dict(gpus[0].mig_devices[0])


@pytest.mark.parametrize(("spec", "expected"), [
    ("1xA100-80GB:mig=all-balanced", [("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]),
    ("1xA100-80GB:mig=all-3g.40gb", [("3g.40gb", 0), ("3g.40gb", 4)]),
    ("1xH100:mig=3g.40gb+2g.20gb+1g.10gb+1g.10gb",
     [("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]),
    ("1xA100-40GB:mig=all-7g.40gb", [("7g.40gb", 0)]),
    ("1xH100:mig=1g.10gb+me+3g.40gb", [("3g.40gb", 0), ("1g.10gb+me", 4)]),
])
def test_layouts_are_placed_at_legal_starts(spec, expected):
    gpu = SimulatedBackend(spec, "h").inventory()[0]
    assert [(d["profile"], d["start"]) for d in gpu.mig_devices] == expected


def test_h100_instances_carry_the_memory_nvml_reports():
    gpu = SimulatedBackend("1xH100:mig=all-balanced", "h").inventory()[0]
    assert [d["memory_mib"] for d in gpu.mig_devices] == [20096, 9984, 9984, 40448]


@pytest.mark.parametrize("spec", ["1xL4:mig=all-1g.10gb", "1xA100-80GB:mig=all-9g.90gb",
                                  "1xA100-80GB:mig=4g.40gb+4g.40gb", "1xH100:mig=7g.80gb+1g.10gb",
                                  "1xH100:mig="])
def test_a_bad_mig_layout_says_why(spec):
    with pytest.raises(SpecError, match="bad simulate spec"):
        parse_layouts(spec)


def test_a_host_without_mig_layout_reports_no_instances():
    gpu = SimulatedBackend("1xA100-80GB", "h").inventory()[0]
    assert gpu.mig_capable and not gpu.mig_mode and gpu.mig_devices == ()


@pytest.mark.parametrize(("board", "model"), [("A100-40GB", "NVIDIA A100-SXM4-40GB"),
                                               ("A100-80GB", "NVIDIA A100-SXM4-80GB"),
                                               ("H100-80GB", "NVIDIA H100 80GB HBM3")])
def test_the_simulated_geometry_is_the_portals(board, model):
    portal = portal_mig.profiles_for(model)
    ours = mig.GEOMETRY[board]
    assert set(ours) == set(portal)
    for name, profile in ours.items():
        theirs = portal[name]
        assert (profile.compute, profile.size, profile.starts, profile.memory_mib) == (
            theirs.compute_slices, theirs.size, theirs.starts, theirs.memory_mib), name
    names = ["all-balanced", *(f"all-{p}" for p in ours)]
    for layout in names:
        expected = [(p.name, start) for p, start in
                    portal_mig.layout_instances(model, portal_mig.named_layout(model, layout))]
        assert [(p.name, start) for p, start in mig.place(board, mig.named_layout(board, layout))] == expected, layout


class NotFound(Exception):
    pass


def fake_mig_nvml(*, gi_readable: bool = True):
    """An H100 in MIG mode carved as 3g.40gb@4, 1g.10gb@0, 1g.20gb@2 (MIG device indexes 0, 1, 3; 2 empty; the
    1g.20gb profile's info comes without a name, as from an old driver).
    Just the read-only calls the backend makes."""
    profiles = {0: (0, "MIG 1g.10gb", 1, 9984), 7: (9, "MIG 3g.40gb", 3, 40448), 8: (14, "", 1, 20096)}
    instances = {0: ("MIG-11111111-aaaa", 21, 9, 4, 40448), 1: ("MIG-22222222-bbbb", 13, 0, 0, 9984),
                 3: ("MIG-33333333-cccc", 14, 14, 2, 20096)}  # index: uuid, GI id, profile id, start, MiB
    by_gi = {gi: (profile, start) for _, gi, profile, start, _ in instances.values()}

    def profile_info(handle, code):
        if code not in profiles:
            raise NotFound()
        pid, name, slices, mib = profiles[code]
        return SimpleNamespace(id=pid, name=name.encode(), sliceCount=slices, memorySizeMB=mib)

    def mig_handle(handle, index):
        if index not in instances:
            raise NotFound()
        return f"mig{index}"

    def gi_by_id(handle, gi):
        if not gi_readable:
            raise NotFound()
        return f"gi{gi}"

    def gi_info(gi):
        profile, start = by_gi[int(gi[2:])]
        return SimpleNamespace(profileId=profile, placement=SimpleNamespace(start=start, size=4 if profile == 9 else 1))

    def uuid(handle):
        return instances[int(handle[3:])][0] if handle.startswith("mig") else "GPU-00000000-1111-2222-3333-444444444444"

    def memory(handle):
        mib = instances[int(handle[3:])][4] if handle.startswith("mig") else 81559
        return SimpleNamespace(total=mib * 1024**2, used=0)

    forbidden = SimpleNamespace()  # any setter: fail loudly if the backend ever called one
    return SimpleNamespace(
        NVMLError=NotFound, NVML_TEMPERATURE_GPU=0, NVML_GPU_INSTANCE_PROFILE_COUNT=9,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: "h0",
        nvmlSystemGetDriverVersion=lambda: b"580.159.04", nvmlSystemGetCudaDriverVersion=lambda: 13000,
        nvmlDeviceGetUUID=uuid, nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=memory, nvmlDeviceGetMigMode=lambda h: (1, 1),
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7, nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
        nvmlDeviceGetGpuInstanceId=lambda h: instances[int(h[3:])][1],
        nvmlDeviceGetGpuInstanceById=gi_by_id, nvmlGpuInstanceGetInfo=gi_info,
        nvmlDeviceGetGpuInstanceProfileInfo=profile_info,
        nvmlDeviceSetMigMode=forbidden, nvmlDeviceCreateGpuInstance=forbidden,
    )


def test_nvml_discovery_lists_the_instances_by_start_with_profile_and_memory():
    gpu = NvmlBackend(fake_mig_nvml()).inventory()[0]
    assert gpu.mig_mode
    assert list(gpu.mig_devices) == [
        {"uuid": "MIG-22222222-bbbb", "profile": "1g.10gb", "start": 0, "memory_mib": 9984},
        {"uuid": "MIG-33333333-cccc", "profile": "1g.20gb", "start": 2, "memory_mib": 20096},  # nameless: derived
        {"uuid": "MIG-11111111-aaaa", "profile": "3g.40gb", "start": 4, "memory_mib": 40448},
    ]


def test_nvml_discovery_leaves_out_instances_whose_placement_it_cannot_read():
    gpu = NvmlBackend(fake_mig_nvml(gi_readable=False)).inventory()[0]
    assert gpu.mig_mode and gpu.mig_devices == ()
