"""MIG on the host: the instances a GPU is carved into, as the agent reports them.

Each instance is reported as ``{"uuid": "MIG-…", "profile": "1g.10gb", "start": 0,
"memory_mib": 9984}``: the MIG device UUID (what ``CUDA_VISIBLE_DEVICES`` takes), the GPU
instance profile, its first memory slice (0-7) and its memory. On real hardware
:mod:`agent.nvml` reads them through NVML (read-only); here is what ``--simulate`` needs to
invent them faithfully.

The table below describes SIMULATED hardware only: the few boards ``--simulate`` can carve
(A100-40GB, A100-80GB, H100-80GB), each profile's name, size in memory slices, legal start
slices and memory. The agent imports nothing from the portal, so it keeps its own copy; the
portal's table (the one placement decides with) is ``allocations/placement/mig.py``, and
tests/agent/test_mig.py checks the two agree for the boards both know. The agent never
creates, changes or destroys a MIG instance unless it was started with
``--allow-mig-reconfigure`` (a dynamic MIG pool's leases: :func:`carve_plan`); then it only
creates the instances its leases name and destroys the unleased ones in their way.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

SLICES = 8  # memory slices of every board here


@dataclass(frozen=True)
class Profile:
    name: str
    compute: int  # the "<g>g" count, out of 7
    size: int  # memory slices it occupies
    starts: tuple[int, ...]  # legal first slices
    memory_mib: int

    def mask(self, start: int) -> int:
        return ((1 << self.size) - 1) << start


def _profiles(per_slice_gb: int, memory: dict[int, int]) -> dict[str, Profile]:
    """One board's profiles; `memory` maps a size in slices (1, 2, 4, 8) to the instance's MiB."""
    m = per_slice_gb
    rows = [
        Profile(f"1g.{m}gb", 1, 1, (0, 1, 2, 3, 4, 5, 6), memory[1]),
        Profile(f"1g.{m}gb+me", 1, 1, (0, 1, 2, 3, 4, 5, 6), memory[1]),
        Profile(f"1g.{2 * m}gb", 1, 2, (0, 2, 4, 6), memory[2]),
        Profile(f"2g.{2 * m}gb", 2, 2, (0, 2, 4), memory[2]),
        Profile(f"3g.{4 * m}gb", 3, 4, (0, 4), memory[4]),
        Profile(f"4g.{4 * m}gb", 4, 4, (0,), memory[4]),
        Profile(f"7g.{8 * m}gb", 7, 8, (0,), memory[8]),
    ]
    return {p.name: p for p in rows}


#: Simulated board -> profile name -> profile. The H100's memory is what NVML reports on the card;
#: the A100s' is the name's size in GiB, as the portal's table has it.
GEOMETRY: dict[str, dict[str, Profile]] = {
    "A100-40GB": _profiles(5, {1: 5 * 1024, 2: 10 * 1024, 4: 20 * 1024, 8: 40 * 1024}),
    "A100-80GB": _profiles(10, {1: 10 * 1024, 2: 20 * 1024, 4: 40 * 1024, 8: 80 * 1024}),
    "H100-80GB": _profiles(10, {1: 9984, 2: 20096, 4: 40448, 8: 81152}),
}


class LayoutError(ValueError):
    pass


def board_of(name: str) -> str:
    """The key in GEOMETRY of a GPU NVML names e.g. "NVIDIA A100-SXM4-80GB" or "NVIDIA H100 80GB HBM3" ("" for
    a board this table does not carve)."""
    name = name.upper().replace(" ", "-")
    if "A100" in name:
        return "A100-80GB" if "80GB" in name else "A100-40GB"
    if "H100" in name and "80GB" in name:
        return "H100-80GB"
    return ""


def named_layout(board: str, layout: str) -> list[str]:
    """Profile names of a layout: ``all-balanced``, ``all-<profile>`` (as many as fit) or an explicit
    ``3g.40gb+2g.20gb+1g.10gb+1g.10gb`` list (a ``+me`` suffix stays with its profile)."""
    profiles = GEOMETRY[board]
    if layout == "all-enabled":  # MIG mode with no instances yet (mig-parted's name), for a dynamic pool
        return []
    if layout == "all-balanced":  # two 1g, one 2g, one 3g, each of the least memory (as mig-parted has it)
        small = {p.compute: p.name for p in reversed(profiles.values()) if not p.name.endswith("+me")}
        return [small[1], small[1], small[2], small[3]]
    if layout.startswith("all-"):
        profile = profiles.get(layout[4:])
        if profile is None:
            raise LayoutError(f"unknown MIG layout {layout!r} for {board} (known: all-balanced, "
                              + ", ".join(f"all-{p}" for p in profiles) + ")")
        if profile.name.endswith("+me"):
            return [profile.name]  # one media-engine instance per GPU
        # As many as have a start and compute slices left (seven 1g: slice 7 is no start; three 2g).
        return [profile.name] * min(len(profile.starts), 7 // profile.compute)
    names: list[str] = []
    for part in layout.split("+"):
        if part == "me" and names:
            names[-1] += "+me"
        else:
            names.append(part)
    return names


def place(board: str, names: list[str]) -> list[tuple[Profile, int]]:
    """Where each instance sits, (profile, start) by start: largest first, each at the first legal
    start that leaves room for the rest. Raises LayoutError for an unknown profile or a misfit."""
    profiles = GEOMETRY[board]
    wanted = []
    for name in names:
        if name not in profiles:
            raise LayoutError(f"{name!r} is not a MIG profile of {board} (its profiles: {', '.join(profiles)})")
        wanted.append(profiles[name])
    if sum(p.name.endswith("+me") for p in wanted) > 1:
        raise LayoutError("a GPU has at most one +me (media engine) instance")
    if sum(p.compute for p in wanted) > 7:
        raise LayoutError(f"{'+'.join(names)} needs more than 7 compute slices")
    wanted.sort(key=lambda p: (-p.size, -p.compute, p.name))

    def search(i: int, used: int) -> list[int] | None:
        if i == len(wanted):
            return []
        for start in wanted[i].starts:
            if used & wanted[i].mask(start) == 0:
                rest = search(i + 1, used | wanted[i].mask(start))
                if rest is not None:
                    return [start, *rest]
        return None

    starts = search(0, 0)
    if starts is None:
        raise LayoutError(f"{'+'.join(names)} does not fit on one {board}")
    return sorted(zip(wanted, starts), key=lambda pair: pair[1])


def simulated_uuid(gpu_uuid: str, start: int, created: str = "") -> str:
    """A stable fake MIG device UUID for the instance at `start` of `gpu_uuid` (same GPU, same start,
    same UUID across restarts, so the portal's grants keep naming it). An instance the agent creates
    later (`created`: what makes it new) gets a UUID of its own, as the driver gives one."""
    suffix = f"/{created}" if created else ""
    return f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpupool-simulated-mig:{gpu_uuid}/{start}{suffix}')}"


def simulated_devices(board: str, gpu_uuid: str, layout: str) -> list[dict]:
    return [{"uuid": simulated_uuid(gpu_uuid, start), "profile": profile.name, "start": start,
             "memory_mib": profile.memory_mib}
            for profile, start in place(board, named_layout(board, layout))]


def overlaps(a: tuple[Profile, int], b: tuple[Profile, int]) -> bool:
    return bool(a[0].mask(a[1]) & b[0].mask(b[1]))


def carve_plan(board: str, present: list[dict], wanted: list[tuple[str, int]]
               ) -> tuple[list[int], list[tuple[str, int]], dict[tuple[str, int], str]]:
    """What to change on one GPU so that every (profile, start) in `wanted` exists, leaving the wanted ones
    that exist alone: (starts of the present instances to destroy, instances to create, the wanted ones
    that cannot be made, each with why). Only instances no lease wants are destroyed, and only where a
    wanted one needs their slices."""
    profiles = GEOMETRY[board]
    have = {(d["profile"], d["start"]) for d in present}
    wanted_set = set(wanted)
    destroy: list[int] = []
    create: list[tuple[str, int]] = []
    refused: dict[tuple[str, int], str] = {}
    for name, start in sorted(wanted_set - have, key=lambda item: item[1]):
        profile = profiles.get(name)
        if profile is None or start not in profile.starts:
            refused[(name, start)] = f"{name} cannot start at slice {start} on a {board}"
            continue
        new = (profile, start)
        if any(overlaps(new, (profiles[n], s)) for n, s in create if n in profiles):
            refused[(name, start)] = f"{name} at slice {start} overlaps another instance the leases want"
            continue
        in_way = [d for d in present
                  if d["profile"] in profiles and overlaps(new, (profiles[d["profile"]], d["start"]))]
        kept = [d for d in in_way if (d["profile"], d["start"]) in wanted_set]
        if kept:
            refused[(name, start)] = (f"{name} at slice {start} overlaps {kept[0]['profile']} at slice "
                                      f"{kept[0]['start']}, which a lease holds")
            continue
        destroy.extend(d["start"] for d in in_way if d["start"] not in destroy)
        create.append((name, start))
    return sorted(destroy), create, refused
