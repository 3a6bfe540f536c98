"""`python -m agent.probe [--samples N]`: print, as JSON, what the agent would report on this host.

For an operator checking a host before giving it a token, and for us checking the NVML
backend against real hardware: the inventory the agent registers, a few samples one second
apart, and for each MIG-capable GPU the GPU-instance profiles NVML offers (slices, memory,
how many fit, the legal start slices). Everything here is a read: no GPU setting, MIG
layout or process is touched. Needs only nvidia-ml-py, like the agent.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from typing import Any

from agent.nvml import NvmlBackend, _text


def _placements(nv: Any, handle: Any, profile_id: int) -> list[dict] | str:
    """Legal (start, size) slices of a profile; NVML answers only while MIG mode is on."""
    try:
        count = ctypes.c_uint(0)
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
        array = (nv.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
        return [{"start": array[i].start, "size": array[i].size} for i in range(count.value)]
    except nv.NVMLError as error:
        return f"not available: {error}"


def mig_profiles(nv: Any, handle: Any) -> list[dict]:
    """The GPU-instance profiles NVML knows on this GPU (read-only queries)."""
    profiles = []
    for code in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, code)
        except nv.NVMLError:
            continue  # not offered on this model
        profiles.append({
            "name": _text(getattr(info, "name", b"")).removeprefix("MIG "),
            "profile_id": int(info.id),
            "slices": int(info.sliceCount),
            "memory_mib": int(info.memorySizeMB),
            "max_instances": int(info.instanceCount),
            "multiprocessors": int(info.multiprocessorCount),
            "copy_engines": int(info.copyEngineCount),
            "decoders": int(info.decoderCount),
            "placements": _placements(nv, handle, int(info.id)),
        })
    return profiles


def probe(samples: int = 3) -> dict:
    backend = NvmlBackend()
    nv = backend.nvml
    try:
        inventory = [gpu.as_dict() for gpu in backend.inventory()]
        for gpu, handle in zip(inventory, backend.handles):
            gpu["compute_mode"] = backend._optional(nv.nvmlDeviceGetComputeMode, handle)
            gpu["max_mig_devices"] = backend._optional(nv.nvmlDeviceGetMaxMigDeviceCount, handle)
            gpu["mig_profiles"] = mig_profiles(nv, handle) if gpu["mig_capable"] else []
        taken = []
        for i in range(samples):
            if i:
                time.sleep(1.0)
            taken.append({"t": time.time(), "gpus": [s.as_dict() for s in backend.sample()]})
        return {"backend": backend.name, "nvml_version": _text(nv.nvmlSystemGetNVMLVersion()),
                "gpus": inventory, "samples": taken}
    finally:
        backend.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=3, help="samples to take, one second apart")
    args = parser.parse_args(argv)
    try:
        report = probe(args.samples)
    except Exception as error:  # no driver, no GPU: say so plainly, exit non-zero
        print(f"NVML is not usable on this host: {error}", file=sys.stderr)
        return 1
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
