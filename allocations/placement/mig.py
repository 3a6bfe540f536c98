"""MIG (Multi-Instance GPU) geometry: which profiles a GPU model offers and where each may start.

A MIG-capable GPU is carved into GPU instances. NVIDIA's driver tracks them in *memory
slices*: every supported model has 8, numbered 0-7, and a profile may only be created at
a fixed set of start slices ("placements", as `nvidia-smi mig -lgipp` lists them); an
instance occupies ``size`` consecutive slices from its start, and two instances on one GPU
may not share a slice. The table below is the geometry of the A100-40GB, A100-80GB,
H100-80GB and H200 (141 GB), which share one layout and differ only in memory (the H100's
figures are what NVML reports on the card, tests/placement/test_mig_geometry_on_hardware.py;
the others' come from the profile names and have not been read off a card yet):

==========  ===========  ======  ====================
compute     profile      size    legal start slices
==========  ===========  ======  ====================
1g          1g.<m>gb     1       0 1 2 3 4 5 6
1g (+me)    1g.<m>gb+me  1       0 1 2 3 4 5 6 (at most one per GPU: it owns the media engines)
1g          1g.<2m>gb    2       0 2 4 6
2g          2g.<2m>gb    2       0 2 4
3g          3g.<4m>gb    4       0 4
4g          4g.<4m>gb    4       0
7g          7g.<8m>gb    8       0
==========  ===========  ======  ====================

Invariant kept by every caller: a GPU's occupancy is an 8-bit mask of used memory slices,
and a placement ``(profile, start)`` is legal only if ``start`` is one of the profile's
starts and ``mask & profile.mask(start) == 0``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from allocations import units

MIG_SLICES = 8
FULL_MASK = (1 << MIG_SLICES) - 1


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of one GPU model."""

    name: str
    compute_slices: int  # the "g" count: 1, 2, 3, 4 or 7
    memory_mib: int
    size: int  # memory slices occupied
    starts: tuple[int, ...]
    single_per_gpu: bool = False  # +me profiles: one per GPU

    def mask(self, start: int) -> int:
        """Bit mask of the memory slices an instance started at ``start`` occupies."""
        return ((1 << self.size) - 1) << start

    @property
    def milli(self) -> int:
        """Compute share in milli-GPU, used to compare MIG demand with fractional demand."""
        return units.mig_milli(self.compute_slices)


