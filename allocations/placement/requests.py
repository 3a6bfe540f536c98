"""What a caller asks for: :class:`PlacementRequest` (portal-facing) and :class:`Demand` (numeric).

A request is exactly one of

* **whole GPUs** – ``gpus = n`` (n >= 1) whole GPUs, all on one node;
* **a fraction** – ``milli`` in 1..999 of one GPU, optionally with ``gpu_memory_mib`` of its memory;
* **a MIG slice** – ``mig_profile`` such as ``"3g.40gb"`` on a MIG-capable GPU;
* **CPU only** – none of the above (the Alibaba trace has such tasks; they still use a node's CPU).

plus CPU millicores and memory MiB taken on the same node, and constraints: allowed GPU
models (empty = any, like the trace's ``gpu_spec``), a minimum GPU memory, and node labels
that must all match. ``start``/``end`` give the window ``[start, end)``; floats are seconds,
datetimes are converted with ``.timestamp()``.

:class:`Demand` is the same request reduced to numbers the vectorised engine works with;
the benchmark builds Demands straight from trace rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from allocations.units import MILLI_PER_GPU

Time = float | int | datetime



def to_seconds(t: Time) -> float:
    """Seconds since the epoch for a datetime, or the number itself (already seconds)."""
    if isinstance(t, datetime):
        return t.timestamp()
    return float(t)


class Kind(StrEnum):
    CPU_ONLY = "cpu_only"
    WHOLE = "whole"
    FRACTION = "fraction"
    MIG = "mig"


class InvalidRequest(ValueError):
    """The request itself is malformed (as opposed to unplaceable)."""


@dataclass(frozen=True)
class PlacementRequest:
    gpus: int = 0
    milli: int | None = None
    mig_profile: str | None = None
    gpu_memory_mib: int = 0  # per GPU: memory the job needs on each GPU it gets
    cpu_milli: int = 0
    memory_mib: int = 0
    allowed_models: frozenset[str] = frozenset()
    min_gpu_memory_mib: int = 0
    node_labels: Mapping[str, str] = field(default_factory=dict)
    start: Time = 0.0
    end: Time = math.inf
    team: str | None = None
    priority: int = 0
    #: GPUs (in GPU-equivalents: milli/1000, MIG compute share) the team may still take; None = no quota.
    quota_gpus_remaining: float | None = None

    def __post_init__(self) -> None:
        kinds = sum([self.gpus > 0, self.milli is not None, self.mig_profile is not None])
        if kinds > 1:
            raise InvalidRequest("ask for whole GPUs, a fraction of a GPU or a MIG profile, not several")
        if self.gpus < 0:
            raise InvalidRequest("gpus must be >= 0")
        if self.milli is not None and not 1 <= self.milli <= 999:
            raise InvalidRequest("milli must be between 1 and 999 (use gpus=1 for a whole GPU)")
        if min(self.cpu_milli, self.memory_mib, self.gpu_memory_mib, self.min_gpu_memory_mib) < 0:
            raise InvalidRequest("resource amounts must be >= 0")
        if to_seconds(self.end) <= to_seconds(self.start):
            raise InvalidRequest("the window must end after it starts")
        # Normalise a set given as list/tuple/str so the dataclass stays hashable and safe.
        if isinstance(self.allowed_models, str):
            object.__setattr__(self, "allowed_models", frozenset(m for m in self.allowed_models.split("|") if m))
        elif not isinstance(self.allowed_models, frozenset):
            object.__setattr__(self, "allowed_models", frozenset(self.allowed_models))

    @property
    def kind(self) -> Kind:
        if self.gpus > 0:
            return Kind.WHOLE
        if self.milli is not None:
            return Kind.FRACTION
        if self.mig_profile is not None:
            return Kind.MIG
        return Kind.CPU_ONLY

    @property
    def window(self) -> tuple[float, float]:
        return to_seconds(self.start), to_seconds(self.end)


@dataclass(frozen=True)
class Demand:
    """A request as numbers. ``milli`` is per GPU (1000 for whole GPUs, 0 for CPU-only).

    ``allowed_models`` empty means any model. ``mig_profile`` is set only for MIG demands,
    whose ``milli`` is the profile's compute share (for scoring and accounting).
    """

    cpu_milli: int
    memory_mib: int
    num_gpu: int
    milli: int
    gpu_memory_mib: int = 0
    mig_profile: str | None = None
    allowed_models: frozenset[str] = frozenset()
    min_gpu_memory_mib: int = 0

    @property
    def kind(self) -> Kind:
        if self.mig_profile is not None:
            return Kind.MIG
        if self.num_gpu == 0:
            return Kind.CPU_ONLY
        if self.milli < MILLI_PER_GPU:
            return Kind.FRACTION
        return Kind.WHOLE

    @property
    def total_milli(self) -> int:
        return self.milli * self.num_gpu

    @classmethod
    def from_request(cls, req: PlacementRequest, mig_milli: int = 0) -> Demand:
        kind = req.kind
        if kind is Kind.WHOLE:
            num, milli = req.gpus, MILLI_PER_GPU
        elif kind is Kind.FRACTION:
            num, milli = 1, int(req.milli or 0)
        elif kind is Kind.MIG:
            num, milli = 1, mig_milli
        else:
            num, milli = 0, 0
        return cls(
            cpu_milli=req.cpu_milli,
            memory_mib=req.memory_mib,
            num_gpu=num,
            milli=milli,
            gpu_memory_mib=req.gpu_memory_mib,
            mig_profile=req.mig_profile,
            allowed_models=req.allowed_models,
            min_gpu_memory_mib=req.min_gpu_memory_mib,
        )
