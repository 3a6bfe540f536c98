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
    """A compute process on a GPU. `user` owns it (its portal user where the host's user map names the
    local account; "" when unreadable); on a MIG instance `mig_uuid` is that instance's MIG device UUID
    and `gpu_instance_id` NVML's GPU instance id (DCGM's GPU_I_ID). The portal attributes each process to
    the reservation holding that GPU or instance (monitoring.shares)."""

    pid: int
    used_memory_mib: int
    user: str = ""
    mig_uuid: str = ""
    gpu_instance_id: int | None = None


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
    # None where the board or driver does not say: ECC exists on data-centre cards only, and a clock
    # query can be refused (a GPU that fell off the bus).
    sm_clock_mhz: int | None = None
    # Volatile ECC error counts (since the driver loaded), corrected (single-bit) and uncorrected (double-bit).
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None

    def as_dict(self) -> dict:
        data = asdict(self)
        # Left out when unknown: the portal reads an absent field as "not reported".
        for name in ("sm_clock_mhz", "ecc_corrected", "ecc_uncorrected"):
            if data[name] is None:
                del data[name]
        return data


class GpuBackend(Protocol):
    """Where GPU facts come from: real NVML, or the simulated stand-in."""

    name: str

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self) -> list[GpuSample]: ...

    def close(self) -> None: ...


def process_owner(pid: int, proc_dir: str = "/proc", names: dict[str, str] | None = None) -> str:
    """The account running `pid`: the real uid of /proc/<pid>/status, named through the password
    database (the bare uid when it has no name there), then through `names` ({local account: portal
    user}, the reverse of the agent's --user-map) so the portal can match it with whoever booked the
    GPU. "" when the process is gone or hidden (another PID namespace, hidepid)."""
    try:
        with open(f"{proc_dir}/{int(pid)}/status") as status:
            uid = next(int(line.split()[1]) for line in status if line.startswith("Uid:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return ""
    try:
        import pwd

        local = pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        local = str(uid)
    return (names or {}).get(local, local)