def _family(mem_per_slice_gb: int, mem_per_slice_mib: int) -> dict[str, MigProfile]:
    m = mem_per_slice_gb
    mib = mem_per_slice_mib
    profiles = [
        MigProfile(f"1g.{m}gb", 1, mib, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(f"1g.{m}gb+me", 1, mib, 1, (0, 1, 2, 3, 4, 5, 6), single_per_gpu=True),
        MigProfile(f"1g.{2 * m}gb", 1, 2 * mib, 2, (0, 2, 4, 6)),
        MigProfile(f"2g.{2 * m}gb", 2, 2 * mib, 2, (0, 2, 4)),
        MigProfile(f"3g.{4 * m}gb", 3, 4 * mib, 4, (0, 4)),
        MigProfile(f"4g.{4 * m}gb", 4, 4 * mib, 4, (0,)),
        MigProfile(f"7g.{8 * m}gb", 7, 8 * mib, 8, (0,)),
    ]
    return {p.name: p for p in profiles}


def _h100_80gb() -> dict[str, MigProfile]:
    # Memory as NVML reports it on an H100 80GB HBM3 (tests/placement/data/nvml-probe-*.json): a
    # little under the names' 10 GB per slice, and not a multiple of one slice's memory.
    profiles = [
        MigProfile("1g.10gb", 1, 9984, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile("1g.10gb+me", 1, 9984, 1, (0, 1, 2, 3, 4, 5, 6), single_per_gpu=True),
        MigProfile("1g.20gb", 1, 20096, 2, (0, 2, 4, 6)),
        MigProfile("2g.20gb", 2, 20096, 2, (0, 2, 4)),
        MigProfile("3g.40gb", 3, 40448, 4, (0, 4)),
        MigProfile("4g.40gb", 4, 40448, 4, (0,)),
        MigProfile("7g.80gb", 7, 81152, 8, (0,)),
    ]
    return {p.name: p for p in profiles}


def _h200() -> dict[str, MigProfile]:
    # The H200's 141 GB do not divide evenly; NVIDIA names its profiles by rounded sizes.
    profiles = [
        MigProfile("1g.18gb", 1, 18 * 1024, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile("1g.18gb+me", 1, 18 * 1024, 1, (0, 1, 2, 3, 4, 5, 6), single_per_gpu=True),
        MigProfile("1g.35gb", 1, 35 * 1024, 2, (0, 2, 4, 6)),
        MigProfile("2g.35gb", 2, 35 * 1024, 2, (0, 2, 4)),
        MigProfile("3g.71gb", 3, 71 * 1024, 4, (0, 4)),
        MigProfile("4g.71gb", 4, 71 * 1024, 4, (0,)),
        MigProfile("7g.141gb", 7, 141 * 1024, 8, (0,)),
    ]
    return {p.name: p for p in profiles}


#: Canonical model key -> profile name -> profile.
MIG_GEOMETRY: Mapping[str, Mapping[str, MigProfile]] = {
    "A100-40GB": _family(5, 5 * 1024),
    "A100-80GB": _family(10, 10 * 1024),
    "H100-80GB": _h100_80gb(),
    "H200": _h200(),
}


def canonical_model(model: str) -> str | None:
    """Map a marketing or driver model name to a key of :data:`MIG_GEOMETRY` (None if not MIG).

    Accepts e.g. "A100-SXM4-40GB", "NVIDIA A100 80GB PCIe", "H100 80GB HBM3", "H100", "H200 NVL".
    """
    name = re.sub(r"[\s_]+", "-", model.upper())
    if "H200" in name:
        return "H200"
    if "H100" in name:
        return "H100-80GB"  # the 94/96 GB variants are not in the table; treated as 80 GB geometry
    if "A100" in name:
        return "A100-80GB" if "80" in name else "A100-40GB"
    return None


def profiles_for(model: str) -> Mapping[str, MigProfile]:
    """Profiles a GPU model offers ({} for a model without MIG)."""
    key = canonical_model(model)
    return MIG_GEOMETRY.get(key, {}) if key else {}


def profile_for(model: str, profile: str) -> MigProfile | None:
    return profiles_for(model).get(profile)


def mig_compute_milli(profile_name: str) -> int:
    """Compute share of a profile name in milli-GPU, from its "<g>g." prefix (0 if unparseable)."""
    m = re.match(r"^(\d+)g\.", profile_name)
    return units.mig_milli(int(m.group(1))) if m else 0


def free_starts(profile: MigProfile, used_mask: int, has_media_instance: bool = False) -> list[int]:
    """Legal start slices for ``profile`` on a GPU whose used slices are ``used_mask``."""
    if profile.single_per_gpu and has_media_instance:
        return []
    return [s for s in profile.starts if used_mask & profile.mask(s) == 0]


def placeable_count(profiles: Iterable[MigProfile], used_mask: int) -> tuple[int, int]:
    """(largest compute size still placeable, weighted number of legal placements left).

    This is the MIG analogue of a fragmentation measure: a placement that keeps a big
    profile placeable and many small placements open strands less of the GPU.
    """
    largest = 0
    weighted = 0
    for p in profiles:
        n = len(free_starts(p, used_mask))
        if n:
            largest = max(largest, p.compute_slices)
            weighted += n * p.compute_slices
    return largest, weighted


def best_start(model: str, profile_name: str, used_mask: int, has_media_instance: bool = False) -> int | None:
    """The legal start that leaves the GPU least fragmented, or None if the profile does not fit.

    Ties go to the highest start: small instances fill from the top so slice 0, the only
    start of the 4g and 7g profiles, stays free longest.
    """
    profiles = profiles_for(model)
    profile = profiles.get(profile_name)
    if profile is None:
        return None
    starts = free_starts(profile, used_mask, has_media_instance)
    if not starts:
        return None
    others = [p for p in profiles.values() if not p.single_per_gpu]
    return max(starts, key=lambda s: (placeable_count(others, used_mask | profile.mask(s)), s))


def occupied_slices(used_mask: int) -> int:
    return bin(used_mask & FULL_MASK).count("1")


# --- layouts: what a GPU of a static MIG pool is carved into ---------------------------------

class LayoutError(ValueError):
    """A MIG layout that names an unknown profile or does not fit on the GPU."""


def _smallest_of_each_compute(profiles: Mapping[str, MigProfile]) -> dict[int, MigProfile]:
    """For each compute size (1, 2, 3, 4, 7), its profile with the least memory (no +me variant)."""
    best: dict[int, MigProfile] = {}
    for p in profiles.values():
        if not p.single_per_gpu and (p.compute_slices not in best or p.size < best[p.compute_slices].size):
            best[p.compute_slices] = p
    return best


def named_layout(model: str, name: str) -> list[str]:
    """The profiles of a layout named as NVIDIA's mig-parted example config names them, for `model`.

    ``all-<profile>``: as many instances of that profile as fit (all-1g.10gb is 7 on an A100-80GB,
    all-3g.40gb is 2); ``all-balanced``: two 1g, one 2g and one 3g of the smallest memory each.
    """
    profiles = profiles_for(model)
    if not profiles:
        raise LayoutError(f"{model} has no MIG profiles")
    if name == "all-balanced":
        by_compute = _smallest_of_each_compute(profiles)
        return [by_compute[1].name, by_compute[1].name, by_compute[2].name, by_compute[3].name]
    if name.startswith("all-") and name[4:] in profiles:
        profile = profiles[name[4:]]
        if profile.single_per_gpu:
            return [profile.name]
        # As many as have a start of their own and compute slices left: 7 × 1g, 4 × 1g.20gb, 3 × 2g,
        # 2 × 3g, 1 × 4g, 1 × 7g.
        return [profile.name] * min(len(profile.starts), units.MIG_COMPUTE_SLICES // profile.compute_slices)
    known = ", ".join(["all-balanced", *(f"all-{p}" for p in profiles)])
    raise LayoutError(f"unknown MIG layout {name!r} for {model} (known: {known})")


def layout_instances(model: str, profile_names: Iterable[str]) -> list[tuple[MigProfile, int]]:
    """Where each instance of a layout sits on one GPU: (profile, start slice), by start.

    Instances are placed largest first, each at the first legal start that leaves room for the
    rest (a search over at most 8 slices, so it finds a placement whenever one exists).
    Raises LayoutError when a profile is unknown for the model or the layout does not fit.
    """
    profiles = profiles_for(model)
    wanted = []
    for name in profile_names:
        if name not in profiles:
            known = ", ".join(profiles) or "none"
            raise LayoutError(f"{name!r} is not a MIG profile of {model} (its profiles: {known})")
        wanted.append(profiles[name])
    if sum(p.single_per_gpu for p in wanted) > 1:
        raise LayoutError("a GPU has at most one +me (media engine) instance")
    wanted.sort(key=lambda p: (-p.size, -p.compute_slices, p.name))
    if sum(p.compute_slices for p in wanted) > units.MIG_COMPUTE_SLICES:
        raise LayoutError(f"{' + '.join(p.name for p in wanted)} needs more than the GPU's "
                          f"{units.MIG_COMPUTE_SLICES} compute slices")

    def search(i: int, used: int) -> list[int] | None:
        if i == len(wanted):
            return []
        for start in free_starts(wanted[i], used):
            rest = search(i + 1, used | wanted[i].mask(start))
            if rest is not None:
                return [start, *rest]
        return None

    starts = search(0, 0)
    if starts is None:
        raise LayoutError(f"{' + '.join(p.name for p in wanted)} does not fit on one {model}: no placement of "
                          "the instances at their legal start slices leaves them apart")
    return sorted(zip(wanted, starts), key=lambda pair: pair[1])
