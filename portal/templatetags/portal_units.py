"""What a reservation or a grant holds, in its pool's unit, as the pages say it: "3 of 4 shares",
"2 × 1g.10gb", "20 GiB + 30 % cores", "2 GPUs"; and GE as a short number."""
from __future__ import annotations

from datetime import timedelta

from django import template

from allocations.queue import span as queue_span

from inventory.sharing import REPLICA_MODES, SharingMode

register = template.Library()


@register.filter
def ge(value) -> str:
    """GPU-equivalents, at most two decimals, no trailing zeros (0.25, 1, 3.43)."""
    if value in (None, ""):
        return "–"
    text = f"{float(value):.2f}".rstrip("0").rstrip(".")
    return text or "0"


@register.filter
def memory(mib) -> str:
    """MiB as GiB when it is a whole number of them (20 GiB), else MiB (9984 MiB)."""
    if mib in (None, ""):
        return "–"
    mib = int(mib)
    return f"{mib // 1024} GiB" if mib and mib % 1024 == 0 else f"{mib} MiB"


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def booked_words(reservation) -> str:
    """A reservation's amount in its pool's unit. Replicas come from its grants (set by
    selectors.with_allocated_gpus) or else its pool's sharing_config."""
    mode = reservation.mode
    if mode in REPLICA_MODES:
        grants = getattr(reservation, "grants", None) or ()
        replicas = next((g["replicas"] for g in grants if g.get("replicas")), None)
        if replicas is None:
            replicas = (reservation.pool.sharing_config or {}).get("replicas")
        return f"{reservation.shares or 0} of {replicas or '?'} shares"
    if mode == "mig":
        return f"{reservation.mig_count or 1} × {reservation.mig_profile}"
    if mode == "vgpu":
        words = f"{memory(reservation.gpu_memory_mib)} + {reservation.gpu_cores_pct or 0} % cores"
        return words if reservation.gpus == 1 else f"{words} on each of {reservation.gpus} GPUs"
    return _plural(reservation.gpus, "GPU", "GPUs")


@register.filter
def booked(reservation) -> str:
    return booked_words(reservation)


@register.filter
def grant_part(grant: dict) -> str:
    """What one grant (selectors.with_allocated_gpus) holds of its GPU."""
    mode = grant.get("mode")
    if mode in REPLICA_MODES:
        words = f"{grant['shares']} of {grant.get('replicas') or '?'} shares"
        if mode == "mps" and grant.get("gpu_memory_mib"):
            words += f" (≤ {memory(grant['gpu_memory_mib'])}, {grant.get('gpu_cores_pct')} % SMs)"
        return words
    if mode == "mig":
        return str(grant.get("mig_profile"))
    if mode == "vgpu":
        return f"{memory(grant.get('gpu_memory_mib'))} + {grant.get('gpu_cores_pct')} % cores"
    return "whole GPU"


@register.filter
def memory_share(mib, replicas) -> str:
    """One of `replicas` shares of a card's memory."""
    return memory(int(mib) // int(replicas)) if replicas else memory(mib)


@register.filter
def mode_label(mode) -> str:
    """A sharing mode as people read it (inventory.sharing.SharingMode's labels)."""
    try:
        return SharingMode(mode).label
    except ValueError:
        return str(mode)



@register.filter
def span(value) -> str:
    """A timedelta (or seconds) as people read it (allocations.queue.span): "45 min", "3 h 20 min"."""
    return queue_span(value if hasattr(value, "total_seconds") else timedelta(seconds=float(value or 0)))


@register.filter
def moved_from(current, previous) -> str:
    """How a queue time moved since the pass before: "12 min earlier", "1 h later", or "" unchanged."""
    if current is None or previous is None or abs((current - previous).total_seconds()) < 60:
        return ""
    return f"{queue_span(current - previous)} {'later' if current > previous else 'earlier'}"
