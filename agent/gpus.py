"""What a backend reports: each GPU's identity, and samples of what it is doing."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class GpuInfo:
    uuid: str
    index: int
    name: str
    memory_mib: int
    mig_mode: bool  # MIG currently enabled
    mig_capable: bool
    driver_version: str
    cuda_version: str
    # The MIG instances the GPU is carved into now (agent.mig): [{"uuid": "MIG-…", "profile": "1g.10gb",
    # "start": 0, "memory_mib": 9984}, ...], by start; empty with MIG off or on a board without MIG.
    mig_devices: tuple[dict, ...] = ()

    def as_dict(self) -> dict:
        data = asdict(self)
        data["mig_devices"] = [dict(d) for d in self.mig_devices]
        return data


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_mib: int


@dataclass(frozen=True)
class GpuSample:
    uuid: str
    utilization_gpu_pct: int
    utilization_memory_pct: int
    memory_used_mib: int
    memory_total_mib: int
    temperature_c: int
    power_w: float
    processes: list[GpuProcess] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class GpuBackend(Protocol):
    """Where GPU facts come from: real NVML, or the simulated stand-in."""

    name: str

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self) -> list[GpuSample]: ...

    def close(self) -> None: ...
