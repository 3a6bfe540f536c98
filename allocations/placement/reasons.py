"""Why a request cannot be placed, in words a user understands, with machine-readable codes.

Codes (stable; the portal may switch on them):

==========================  =========================================================
``invalid_request``         the request itself is malformed (unknown MIG profile, ...)
``over_quota``              the team's remaining quota is smaller than the request
``no_matching_nodes``       no healthy, schedulable node carries the required labels
``no_gpu_model``            no GPU of the allowed models / minimum memory in the pool
``too_large``               more GPUs than any single node has
``insufficient_capacity``   not enough free in total for the window
``fragmented``              enough free in total, but not together on one node / GPU
``cpu_memory``              GPUs would fit, but those nodes lack CPU or memory
``no_mig_profile``          no MIG-capable GPU offers the profile
``mig_fragmented``          MIG slices are free, but no legal start slice is
==========================  =========================================================

:func:`diagnose` looks at the same arrays the engine used, in the order a person would
ask: is there such hardware at all, is enough of it free, is it free in one piece, and
does the node have the CPU and memory to go with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .arrays import ClusterArrays
from .feasibility import eligible_gpus, gpu_fit, mig_fit
from .mig import profiles_for
from .requests import Demand, Kind


@dataclass(frozen=True)
class Reason:
    code: str
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _gib(mib: int) -> str:
    return f"{mib / 1024:g} GiB"


def _models(demand: Demand) -> str:
    return ", ".join(sorted(demand.allowed_models)) if demand.allowed_models else "any model"


def quota_reason(requested: float, remaining: float) -> Reason:
    return Reason(
        "over_quota",
        f"The request needs {requested:g} GPUs of quota but the team has {max(remaining, 0):g} left.",
        {"requested_gpus": requested, "remaining_gpus": remaining},
    )


def diagnose(arrays: ClusterArrays, demand: Demand, label_mask: np.ndarray | None = None) -> list[Reason]:
    """Reasons ``demand`` fits nowhere in ``arrays`` (most fundamental first; never empty)."""
    nodes = arrays.node_ok.copy()
    if label_mask is not None:
        nodes &= label_mask
    if not nodes.any():
        what = "carries the required labels" if label_mask is not None else "is healthy and schedulable"
        return [Reason("no_matching_nodes", f"No healthy, schedulable node {what}.")]
    idx = np.flatnonzero(nodes)
    kind = demand.kind

    if kind is Kind.CPU_ONLY:
        return [_cpu_memory_reason(arrays, demand, idx, "node")]

    eligible = eligible_gpus(arrays, demand, idx)
    if kind is Kind.MIG:
        return _mig_reasons(arrays, demand, idx, eligible)
    if not eligible.any():
        need = f" with at least {_gib(demand.min_gpu_memory_mib)}" if demand.min_gpu_memory_mib else ""
        return [
            Reason(
                "no_gpu_model",
                f"No GPU of {_models(demand)}{need} is in the pool.",
                {"allowed_models": sorted(demand.allowed_models), "min_gpu_memory_mib": demand.min_gpu_memory_mib},
            )
        ]
    fit = gpu_fit(arrays, demand, idx)
    per_node = fit.sum(axis=1)
    if kind is Kind.WHOLE:
        n = demand.num_gpu
        largest = int(eligible.sum(axis=1).max())
        if n > largest:
            return [
                Reason(
                    "too_large",
                    f"{_plural(n, 'GPU')} requested on one node but the largest node has {largest} "
                    f"of {_models(demand)}.",
                    {"requested": n, "largest_node": largest},
                )
            ]
        total = int(per_node.sum())
        if total < n:
            return [
                Reason(
                    "insufficient_capacity",
                    f"{_plural(n, 'GPU')} requested but only {total} are free for the whole window.",
                    {"requested": n, "free": total},
                )
            ]
        most = int(per_node.max())
        if most < n:
            return [
                Reason(
                    "fragmented",
                    f"{total} GPUs are free in total but no node has {n} free (the most on one node is {most}).",
                    {"requested": n, "free": total, "most_on_one_node": most},
                )
            ]
        return [_cpu_memory_reason(arrays, demand, idx[per_node >= n], f"node with {_plural(n, 'free GPU')}")]

    # Fraction of one GPU.
    free = np.where(eligible, arrays.gpu_free[idx], 0)
    total = int(free.sum())
    if total < demand.milli:
        return [
            Reason(
                "insufficient_capacity",
                f"{demand.milli} milli-GPU requested but only {total} are free for the whole window.",
                {"requested_milli": demand.milli, "free_milli": total},
            )
        ]
    if not fit.any():
        room = eligible & (arrays.gpu_free[idx] >= demand.milli)
        if demand.gpu_memory_mib and room.any():
            most_mem = int(np.where(room, arrays.gpu_mem_free[idx], 0).max())
            return [
                Reason(
                    "fragmented",
                    f"GPUs with {demand.milli} milli free exist but none has {_gib(demand.gpu_memory_mib)} of memory "
                    f"free (the most is {_gib(most_mem)}).",
                    {"requested_memory_mib": demand.gpu_memory_mib, "most_memory_free_mib": most_mem},
                )
            ]
        most = int(free.max())
        return [
            Reason(
                "fragmented",
                f"{total} milli-GPU are free in total but no single GPU has {demand.milli} free "
                f"(the most on one GPU is {most}).",
                {"requested_milli": demand.milli, "free_milli": total, "most_on_one_gpu": most},
            )
        ]
    return [
        _cpu_memory_reason(arrays, demand, idx[per_node >= 1], f"node with a GPU that has {demand.milli} milli free")
    ]


def _cpu_memory_reason(arrays: ClusterArrays, demand: Demand, idx: np.ndarray, what: str) -> Reason:
    cpu = arrays.cpu_free[idx]
    mem = arrays.mem_free[idx]
    both = (cpu >= demand.cpu_milli) & (mem >= demand.memory_mib)
    if both.any():  # should not happen: the engine would have placed it
        return Reason("unplaceable", "The request could not be placed.", {})
    most_cpu = int(cpu.max()) if cpu.size else 0
    most_mem = int(mem.max()) if mem.size else 0
    return Reason(
        "cpu_memory",
        f"No {what} also has {demand.cpu_milli / 1000:g} CPU cores and {_gib(demand.memory_mib)} of memory free "
        f"(the most is {most_cpu / 1000:g} cores and {_gib(most_mem)}).",
        {
            "requested_cpu_milli": demand.cpu_milli,
            "requested_memory_mib": demand.memory_mib,
            "most_cpu_free_milli": most_cpu,
            "most_memory_free_mib": most_mem,
        },
    )


def _mig_reasons(arrays: ClusterArrays, demand: Demand, idx: np.ndarray, eligible: np.ndarray) -> list[Reason]:
    profile_name = demand.mig_profile or ""
    offers = np.zeros(eligible.shape, dtype=bool)
    size = 0
    starts: tuple[int, ...] = ()
    for mi, model in enumerate(arrays.models):
        profile = profiles_for(model).get(profile_name)
        if profile is not None:
            offers |= arrays.gpu_model[idx] == mi
            size, starts = profile.size, profile.starts
    offers &= eligible & arrays.mig_capable[idx]
    if not offers.any():
        return [
            Reason(
                "no_mig_profile",
                f"No MIG-capable GPU of {_models(demand)} in the pool offers the {profile_name} profile.",
                {"profile": profile_name},
            )
        ]
    used = arrays.mig_used[idx].astype(np.int64)
    free_slices = np.zeros(used.shape, dtype=np.int64)
    for bit in range(8):
        free_slices += 1 - ((used >> bit) & 1)
    free_slices = np.where(offers, free_slices, 0)
    fit = mig_fit(arrays, demand, idx) & offers
    if not fit.any():
        if int(free_slices.sum()) < size:
            return [
                Reason(
                    "insufficient_capacity",
                    f"{profile_name} needs {size} memory slices but only {int(free_slices.sum())} are free on "
                    f"MIG-capable GPUs (a GPU in use by whole or shared work cannot be carved).",
                    {"profile": profile_name, "free_slices": int(free_slices.sum())},
                )
            ]
        return [
            Reason(
                "mig_fragmented",
                f"{int(free_slices.sum())} MIG slices are free in total but no GPU has a free legal start for "
                f"{profile_name} ({size} slices starting at {' or '.join(map(str, starts))}).",
                {"profile": profile_name, "free_slices": int(free_slices.sum()), "legal_starts": list(starts)},
            )
        ]
    per_node = fit.any(axis=1)
    return [_cpu_memory_reason(arrays, demand, idx[per_node], f"node with room for {profile_name}")]


def describe_demand(demand: Demand) -> str:
    if demand.kind is Kind.WHOLE:
        return _plural(demand.num_gpu, "GPU")
    if demand.kind is Kind.FRACTION:
        return f"{demand.milli} milli-GPU"
    if demand.kind is Kind.MIG:
        return f"MIG {demand.mig_profile}"
    return f"{demand.cpu_milli / 1000:g} CPU cores"


__all__ = ["Reason", "diagnose", "quota_reason", "describe_demand"]
