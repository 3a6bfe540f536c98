"""The real backend: NVML through nvidia-ml-py. Reads only; never changes a GPU setting (but see below).

Not its MIG mode or layout either: on a GPU in MIG mode it lists the instances that exist
(:meth:`NvmlBackend.mig_devices`) and calls no NVML setter, except that an agent started with
--allow-mig-reconfigure creates and destroys MIG instances (mig_create, mig_destroy) for the
leases of a dynamic MIG pool. It never changes a GPU's MIG mode.
"""
from __future__ import annotations

import logging
import math
from typing import Any

from agent import mig as mig_table
from agent.gpus import GpuInfo, GpuProcess, GpuSample, process_owner

MIB = 1024 * 1024

log = logging.getLogger("agent.nvml")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    name = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml as nvml  # nvidia-ml-py
        self.nvml = nvml
        self.nvml.nvmlInit()
        count = self.nvml.nvmlDeviceGetCount()
        self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def _optional(self, call, *args, default=None):
        """NVML answers NotSupported for some queries on some GPUs (MIG on consumer cards, power on some)."""
        if call is None:  # a function this nvidia-ml-py lacks
            return default
        try:
            return call(*args)
        except self.nvml.NVMLError:
            return default

    def inventory(self) -> list[GpuInfo]:
        nv = self.nvml
        driver = _text(nv.nvmlSystemGetDriverVersion())
        cuda = self._optional(nv.nvmlSystemGetCudaDriverVersion, default=0) or 0
        cuda_version = f"{cuda // 1000}.{(cuda % 1000) // 10}" if cuda else ""
        gpus = []
        for index, handle in enumerate(self.handles):
            mig = self._optional(nv.nvmlDeviceGetMigMode, handle)
            mig_mode = bool(mig and mig[0])
            gpus.append(GpuInfo(
                uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                index=index,
                name=_text(nv.nvmlDeviceGetName(handle)),
                memory_mib=int(nv.nvmlDeviceGetMemoryInfo(handle).total // MIB),
                mig_capable=mig is not None,
                mig_mode=mig_mode,
                driver_version=driver,
                cuda_version=cuda_version,
                mig_devices=tuple(self.mig_devices(handle)) if mig_mode else (),
            ))
        return gpus

    def mig_devices(self, handle: Any) -> list[dict]:
        """The MIG instances of a GPU in MIG mode, by start slice: uuid, profile, start, memory_mib.

        Read-only queries: the MIG device handles (nvmlDeviceGetMigDeviceHandleByIndex up to
        nvmlDeviceGetMaxMigDeviceCount; an empty index answers NotFound), each one's UUID and
        memory, and its GPU instance's profile and placement (nvmlDeviceGetGpuInstanceById +
        nvmlGpuInstanceGetInfo, which NVML may answer only to root). An instance whose placement
        cannot be read is left out, with a warning: the portal names MIG grants by start slice.
        """
        nv = self.nvml
        names = self._profile_names(handle)
        devices = []
        for i in range(self._optional(getattr(nv, "nvmlDeviceGetMaxMigDeviceCount", None), handle, default=0) or 0):
            device = self._optional(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
            if device is None:
                continue  # no instance at this index
            uuid = _text(nv.nvmlDeviceGetUUID(device))
            memory_mib = int(nv.nvmlDeviceGetMemoryInfo(device).total // MIB)
            try:
                info = nv.nvmlGpuInstanceGetInfo(
                    nv.nvmlDeviceGetGpuInstanceById(handle, nv.nvmlDeviceGetGpuInstanceId(device)))
            except nv.NVMLError as error:
                log.warning("MIG device %s: cannot read its GPU instance (%s); not reported (run the agent as root)",
                            uuid, error)
                continue
            profile = names.get(int(info.profileId))
            if profile is None:  # a profile the list did not have: ask for it by id
                by_id = self._optional(getattr(nv, "nvmlDeviceGetGpuInstanceProfileInfoById", None), handle,
                                       int(info.profileId))
                profile = _profile_name(by_id) if by_id is not None else None
            if not profile:
                log.warning("MIG device %s: unknown GPU instance profile %s; not reported", uuid, info.profileId)
                continue
            devices.append({"uuid": uuid, "profile": profile, "start": int(info.placement.start),
                            "memory_mib": memory_mib})
        return sorted(devices, key=lambda d: d["start"])

    # --- changing MIG: only for an agent started with --allow-mig-reconfigure (agent.__main__) ---------

    def _handle(self, gpu_uuid: str) -> Any:
        nv = self.nvml
        for i in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            if _text(nv.nvmlDeviceGetUUID(handle)) == gpu_uuid:
                return handle
        raise LookupError(f"no GPU {gpu_uuid} on this host")

    def mig_board(self, gpu_uuid: str) -> str:
        """The MIG geometry (agent.mig.GEOMETRY key) of a GPU in MIG mode, "" for one that is not or a board
        the agent does not know how to carve."""
        handle = self._handle(gpu_uuid)
        mode = self._optional(self.nvml.nvmlDeviceGetMigMode, handle)
        return mig_table.board_of(_text(self.nvml.nvmlDeviceGetName(handle))) if mode and mode[0] else ""

    def mig_destroy(self, gpu_uuid: str, start: int) -> None:
        """Destroy the MIG instance at memory slice `start`: its compute instance, then its GPU instance."""
        nv = self.nvml
        handle = self._handle(gpu_uuid)
        for i in range(self._optional(getattr(nv, "nvmlDeviceGetMaxMigDeviceCount", None), handle, default=0) or 0):
            device = self._optional(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
            if device is None:
                continue
            gi = nv.nvmlDeviceGetGpuInstanceById(handle, nv.nvmlDeviceGetGpuInstanceId(device))
            if int(nv.nvmlGpuInstanceGetInfo(gi).placement.start) != start:
                continue
            nv.nvmlComputeInstanceDestroy(
                nv.nvmlGpuInstanceGetComputeInstanceById(gi, nv.nvmlDeviceGetComputeInstanceId(device)))
            nv.nvmlGpuInstanceDestroy(gi)
            return

    def mig_create(self, gpu_uuid: str, profile: str, start: int) -> dict:
        """Create a GPU instance of `profile` at memory slice `start` (nvmlDeviceCreateGpuInstanceWithPlacement)
        and one compute instance spanning it; return the new MIG device as mig_devices reports it."""
        nv = self.nvml
        handle = self._handle(gpu_uuid)
        info = None
        for code in range(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0)):
            candidate = self._optional(nv.nvmlDeviceGetGpuInstanceProfileInfo, handle, code)
            if candidate is not None and _profile_name(candidate) == profile:
                info = candidate
                break
        board = mig_table.board_of(_text(nv.nvmlDeviceGetName(handle)))
        geometry = mig_table.GEOMETRY.get(board, {}).get(profile)
        if info is None or geometry is None:
            raise LookupError(f"GPU {gpu_uuid} offers no MIG profile {profile}")
        placement = nv.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, geometry.size
        gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, placement)
        compute = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, getattr(nv, f"NVML_COMPUTE_INSTANCE_PROFILE_{int(info.sliceCount)}_SLICE"),
            nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        nv.nvmlGpuInstanceCreateComputeInstance(gi, compute.id)
        for device in self.mig_devices(handle):
            if device["start"] == start:
                return device
        raise LookupError(f"the new {profile} instance at slice {start} of GPU {gpu_uuid} is not listed")

    def _profile_names(self, handle: Any) -> dict[int, str]:
        """NVML's GPU-instance profile id -> its name ("1g.10gb", "1g.10gb+me"), for the profiles this GPU offers."""
        nv = self.nvml
        names = {}
        for code in range(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0)):
            info = self._optional(getattr(nv, "nvmlDeviceGetGpuInstanceProfileInfo", None), handle, code)
            if info is None:
                continue  # not offered on this model
            names[int(info.id)] = _profile_name(info)
        return names


    def sample(self) -> list[GpuSample]:
        nv = self.nvml
        samples = []
        for handle in self.handles:
            util = self._optional(nv.nvmlDeviceGetUtilizationRates, handle)
            memory = nv.nvmlDeviceGetMemoryInfo(handle)
            power_mw = self._optional(nv.nvmlDeviceGetPowerUsage, handle, default=0)
            processes = self.processes(handle)
            samples.append(GpuSample(
                uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                utilization_gpu_pct=int(util.gpu) if util else 0,
                utilization_memory_pct=int(util.memory) if util else 0,
                memory_used_mib=int(memory.used // MIB),
                memory_total_mib=int(memory.total // MIB),
                temperature_c=int(self._optional(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU,
                                                 default=0)),
                power_w=round(power_mw / 1000, 1),
                processes=processes,
                sm_clock_mhz=self._optional(getattr(nv, "nvmlDeviceGetClockInfo", None), handle,
                                            getattr(nv, "NVML_CLOCK_SM", 1)),
                ecc_corrected=self._ecc(handle, "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                ecc_uncorrected=self._ecc(handle, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
            ))
        return samples

    def _ecc(self, handle: Any, error_type: str) -> int | None:
        """The volatile ECC error count of one type, or None where the GPU has no ECC (consumer boards) or it
        is off: NVML answers NotSupported there. XID errors come only as NVML events (a listener thread with
        nvmlEventSetWait); the agent does not read them yet."""
        nv = self.nvml
        count = self._optional(getattr(nv, "nvmlDeviceGetTotalEccErrors", None), handle, getattr(nv, error_type, None),
                               getattr(nv, "NVML_VOLATILE_ECC", 0))
        return int(count) if count is not None else None

    # Local account -> portal user (the reverse of --user-map), so a process is named as its booker.
    portal_users: dict[str, str] = {}
    proc_dir = "/proc"

    def processes(self, handle: Any) -> list[GpuProcess]:
        """The compute processes on a GPU with their owner and memory. On a GPU in MIG mode NVML lists
        them per MIG device handle, so each is read there and tagged with its instance's UUID and GPU
        instance id; the parent's own list (all of them, untagged) is the fallback when no instance
        answers (NVML may refuse the per-instance query to a non-root agent)."""
        nv = self.nvml
        found: list[tuple[Any, str, int | None]] = []
        answered = False
        mig = self._optional(nv.nvmlDeviceGetMigMode, handle)
        count = getattr(nv, "nvmlDeviceGetMaxMigDeviceCount", None)
        if mig and mig[0] and count is not None:
            for i in range(self._optional(count, handle, default=0) or 0):
                device = self._optional(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
                if device is None:
                    continue  # no instance at this index
                listed = self._optional(nv.nvmlDeviceGetComputeRunningProcesses, device)
                if listed is None:
                    continue
                answered = True
                instance_id = getattr(nv, "nvmlDeviceGetGpuInstanceId", None)
                gi = self._optional(instance_id, device) if instance_id is not None else None
                mig_uuid = _text(nv.nvmlDeviceGetUUID(device))
                found.extend((p, mig_uuid, None if gi is None else int(gi)) for p in listed)
        if not answered:
            found = [(p, "", None) for p in
                     self._optional(nv.nvmlDeviceGetComputeRunningProcesses, handle, default=[]) or []]
        return [GpuProcess(pid=int(p.pid), used_memory_mib=int((p.usedGpuMemory or 0) // MIB),
                           user=process_owner(int(p.pid), self.proc_dir, self.portal_users),
                           mig_uuid=mig_uuid, gpu_instance_id=gi)
                for p, mig_uuid, gi in found]

    def close(self) -> None:
        self.nvml.nvmlShutdown()


def _profile_name(info: Any) -> str:
    """A GPU-instance profile's name without NVML's "MIG " prefix; from an old driver's nameless answer,
    <compute slices>g.<memory in GiB, rounded up>gb, which is how NVIDIA names them."""
    name = _text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
    return name or f"{int(info.sliceCount)}g.{math.ceil(int(info.memorySizeMB) / 1024)}gb"
