"""SIMULATED NVML: a stand-in for machines without NVIDIA GPUs (demo, tests, CI).

`--simulate 8xH100` reports eight H100s with plausible, slowly wandering utilization,
memory, temperature and power. `--simulate 2xA100-80GB:mig=all-1g.10gb` reports MIG mode on
and the GPUs carved as that layout says (`all-<profile>`, `all-balanced`, or an explicit
`3g.40gb+2g.20gb+1g.10gb+1g.10gb`), with stable fake MIG device UUIDs (agent.mig). It is
named as a simulation everywhere it shows (the backend name is "simulated", and registration
says so), so nobody mistakes it for a host.
"""
from __future__ import annotations

import random
import re
import uuid
import zlib
from dataclasses import dataclass

from agent import mig
from agent.gpus import GpuInfo, GpuProcess, GpuSample


@dataclass(frozen=True)
class Model:
    name: str
    memory_mib: int
    mig_capable: bool
    max_power_w: float
    mig_board: str = ""  # its key in agent.mig.GEOMETRY, for the boards a simulated host can carve


# Names and memory sizes as NVML reports them for these boards.
MODELS = {
    "H100": Model("NVIDIA H100 80GB HBM3", 81559, True, 700.0, "H100-80GB"),
    "H100-80GB": Model("NVIDIA H100 80GB HBM3", 81559, True, 700.0, "H100-80GB"),
    "H200": Model("NVIDIA H200", 143771, True, 700.0),
    "A100": Model("NVIDIA A100-SXM4-80GB", 81920, True, 400.0, "A100-80GB"),
    "A100-80GB": Model("NVIDIA A100-SXM4-80GB", 81920, True, 400.0, "A100-80GB"),
    "A100-40GB": Model("NVIDIA A100-SXM4-40GB", 40960, True, 400.0, "A100-40GB"),
    "L40S": Model("NVIDIA L40S", 46068, False, 350.0),
    "L4": Model("NVIDIA L4", 23034, False, 72.0),
    "T4": Model("Tesla T4", 15360, False, 70.0),
}

# Idle and top SM clocks (MHz) of these boards, as NVML reports them; the simulation runs between the two
# with the load. All of them are data-centre boards with ECC on.
SM_CLOCKS = {
    "NVIDIA H100 80GB HBM3": (345, 1980), "NVIDIA H200": (345, 1980), "NVIDIA A100-SXM4-80GB": (210, 1410),
    "NVIDIA A100-SXM4-40GB": (210, 1410), "NVIDIA L40S": (210, 2520), "NVIDIA L4": (210, 2040),
    "Tesla T4": (300, 1590),
}
# Chance per GPU and second of a corrected (single-bit) ECC error; uncorrected ones are left at 0, as on a
# healthy fleet.
ECC_CORRECTED_RATE = 0.0005

SPEC = re.compile(r"^(?P<count>[1-9][0-9]?)x(?P<model>[A-Za-z0-9-]+)(:mig=(?P<mig>[A-Za-z0-9.+-]+))?$")


class SpecError(ValueError):
    pass


def parse_layouts(spec: str) -> list[tuple[Model, str]]:
    """'8xH100', '4xL40S,2xT4' or '2xA100-80GB:mig=all-1g.10gb' → (model, MIG layout or "") per GPU,
    in index order."""
    gpus: list[tuple[Model, str]] = []
    for part in spec.split(","):
        match = SPEC.match(part.strip())
        if not match or match["model"].upper() not in {k.upper() for k in MODELS}:
            known = ", ".join(MODELS)
            raise SpecError(f"bad simulate spec {part!r}: use COUNTxMODEL[:mig=LAYOUT], e.g. 8xH100 or "
                            f"2xA100-80GB:mig=all-1g.10gb (models: {known})")
        model = next(m for k, m in MODELS.items() if k.upper() == match["model"].upper())
        layout = match["mig"] or ""
        if layout:
            if not model.mig_board:
                boards = ", ".join(k for k, m in MODELS.items() if m.mig_board)
                raise SpecError(f"bad simulate spec {part!r}: a simulated {match['model']} cannot be carved into "
                                f"MIG instances (simulated MIG boards: {boards})")
            try:
                mig.place(model.mig_board, mig.named_layout(model.mig_board, layout))
            except mig.LayoutError as error:
                raise SpecError(f"bad simulate spec {part!r}: {error}") from None
        gpus.extend([(model, layout)] * int(match["count"]))
    return gpus


def parse_spec(spec: str) -> list[Model]:
    """'8xH100' or '4xL40S,2xT4' → the models, in index order."""
    return [model for model, _ in parse_layouts(spec)]


