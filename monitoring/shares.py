"""Shares of a GPU: who holds which part of a card now, how much memory that part is worth, and whose
each running process is, so "allocated vs used" is known per share and not only per card.

A share is one reservation's part of one GPU, or of one MIG instance of it: the k time-slicing or
MPS slot rows of a reservation on a GPU are one share, each MIG instance is its own (named by
allocations.booking.mig_instance_id, the MIG device UUID the host reported, as its processes are).
Its memory (`allocated_mib`, the grant-row contract in the allocations app):

- mig: the grant's memory_mib (the profile's memory);
- mps, vgpu: the memory_mib of its rows on that GPU, summed;
- time_slicing: the card's memory × k shares / N replicas (nothing enforces it: time-slicing has no
  memory isolation, which is why the "share memory exceeded" alert exists);
- exclusive: the whole card.

Processes are attributed at ingest (`attribute`), with the holders of each GPU taken from the
ingest's cached host map; the result rides in the hot cache with the GPU's newest sample
(hot.Latest.shares), where the live view, /metrics and the alert read it.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from allocations import units
from allocations.booking import mig_instance_id
from allocations.models import Allocation
from inventory.sharing import REPLICA_MODES, replicas_of

MIG = "mig"


class Holder(NamedTuple):
    """One share of a GPU as the ingest's host map caches it (a plain tuple: it is unpickled per request)."""

    reservation_id: int
    team_id: int
    user: str  # the reservation's requested_by username ("" when unknown)
    instance: str  # "" for a share of the whole card, else the MIG instance's id
    allocated_mib: int


@dataclass
class Share:
    """One reservation's share of one GPU (or MIG instance) now, with what it may use."""

    reservation_id: int
    team_id: int
    team: str
    user: str
    pool_id: int | None
    gpu_id: int
    gpu_uuid: str
    mode: str
    instance: str = ""
    mig_profile: str = ""
    mig_start: int | None = None
    gpu_instance_id: int | None = None  # NVML's GPU instance id, where the host reported one
    allocated_mib: int = 0
    rows: list[tuple[int | None, int]] = field(default_factory=list)  # (memory_mib, milli) of its grant rows

    def holder(self) -> Holder:
        return Holder(self.reservation_id, self.team_id, self.user, self.instance, self.allocated_mib)


def share_memory_mib(mode: str, gpu_memory_mib: int, rows: list[tuple[int | None, int]], replicas: int | None,
                     instance_memory_mib: int | None = None) -> int:
    """What a share may use of its card's memory, in MiB (see the module's table). `rows` are its grant
    rows' (memory_mib, milli) on that GPU; `replicas` the pool's N for time-slicing and MPS."""
    caps = [memory for memory, _ in rows if memory is not None]
    if mode == MIG:
        return sum(caps) if caps else int(instance_memory_mib or 0)
    if mode in ("mps", "vgpu") and caps:
        return sum(caps)
    if mode in REPLICA_MODES or mode == "vgpu":
        if mode in REPLICA_MODES and replicas:
            return gpu_memory_mib * sum(units.share_slots(milli, replicas) for _, milli in rows) // replicas
        return gpu_memory_mib * sum(milli for _, milli in rows) // 1000  # rows without caps: their worth
    return gpu_memory_mib


def shares_now(now: datetime, gpu_ids: Iterable[int] | None = None) -> list[Share]:
    """Every share held at `now` (of `gpu_ids` only, when given): one query of the grant rows."""
    rows = Allocation.objects.filter(starts_at__lte=now, ends_at__gt=now)
    if gpu_ids is not None:
        rows = rows.filter(gpu_id__in=list(gpu_ids))
    found: dict[tuple[int, int, str], Share] = {}
    extra: dict[tuple[int, int, str], tuple] = {}
    for (reservation_id, team_id, team, user, pool_id, config, gpu_id, gpu_uuid, gpu_memory, mig_devices, mode,
         mig_profile, mig_start, memory_mib, milli) in rows.order_by("reservation_id", "gpu_id", "mig_start").values_list(
            "reservation_id", "reservation__team_id", "reservation__team__slug", "reservation__requested_by__username",
            "reservation__pool_id", "reservation__pool__sharing_config", "gpu_id", "gpu__uuid", "gpu__memory_mib",
            "gpu__mig_devices", "mode", "mig_profile", "mig_start", "memory_mib", "milli"):
        instance = mig_instance_id(gpu_uuid, mig_devices, mig_profile, mig_start) if mode == MIG else ""
        key = (reservation_id, gpu_id, instance)
        share = found.get(key)
        if share is None:
            device = next((d for d in mig_devices or () if isinstance(d, dict) and d.get("uuid") == instance), {})
            gi = device.get("gpu_instance_id")
            share = found[key] = Share(reservation_id, team_id, team, user or "", pool_id, gpu_id, gpu_uuid, mode,
                                       instance, mig_profile or "", mig_start,
                                       gi if isinstance(gi, int) else None)
            extra[key] = (gpu_memory, replicas_of(config), device.get("memory_mib"))
        share.rows.append((memory_mib, milli))
    for key, share in found.items():
        gpu_memory, replicas, instance_memory = extra[key]
        share.allocated_mib = share_memory_mib(share.mode, gpu_memory, share.rows, replicas, instance_memory)
    return list(found.values())


