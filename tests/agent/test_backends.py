"""The agent's GPU backends: the simulated stand-in, and NVML read through a small fake of pynvml."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from agent.nvml import NvmlBackend
from agent.simulated import SimulatedBackend, SpecError, parse_spec


def test_a_spec_names_count_and_model():
    models = parse_spec("2xH100,1xl40s")
    assert [m.name for m in models] == ["NVIDIA H100 80GB HBM3"] * 2 + ["NVIDIA L40S"]


@pytest.mark.parametrize("spec", ["H100", "0xH100", "8xB999", "8x", "x8H100"])
def test_a_bad_spec_says_how_to_write_one(spec):
    with pytest.raises(SpecError, match="use COUNTxMODEL"):
        parse_spec(spec)


def test_simulated_gpus_keep_their_uuids_across_restarts():
    first = SimulatedBackend("8xH100", "host-a").inventory()
    again = SimulatedBackend("8xH100", "host-a").inventory()
    other = SimulatedBackend("8xH100", "host-b").inventory()
    assert [g.uuid for g in first] == [g.uuid for g in again]
    assert not {g.uuid for g in first} & {g.uuid for g in other}
    assert [g.index for g in first] == list(range(8))
    assert all("simulated" in g.driver_version for g in first)


def test_simulated_samples_stay_in_physical_ranges():
    backend = SimulatedBackend("4xL4", "host-a", seed=1)
    for _ in range(200):
        for s in backend.sample():
            assert 0 <= s.utilization_gpu_pct <= 100
            assert 0 <= s.memory_used_mib <= s.memory_total_mib == 23034
            assert 30 <= s.temperature_c <= 90
            assert 0 < s.power_w <= 72


class NotSupported(Exception):
    pass


def fake_nvml(mig_supported: bool):
    """Just the pynvml calls the backend makes, answering like a 2-GPU host."""
    handles = ["h0", "h1"]

    def mig_mode(handle):
        if not mig_supported:
            raise NotSupported()
        return (1, 1) if handle == "h0" else (0, 0)

    def power(handle):
        if handle == "h1":
            raise NotSupported()
        return 312_500

    return SimpleNamespace(
        NVMLError=NotSupported, NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: handles[i],
        nvmlSystemGetDriverVersion=lambda: b"550.54.15", nvmlSystemGetCudaDriverVersion=lambda: 12040,
        nvmlDeviceGetUUID=lambda h: f"GPU-0000000{h[-1]}-1111-2222-3333-444444444444",
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=81559 * 1024**2, used=1024 * 1024**2),
        nvmlDeviceGetMigMode=mig_mode,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=97, memory=40),
        nvmlDeviceGetTemperature=lambda h, sensor: 61,
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=4242, usedGpuMemory=512 * 1024**2)],
    )


def test_nvml_inventory_reads_identity_memory_mig_and_versions():
    gpus = NvmlBackend(fake_nvml(mig_supported=True)).inventory()
    assert [(g.index, g.memory_mib, g.mig_capable, g.mig_mode) for g in gpus] == [(0, 81559, True, True),
                                                                                  (1, 81559, True, False)]
    assert gpus[0].driver_version == "550.54.15" and gpus[0].cuda_version == "12.4"
    assert gpus[0].uuid.startswith("GPU-")


def test_nvml_treats_unsupported_queries_as_absent_not_fatal():
    backend = NvmlBackend(fake_nvml(mig_supported=False))
    assert [g.mig_capable for g in backend.inventory()] == [False, False]
    samples = backend.sample()
    assert (samples[0].power_w, samples[1].power_w) == (312.5, 0.0)
    assert samples[0].processes[0].pid == 4242 and samples[0].processes[0].used_memory_mib == 512
    assert samples[0].utilization_gpu_pct == 97 and samples[0].memory_used_mib == 1024


def test_nvml_reads_the_sm_clock_and_volatile_ecc_counts_where_the_gpu_has_them():
    nvml = fake_nvml(mig_supported=False)

    def ecc(handle, error_type, counter_type):
        assert counter_type == nvml.NVML_VOLATILE_ECC
        if handle == "h1":
            raise NotSupported()  # a consumer board: no ECC
        return {nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: 3, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: 0}[error_type]

    nvml.NVML_CLOCK_SM, nvml.NVML_VOLATILE_ECC = 1, 0
    nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    nvml.nvmlDeviceGetClockInfo = lambda handle, clock: 1980 if clock == 1 else 0
    nvml.nvmlDeviceGetTotalEccErrors = ecc
    first, second = NvmlBackend(nvml).sample()
    assert (first.sm_clock_mhz, first.ecc_corrected, first.ecc_uncorrected) == (1980, 3, 0)
    assert (second.ecc_corrected, second.ecc_uncorrected) == (None, None)
    assert "ecc_corrected" not in second.as_dict() and second.as_dict()["sm_clock_mhz"] == 1980


def test_an_nvml_without_clock_or_ecc_queries_reports_neither():
    (sample, _) = NvmlBackend(fake_nvml(mig_supported=False)).sample()
    assert (sample.sm_clock_mhz, sample.ecc_corrected, sample.ecc_uncorrected) == (None, None, None)


def test_the_simulation_reports_an_sm_clock_that_follows_the_load_and_ecc_counts():
    backend = SimulatedBackend("4xH100", host="sim-clock", seed=3)
    for _ in range(50):
        for s in backend.sample():
            assert 345 <= s.sm_clock_mhz <= 1980 and s.ecc_uncorrected == 0 and s.ecc_corrected >= 0
            assert {"sm_clock_mhz", "ecc_corrected", "ecc_uncorrected"} <= set(s.as_dict())
