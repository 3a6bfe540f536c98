"""What a reservation or a grant holds, in its pool's unit, as the pages say it: "3 of 4 shares",
"2 × 1g.10gb", "20 GiB + 30 % cores", "2 GPUs"; and GE as a short number."""
from __future__ import annotations

from datetime import timedelta

from django import template
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from allocations import queue
from allocations.models import Reservation
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


def _shares(shares, replicas) -> str:
    return _("%(shares)s of %(replicas)s shares") % {"shares": shares, "replicas": replicas or "?"}


def _memory_and_cores(mib, cores_pct) -> str:
    return _("%(memory)s + %(cores)s %% cores") % {"memory": memory(mib), "cores": cores_pct}


def booked_words(reservation) -> str:
    """A reservation's amount in its pool's unit. Replicas come from its grants (set by
    selectors.with_allocated_gpus) or else its pool's sharing_config."""
    mode = reservation.mode
    if mode in REPLICA_MODES:
        grants = getattr(reservation, "grants", None) or ()
        replicas = next((g["replicas"] for g in grants if g.get("replicas")), None)
        if replicas is None:
            replicas = (reservation.pool.sharing_config or {}).get("replicas")
        return _shares(reservation.shares or 0, replicas)
    if mode == "mig":
        return f"{reservation.mig_count or 1} × {reservation.mig_profile}"
    if mode == "vgpu":
        words = _memory_and_cores(reservation.gpu_memory_mib, reservation.gpu_cores_pct or 0)
        if reservation.gpus == 1:
            return words
        return _("%(amount)s on each of %(gpus)s GPUs") % {"amount": words, "gpus": reservation.gpus}
    return ngettext("%(gpus)s GPU", "%(gpus)s GPUs", reservation.gpus or 0) % {"gpus": reservation.gpus}


@register.filter
def booked(reservation) -> str:
    return booked_words(reservation)


@register.filter
def grant_part(grant: dict) -> str:
    """What one grant (selectors.with_allocated_gpus) holds of its GPU."""
    mode = grant.get("mode")
    if mode in REPLICA_MODES:
        words = _shares(grant["shares"], grant.get("replicas"))
        if mode == "mps" and grant.get("gpu_memory_mib"):
            words = _("%(shares)s (≤ %(memory)s, %(sms)s %% SMs)") % {
                "shares": words, "memory": memory(grant["gpu_memory_mib"]), "sms": grant.get("gpu_cores_pct")}
        return words
    if mode == "mig":
        return str(grant.get("mig_profile"))
    if mode == "vgpu":
        return _memory_and_cores(grant.get("gpu_memory_mib"), grant.get("gpu_cores_pct"))
    return _("whole GPU")


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



def span_words(delta: timedelta) -> str:
    """A length of time in the active language: "45 min", "3 h 20 min", "2 d 4 h" (to the nearest minute);
    zh-Hans "45 分钟", "3 小时 20 分钟", "2 天 4 小时". The same words as the stored reasons that name spans."""
    return str(queue.span(delta))


@register.filter
def span(value) -> str:
    """A timedelta (or seconds) as people read it: "45 min", "3 h 20 min"."""
    return span_words(value if hasattr(value, "total_seconds") else timedelta(seconds=float(value or 0)))


@register.filter
def moved_from(current, previous) -> str:
    """How a queue time moved since the pass before: "12 min later", "1 h earlier", or "" unchanged."""
    if current is None or previous is None or abs((current - previous).total_seconds()) < 60:
        return ""
    if current > previous:
        return _("%(span)s later") % {"span": span_words(current - previous)}
    return _("%(span)s earlier") % {"span": span_words(current - previous)}


@register.filter
def state_label(state) -> str:
    """A reservation's state as people read it: its label (allocations' Reservation.State), lower case as the
    pages write it in English ("active"); an unknown value as it is."""
    try:
        return str(Reservation.State(state).label).lower()
    except ValueError:
        return str(state or "")