class SimulatedBackend:
    name = "simulated"

    def __init__(self, spec: str, host: str, seed: int | None = None, uuids: list[str] | None = None) -> None:
        layouts = parse_layouts(spec)
        self.models = [model for model, _ in layouts]
        self.layouts = [layout for _, layout in layouts]
        self.host = host
        self.rng = random.Random(seed if seed is not None else host)
        # Stable per host and index, so a restarted agent reports the same GPUs (the demo passes its own).
        self.uuids = uuids or [f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{host}.simulated/{i}')}"
                               for i in range(len(self.models))]
        self.util = [self.rng.uniform(0, 60) for _ in self.models]
        # A quarter of the cards sit idle (nothing running), so "allocated but idle" has something to show.
        self.idle = [self.rng.random() < 0.25 for _ in self.models]
        self.ecc_corrected = [0 for _ in self.models]

    def inventory(self) -> list[GpuInfo]:
        return [GpuInfo(uuid=self.uuids[i], index=i, name=m.name, memory_mib=m.memory_mib,
                        mig_mode=bool(self.layouts[i]), mig_capable=m.mig_capable,
                        driver_version="550.90.07 (simulated)", cuda_version="12.4",
                        mig_devices=tuple(mig.simulated_devices(m.mig_board, self.uuids[i], self.layouts[i])
                                          if self.layouts[i] else ()))
                for i, m in enumerate(self.models)]

    def sample(self) -> list[GpuSample]:
        samples = []
        held = self._leases_by_gpu()
        for i, model in enumerate(self.models):
            self.util[i] = min(100.0, max(0.0, self.util[i] + self.rng.gauss(0, 8)))
            if self.rng.random() < 0.002:  # now and then a job starts or ends
                self.idle[i] = not self.idle[i]
            util = 0.0 if self.idle[i] else self.util[i]
            used = round(model.memory_mib * min(0.95, util / 100 + 0.02))
            processes = [] if self.idle[i] else [GpuProcess(pid=10000 + 97 * i, used_memory_mib=used)]
            leased = held.get(self.uuids[i])
            if leased is not None:
                processes = [] if self.idle[i] else self.lease_processes(i, model, leased, util)
                used = min(model.memory_mib, sum(p.used_memory_mib for p in processes) + 512)
            samples.append(GpuSample(
                uuid=self.uuids[i],
                utilization_gpu_pct=round(util),
                utilization_memory_pct=round(util * 0.6),
                memory_used_mib=used,
                memory_total_mib=model.memory_mib,
                temperature_c=round(32 + util * 0.45),
                power_w=round(model.max_power_w * (0.12 + 0.8 * util / 100), 1),
                processes=processes,
                **self._clock_and_ecc(i, model, util),
            ))
        return samples

    def _clock_and_ecc(self, i: int, model: Model, util: float) -> dict:
        low, high = SM_CLOCKS.get(model.name, (210, 1410))
        if self.rng.random() < ECC_CORRECTED_RATE:
            self.ecc_corrected[i] += 1
        return {"sm_clock_mhz": round(low + (high - low) * min(1.0, util / 30)) if util else low,
                "ecc_corrected": self.ecc_corrected[i], "ecc_uncorrected": 0}

    # The leases this host holds now (the agent sets it to its LeaseStore's read): a leased GPU runs one
    # process per lease, owned by the lease's user, so the portal has shares to attribute.
    lease_source = None

    def _leases_by_gpu(self) -> dict[str, list[dict]]:
        held: dict[str, list[dict]] = {}
        if self.lease_source is None:
            return held
        try:
            leases = self.lease_source()
        except Exception:  # noqa: BLE001 - an unreadable lease file must not stop sampling
            return held
        for lease in leases:
            if isinstance(lease, dict) and lease.get("gpu_uuid"):
                held.setdefault(lease["gpu_uuid"], []).append(lease)
        return held

    def lease_processes(self, i: int, model: Model, leases: list[dict], util: float) -> list[GpuProcess]:
        """One process per lease on GPU `i`, using a wandering part of what the lease may use: a MIG
        instance's or an MPS/vGPU cap's memory, k/N of the card for k time-slicing shares of N, the whole
        card (split between the leases) otherwise. The mode fields are read defensively: an older portal
        sends leases without them."""
        processes = []
        for lease in leases:
            mode = lease.get("mode") or "exclusive"
            cap = lease.get("memory_mib")
            if not isinstance(cap, int) or cap <= 0:
                shares, replicas = lease.get("shares"), lease.get("replicas")
                if mode in ("time_slicing", "mps") and isinstance(shares, int) and isinstance(replicas, int) \
                        and replicas > 0:
                    cap = model.memory_mib * shares // replicas
                else:
                    cap = model.memory_mib // len(leases)
            mig_uuid = lease.get("mig_uuid") or ""
            key = f"{lease.get('reservation')}:{mig_uuid or lease['gpu_uuid']}"
            pid = 20000 + zlib.crc32(key.encode()) % 40000  # stable per lease
            processes.append(GpuProcess(
                pid=pid, used_memory_mib=round(cap * min(0.9, 0.15 + util / 120)), user=str(lease.get("user") or ""),
                mig_uuid=mig_uuid if mode == "mig" and mig_uuid.startswith("MIG-") else ""))
        return processes

    def close(self) -> None:
        pass
