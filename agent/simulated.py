"""SIMULATED NVML: a stand-in for machines without NVIDIA GPUs (demo, tests, CI).

`--simulate 8xH100` reports eight H100s with plausible, slowly wandering utilization,
memory, temperature and power. `--simulate 2xA100-80GB:mig=all-1g.10gb` reports MIG mode on
and the GPUs carved as that layout says (`all-<profile>`, `all-balanced`, or an explicit
`3g.40gb+2g.20gb+1g.10gb+1g.10gb`, or `all-enabled`: MIG mode with no instances), with stable
fake MIG device UUIDs (agent.mig); an agent started with --allow-mig-reconfigure may create and
destroy instances here as on NVML (new ones get new UUIDs). It is
named as a simulation everywhere it shows (the backend name is "simulated", and registration
says so), so nobody mistakes it for a host.

The workloads follow the leases the agent holds, as on a fleet whose users book before they run:
a booked GPU (or share, or MIG instance) runs a job, a few bookings sit idle on purpose, and
rarely a process runs on a GPU nobody booked.
"""
from __future__ import annotations

import random
import re
import time
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


# A few bookings sit idle on purpose, so "booked but idle" has a true example to show.
IDLE_BOOKING_PCT = 4
# Now and then someone runs a job on a GPU nobody booked: per unbooked GPU and window, the chance of one.
STRAY_WINDOW_S = 600
STRAY_CHANCE = 0.02


def idle_on_purpose(lease: dict) -> bool:
    """Whether the simulation leaves this lease's booking idle: decided by the reservation alone, so every GPU
    of a booking agrees on every host, and the same booking is idle in every run."""
    return zlib.crc32(f"idle:{lease.get('reservation')}".encode()) % 100 < IDLE_BOOKING_PCT


@dataclass(frozen=True)
class Job:
    """The workload a booking runs on one GPU or instance: data loading while memory fills, a ramp to a steady
    utilization with noise, and short dips (checkpoints, evaluation)."""

    ramp_s: float
    steady_pct: float
    memory_fraction: float

    @classmethod
    def for_lease(cls, seed: object, key: str) -> Job:
        rng = random.Random(f"{seed}:{key}:job")
        return cls(ramp_s=rng.uniform(20, 90), steady_pct=rng.uniform(65, 97), memory_fraction=rng.uniform(0.45, 0.9))

    def load(self, seed: object, key: str, elapsed: float) -> tuple[float, float]:
        """(utilization %, fraction of its memory cap in use) `elapsed` seconds after it started; always above
        the idle threshold: a running job never reads as idle."""
        second = int(elapsed)
        noise = random.Random(f"{seed}:{key}:{second}").gauss(0, 3)
        if elapsed < self.ramp_s:
            util = 10 + (self.steady_pct - 10) * elapsed / self.ramp_s + noise
            memory = self.memory_fraction * min(1.0, 0.2 + 2.4 * elapsed / self.ramp_s)
        else:
            util = self.steady_pct + noise
            memory = self.memory_fraction * (1 + noise / 300)
            window = random.Random(f"{seed}:{key}:dip:{second // 60}")
            if window.random() < 0.35:  # about one dip every three minutes, 3-10 s long
                begins, lasts = window.uniform(0, 50), window.uniform(3, 10)
                if begins <= elapsed % 60 < begins + lasts:
                    util = window.uniform(5, 30)
        return min(100.0, max(3.0, util)), min(0.95, max(0.01, memory))


