"""The real backend: NVML through nvidia-ml-py. Reads only; never changes a GPU setting."""
from __future__ import annotations

from typing import Any

from agent.gpus import GpuInfo, GpuProcess, GpuSample, process_owner

MIB = 1024 * 1024


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
            gpus.append(GpuInfo(
                uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                index=index,
                name=_text(nv.nvmlDeviceGetName(handle)),
                memory_mib=int(nv.nvmlDeviceGetMemoryInfo(handle).total // MIB),
                mig_capable=mig is not None,
                mig_mode=bool(mig and mig[0]),
                driver_version=driver,
                cuda_version=cuda_version,
            ))
        return gpus

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
            ))
        return samples

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
