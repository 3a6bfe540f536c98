"""Sharing modes of a pool and the shape of each mode's parameters.

exclusive: whole GPUs, no parameters. time_slicing and mps: {"replicas": N} (2..64): each
GPU is offered as N shares. mig: each GPU's layout, {"mig_layout": "<mig-parted config name>"}
(all-1g.10gb, all-balanced, ...) or {"profiles": ["3g.40gb", "2g.20gb", "1g.10gb", ...]} (one
GPU's instances; {"1g.10gb": 7} counts are accepted too), and {"dynamic": true} for a dynamic layout:
each GPU is carved on demand, per booking window, at the placement engine's start slices (the
layout, optional then, is only what an idle GPU is set to). Whether a layout fits the pool's GPU
models is checked where pools are written (allocations), which knows the MIG geometry. vgpu
(HAMi-style): optional {"default_memory_mib": int, "default_cores_pct": 1..100}.
"""
from __future__ import annotations

from typing import Any

from django.db import models
from django.utils.translation import gettext as _, gettext_lazy


class SharingMode(models.TextChoices):
    EXCLUSIVE = "exclusive", gettext_lazy("Exclusive (whole GPUs)")
    TIME_SLICING = "time_slicing", gettext_lazy("Time-slicing")
    MPS = "mps", "MPS"
    MIG = "mig", "MIG"
    VGPU = "vgpu", gettext_lazy("vGPU (memory + core shares)")


# Modes whose reservations the portal can place: all of them.
RESERVABLE_MODES = frozenset(SharingMode)
# Modes whose unit is a share of one GPU, offered as `replicas` shares per GPU.
REPLICA_MODES = frozenset({SharingMode.TIME_SLICING, SharingMode.MPS})


def replicas_of(config: Any) -> int | None:
    """N of a time-slicing or MPS pool's config ({"replicas": N}); None where it names no positive number."""
    try:
        replicas = int((config or {}).get("replicas"))
    except (TypeError, ValueError, AttributeError):
        return None
    return replicas if replicas > 0 else None


def mig_layout_names(config: dict) -> tuple[str, ...] | str:
    """A mig pool's layout as written: a named layout (a string) or one GPU's profile names (a tuple)."""
    if config.get("mig_layout"):
        return str(config["mig_layout"])
    profiles = config.get("profiles") or ()
    if isinstance(profiles, dict):
        return tuple(name for name, count in sorted(profiles.items()) for _copy in range(int(count)))
    return tuple(profiles)


def mig_dynamic(config: Any) -> bool:
    """Whether a mig pool's GPUs are laid out on demand ({"dynamic": true}) rather than by a fixed layout."""
    return isinstance(config, dict) and config.get("dynamic") is True


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_sharing_config(mode: str, config: Any) -> list[str]:
    """Return human-readable problems with `config` for `mode` (empty when valid)."""
    if not isinstance(config, dict):
        return [_("must be a JSON object")]
    allowed: dict[str, set[str]] = {
        SharingMode.EXCLUSIVE: set(),
        SharingMode.TIME_SLICING: {"replicas"},
        SharingMode.MPS: {"replicas"},
        SharingMode.MIG: {"mig_layout", "profiles", "dynamic"},
        SharingMode.VGPU: {"default_memory_mib", "default_cores_pct"},
    }
    if mode not in allowed:
        return [_("unknown sharing mode %(mode)r") % {"mode": mode}]
    problems = [_("unknown key %(key)r for mode %(mode)s") % {"key": key, "mode": mode}
                for key in sorted(set(config) - allowed[mode])]
    if mode in (SharingMode.TIME_SLICING, SharingMode.MPS):
        replicas = config.get("replicas")
        if not _is_int(replicas) or not 2 <= replicas <= 64:
            problems.append(_("replicas must be an integer from 2 to 64"))
    elif mode == SharingMode.MIG:
        layout, profiles = config.get("mig_layout"), config.get("profiles")
        dynamic = config.get("dynamic", False)
        if not isinstance(dynamic, bool):
            problems.append(_("dynamic must be true or false"))
        if layout is None and profiles is None and dynamic is not True:
            problems.append(_("mig needs mig_layout (a config name), profiles ({profile: count}) or dynamic: true"))
        if layout is not None and (not isinstance(layout, str) or not layout):
            problems.append(_("mig_layout must be a non-empty string"))
        if layout is not None and profiles is not None:
            problems.append(_("give mig_layout or profiles, not both"))
        as_list = isinstance(profiles, list) and profiles and all(isinstance(k, str) and k for k in profiles)
        as_counts = isinstance(profiles, dict) and profiles and all(
            isinstance(k, str) and _is_int(v) and v >= 1 for k, v in profiles.items())
        if profiles is not None and not (as_list or as_counts):
            problems.append(_("profiles must list one GPU's profile names (e.g. [\"3g.40gb\", \"1g.10gb\"]) or "
                              "map them to counts >= 1"))
    elif mode == SharingMode.VGPU:
        memory = config.get("default_memory_mib")
        cores = config.get("default_cores_pct")
        if memory is not None and (not _is_int(memory) or memory < 1):
            problems.append(_("default_memory_mib must be a positive integer"))
        if cores is not None and (not _is_int(cores) or not 1 <= cores <= 100):
            problems.append(_("default_cores_pct must be an integer from 1 to 100"))
    return problems