def holders_by_gpu(shares: Iterable[Share]) -> dict[int, tuple[Holder, ...]]:
    by_gpu: dict[int, list[Holder]] = defaultdict(list)
    for share in shares:
        by_gpu[share.gpu_id].append(share.holder())
    return {gpu_id: tuple(holders) for gpu_id, holders in by_gpu.items()}


# A process as the ingest reads it: (pid, used MiB, user, MIG device UUID or "", GPU instance id or None).
Process = tuple[int, int, str, str, "int | None"]
# What the hot cache keeps per GPU: (reservation id or None when nobody could be told, instance, used MiB,
# GPU instance id or None), one per holder of the GPU and one per instance with unattributed use.
Use = tuple["int | None", str, int, "int | None"]


def attribute(processes: Iterable[Process], holders: tuple[Holder, ...]) -> tuple[Use, ...]:
    """Whose is each process on one GPU, and how much memory each share uses.

    A process on a MIG instance belongs among the holders of that instance (nobody's when no one holds
    it; among all of the GPU's holders only when the GPU never reported its MIG devices, so its
    instances are not named by their UUIDs); any other among the GPU's holders. One reservation among them: it is that one's, whoever runs it.
    Several (a time-sliced card): the one whose booker runs it (the process's user equals the
    reservation's requested_by username). Otherwise nobody's (reservation None), and counted so.
    Every holder gets an entry, 0 MiB when it runs nothing, so "used" is known for all of them.
    """
    used: dict[tuple[int | None, str], int] = {(h.reservation_id, h.instance): 0 for h in holders}
    instance_ids: dict[tuple[int | None, str], int] = {}
    for pid, mib, user, mig_uuid, gi in processes:
        candidates = list(holders)
        if mig_uuid:
            candidates = [h for h in holders if h.instance == mig_uuid]
            if not candidates and any(h.instance.startswith("MIG-") for h in holders):
                candidates = []  # an instance nobody holds
            elif not candidates:
                candidates = list(holders)
        owner = _owner(candidates, user)
        key = (owner.reservation_id, owner.instance) if owner is not None else (None, mig_uuid)
        used[key] = used.get(key, 0) + mib
        if gi is not None:
            instance_ids[key] = gi
    return tuple((reservation_id, instance, mib, instance_ids.get((reservation_id, instance)))
                 for (reservation_id, instance), mib in used.items())


def _owner(candidates: list[Holder], user: str) -> Holder | None:
    if len({h.reservation_id for h in candidates}) == 1:
        mine = candidates
    else:
        mine = [h for h in candidates if user and h.user == user]
        if len({h.reservation_id for h in mine}) != 1:
            return None
    # One reservation; several holders of it only when it holds several MIG instances of the GPU and the
    # process named none of them: its use is the reservation's on the first one.
    return mine[0]


def used_mib(uses: Iterable[Use], reservation_id: int, instance: str) -> int:
    """What one share uses, from the GPU's hot entry (0 when it runs nothing)."""
    return sum(mib for r, i, mib, _ in uses if r == reservation_id and i == instance)


def instance_id_of(uses: Iterable[Use], reservation_id: int, instance: str) -> int | None:
    return next((gi for r, i, _, gi in uses if r == reservation_id and i == instance and gi is not None), None)