class SimulatedBackend:
    """Simulated GPUs whose workloads follow the leases the agent holds (`lease_source`): a leased GPU or
    instance runs its booking's job (Job), except the few bookings idle on purpose (idle_on_purpose); an
    unleased GPU is idle, except a rare stray process nobody booked. Everything is a function of the seed,
    the leases and the clock, so a test with its own clock sees the same fleet every run."""

    name = "simulated"

    def __init__(self, spec: str, host: str, seed: int | None = None, uuids: list[str] | None = None,
                 clock=time.monotonic) -> None:
        layouts = parse_layouts(spec)
        self.models = [model for model, _ in layouts]
        self.layouts = [layout for _, layout in layouts]
        self.host = host
        self.seed = seed if seed is not None else host
        self.clock = clock
        # Stable per host and index, so a restarted agent reports the same GPUs (the demo passes its own).
        self.uuids = uuids or [f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{host}.simulated/{i}')}"
                               for i in range(len(self.models))]
        self.started: dict[str, float] = {}  # lease key -> clock when its job started
        # Each GPU's MIG instances: the spec's layout, changed only by mig_create/mig_destroy (an agent
        # started with --allow-mig-reconfigure, for a dynamic MIG pool).
        self.mig = [list(mig.simulated_devices(m.mig_board, self.uuids[i], self.layouts[i])) if self.layouts[i] else []
                    for i, m in enumerate(self.models)]
        self.mig_changes: list[tuple[str, str, str, int]] = []  # ("create"|"destroy", GPU UUID, profile, start)
        self.ecc_corrected = [0 for _ in self.models]  # volatile corrected ECC errors so far

    def inventory(self) -> list[GpuInfo]:
        return [GpuInfo(uuid=self.uuids[i], index=i, name=m.name, memory_mib=m.memory_mib,
                        mig_mode=bool(self.layouts[i]), mig_capable=m.mig_capable,
                        driver_version="550.90.07 (simulated)", cuda_version="12.4",
                        mig_devices=tuple(dict(d) for d in self.mig[i]))
                for i, m in enumerate(self.models)]

    def mig_board(self, gpu_uuid: str) -> str:
        """The MIG geometry of a GPU in MIG mode ("" for one that is not)."""
        i = self.uuids.index(gpu_uuid)
        return self.models[i].mig_board if self.layouts[i] else ""

    def mig_destroy(self, gpu_uuid: str, start: int) -> None:
        """Destroy the instance at `start` (its compute instance, then its GPU instance), as NVML would."""
        i = self.uuids.index(gpu_uuid)
        gone = [d for d in self.mig[i] if d["start"] == start]
        self.mig[i] = [d for d in self.mig[i] if d["start"] != start]
        self.mig_changes.extend(("destroy", gpu_uuid, d["profile"], start) for d in gone)

    def mig_create(self, gpu_uuid: str, profile: str, start: int) -> dict:
        """Create a GPU instance of `profile` at `start` and its one compute instance: a new MIG device with a
        UUID of its own. Refuses what the driver would refuse (an illegal start, slices in use)."""
        i = self.uuids.index(gpu_uuid)
        board = self.mig_board(gpu_uuid)
        geometry = mig.GEOMETRY.get(board, {}).get(profile)
        if geometry is None or start not in geometry.starts:
            raise mig.LayoutError(f"{profile} cannot start at slice {start} on GPU {gpu_uuid}")
        for device in self.mig[i]:
            if mig.overlaps((geometry, start), (mig.GEOMETRY[board][device["profile"]], device["start"])):
                raise mig.LayoutError(f"slices of {profile} at {start} are in use on GPU {gpu_uuid}")
        self.mig_changes.append(("create", gpu_uuid, profile, start))
        device = {"uuid": mig.simulated_uuid(gpu_uuid, start, f"{profile}#{len(self.mig_changes)}"),
                  "profile": profile, "start": start, "memory_mib": geometry.memory_mib}
        self.mig[i] = sorted([*self.mig[i], device], key=lambda d: d["start"])
        return device

    def sample(self) -> list[GpuSample]:
        now = self.clock()
        held = self._leases_by_gpu()
        running = {self._key(lease) for leases in held.values() for lease in leases}
        self.started = {key: self.started.get(key, now) for key in running}  # a lease gone ends its job
        samples = []
        for i, model in enumerate(self.models):
            leases = held.get(self.uuids[i], [])
            if leases:
                processes, util = self.lease_processes(i, model, leases, now)
            else:
                processes, util = self._stray(i, model, now)
            used = sum(p.used_memory_mib for p in processes) + (512 if processes else 1)
            warmth = random.Random(f"{self.seed}:{self.uuids[i]}:{int(now)}").uniform(-1, 1)
            samples.append(GpuSample(
                uuid=self.uuids[i],
                utilization_gpu_pct=round(util),
                utilization_memory_pct=round(util * 0.6),
                memory_used_mib=min(model.memory_mib, used),
                memory_total_mib=model.memory_mib,
                temperature_c=round(32 + util * 0.45 + warmth),
                power_w=round(model.max_power_w * (0.12 + 0.8 * util / 100), 1),
                processes=processes,
                **self._clock_and_ecc(i, model, util),
            ))
        return samples

    def _clock_and_ecc(self, i: int, model: Model, util: float) -> dict:
        """The SM clock following the load, and now and then one more corrected ECC error (from the seed and
        the second, like everything else here)."""
        low, high = SM_CLOCKS.get(model.name, (210, 1410))
        if random.Random(f"{self.seed}:{self.uuids[i]}:ecc:{int(self.clock())}").random() < ECC_CORRECTED_RATE:
            self.ecc_corrected[i] += 1
        return {"sm_clock_mhz": round(low + (high - low) * min(1.0, util / 30)) if util else low,
                "ecc_corrected": self.ecc_corrected[i], "ecc_uncorrected": 0}

    # The leases this host holds now (the agent sets it to its LeaseStore's read).
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

    @staticmethod
    def _key(lease: dict) -> str:
        return f"{lease.get('reservation')}:{lease.get('mig_uuid') or lease['gpu_uuid']}"

    def lease_processes(self, i: int, model: Model, leases: list[dict], now: float) -> tuple[list[GpuProcess], float]:
        """One process per lease on GPU `i` (none for a booking idle on purpose), owned by the lease's user,
        using part of what the lease may use: a MIG instance's or an MPS/vGPU cap's memory, k/N of the card
        for k time-slicing shares of N, the whole card (split between the leases) otherwise; and the GPU's
        utilization, each job's weighted by its part of the card's compute (at least 2 %, so a small slice's
        running job never reads as an idle booking). The mode fields are read defensively: an
        older portal sends leases without them."""
        processes, util = [], 0.0
        for lease in leases:
            if idle_on_purpose(lease):
                continue
            mode = lease.get("mode") or "exclusive"
            cap = lease.get("memory_mib")
            if not isinstance(cap, int) or cap <= 0:
                shares, replicas = lease.get("shares"), lease.get("replicas")
                if mode in ("time_slicing", "mps") and isinstance(shares, int) and isinstance(replicas, int) \
                        and replicas > 0:
                    cap = model.memory_mib * shares // replicas
                else:
                    cap = model.memory_mib // len(leases)
            key = self._key(lease)
            job_util, memory = Job.for_lease(self.seed, key).load(self.seed, key, now - self.started.get(key, now))
            util += max(2.0, job_util * self._compute_part(lease, mode, cap, model, len(leases)))
            mig_uuid = lease.get("mig_uuid") or ""
            processes.append(GpuProcess(
                pid=20000 + zlib.crc32(key.encode()) % 40000,  # stable per lease
                used_memory_mib=max(300, round(cap * memory)), user=str(lease.get("user") or ""),
                mig_uuid=mig_uuid if mode == "mig" and mig_uuid.startswith("MIG-") else ""))
        return processes, min(100.0, util)

    @staticmethod
    def _compute_part(lease: dict, mode: str, cap: int, model: Model, count: int) -> float:
        """How much of the card's compute a lease's job can use: all of it when time-sliced (the shares take
        turns), its core cap under MPS or vGPU, its memory's part for a MIG instance (slices go together)."""
        if mode == "time_slicing":
            return 1.0
        if mode in ("mps", "vgpu"):
            cores = lease.get("cores_pct")
            if isinstance(cores, int) and cores > 0:
                return min(1.0, cores / 100)
            return min(1.0, cap / model.memory_mib)
        if mode == "mig":
            return min(1.0, cap / model.memory_mib)
        return 1.0 / count

    def _stray(self, i: int, model: Model, now: float) -> tuple[list[GpuProcess], float]:
        """A process nobody booked on unleased GPU `i`, in the rare windows the seed gives it one."""
        window = int(now // STRAY_WINDOW_S)
        rng = random.Random(f"{self.seed}:{self.uuids[i]}:stray:{window}")
        if rng.random() >= STRAY_CHANCE:
            return [], 0.0
        begins, lasts = rng.uniform(0, STRAY_WINDOW_S - 240), rng.uniform(60, 240)
        if not begins <= now % STRAY_WINDOW_S < begins + lasts:
            return [], 0.0
        key = f"stray:{self.uuids[i]}:{window}"
        util, memory = Job.for_lease(self.seed, key).load(self.seed, key, now % STRAY_WINDOW_S - begins)
        return [GpuProcess(pid=60000 + zlib.crc32(key.encode()) % 5000,
                           used_memory_mib=round(model.memory_mib * memory))], util

    def close(self) -> None:
        pass
