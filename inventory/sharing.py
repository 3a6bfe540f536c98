"""Sharing modes of a pool and the shape of each mode's parameters.

exclusive: whole GPUs, no parameters. time_slicing and mps: {"replicas": N} (2..64) —
each GPU is offered as N shares. mig: {"mig_layout": "<nvidia mig-parted config name>"}
or {"profiles": {"1g.10gb": 7, ...}} per GPU. vgpu (HAMi-style): optional
{"default_memory_mib": int, "default_cores_pct": 1..100}.
"""
from __future__ import annotations

from typing import Any

from django.db import models


class SharingMode(models.TextChoices):
    EXCLUSIVE = "exclusive", "Exclusive (whole GPUs)"
    TIME_SLICING = "time_slicing", "Time-slicing"
    MPS = "mps", "MPS"
    MIG = "mig", "MIG"
    VGPU = "vgpu", "vGPU (memory + core shares)"


# Modes whose reservations the portal can place today; the rest are stored, not yet booked.
RESERVABLE_MODES = frozenset({SharingMode.EXCLUSIVE})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_sharing_config(mode: str, config: Any) -> list[str]:
    """Return human-readable problems with `config` for `mode` (empty when valid)."""
    if not isinstance(config, dict):
        return ["must be a JSON object"]
    allowed: dict[str, set[str]] = {
        SharingMode.EXCLUSIVE: set(),
        SharingMode.TIME_SLICING: {"replicas"},
        SharingMode.MPS: {"replicas"},
        SharingMode.MIG: {"mig_layout", "profiles"},
        SharingMode.VGPU: {"default_memory_mib", "default_cores_pct"},
    }
    if mode not in allowed:
        return [f"unknown sharing mode {mode!r}"]
    problems = [f"unknown key {key!r} for mode {mode}" for key in sorted(set(config) - allowed[mode])]
    if mode in (SharingMode.TIME_SLICING, SharingMode.MPS):
        replicas = config.get("replicas")
        if not _is_int(replicas) or not 2 <= replicas <= 64:
            problems.append("replicas must be an integer from 2 to 64")
    elif mode == SharingMode.MIG:
        layout, profiles = config.get("mig_layout"), config.get("profiles")
        if layout is None and profiles is None:
            problems.append("mig needs mig_layout (a config name) or profiles ({profile: count})")
        if layout is not None and (not isinstance(layout, str) or not layout):
            problems.append("mig_layout must be a non-empty string")
        if profiles is not None and (
            not isinstance(profiles, dict)
            or not profiles
            or not all(isinstance(k, str) and _is_int(v) and v >= 1 for k, v in profiles.items())
        ):
            problems.append("profiles must map profile names (e.g. 1g.10gb) to counts >= 1")
    elif mode == SharingMode.VGPU:
        memory = config.get("default_memory_mib")
        cores = config.get("default_cores_pct")
        if memory is not None and (not _is_int(memory) or memory < 1):
            problems.append("default_memory_mib must be a positive integer")
        if cores is not None and (not _is_int(cores) or not 1 <= cores <= 100):
            problems.append("default_cores_pct must be an integer from 1 to 100")
    return problems
