"""What should exist on a cluster right now, as plain data the backends turn into objects.

Built from the database by :func:`allocations.apply.selectors.cluster_desired`; the
backends never query the database themselves, so they can be tested with hand-made values.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

#: Label and annotation keys every object the portal manages carries.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "gpupool-portal"
TEAM_LABEL = "gpupool.io/team"
RESERVATIONS_ANNOTATION = "gpupool.io/reservations"
FIELD_MANAGER = "gpupool-portal"


def team_namespace(team_slug: str) -> str:
    """The namespace of a team on every Kubernetes cluster: deterministic, a valid DNS-1123 label."""
    name = re.sub(r"[^a-z0-9-]+", "-", team_slug.lower()).strip("-")
    return f"gpupool-{name}"[:63].rstrip("-")


@dataclass(frozen=True)
class Grant:
    """What one reservation holds of one GPU now, in its sharing mode's unit.

    Built from the grant rows (allocations.models.Allocation) of the reservation on that GPU:
    exclusive and vgpu have one row per GPU (units 1; vgpu with the row's memory and cores);
    time_slicing/mps rows hold runs of share slots, k in all one Grant with units k (mps:
    memory and cores summed over the slots); mig has one row per instance, so the Grant of a
    profile counts its instances (memory summed).
    """

    reservation_id: int
    gpu_uuid: str
    node_name: str
    pool_slug: str
    sharing_mode: str  # inventory.sharing.SharingMode value
    ends_at: datetime
    # What the grant counts as in the mode's resource: whole GPUs (1) for exclusive, vGPU
    # devices (1) for vgpu, shares for time_slicing/mps, instances of `mig_profile` for mig.
    units: int = 1
    mig_profile: str = ""
    memory_mib: int = 0
    cores_pct: int = 0


@dataclass(frozen=True)
class TeamDesired:
    team_slug: str
    grants: tuple[Grant, ...] = ()

    @property
    def namespace(self) -> str:
        return team_namespace(self.team_slug)

    @property
    def reservation_ids(self) -> list[int]:
        return sorted({g.reservation_id for g in self.grants})

    @property
    def node_names(self) -> list[str]:
        return sorted({g.node_name for g in self.grants})

    @property
    def gpu_uuids(self) -> list[str]:
        return sorted({g.gpu_uuid for g in self.grants})


@dataclass(frozen=True)
class PoolDesired:
    """A pool's GPUs on this cluster and how they are shared (drives node config on Kubernetes)."""

    pool_slug: str
    sharing_mode: str
    sharing_config: dict = field(default_factory=dict)
    node_names: tuple[str, ...] = ()
    # The GPU models (Gpu.model_name) of its GPUs on this cluster: a named MIG layout's
    # profiles depend on the model (all-balanced is 1g.10gb, 2g.20gb and 3g.40gb instances on an
    # H100, 1g.18gb, 2g.35gb and 3g.71gb on an H200).
    gpu_models: tuple[str, ...] = ()
    # A dynamic MIG pool's layout now, per GPU: (node, GPU index, model, the profiles its current grants
    # hold). Its nodes get a mig-parted config of their own (empty for a pool with a fixed layout).
    mig_gpus: tuple[tuple[str, int, str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class ClusterDesired:
    cluster_id: int
    cluster_slug: str
    kind: str  # "kubernetes" | "baremetal"
    teams: tuple[TeamDesired, ...] = ()  # every team with a quota on a pool of this cluster, holding or not
    pools: tuple[PoolDesired, ...] = ()

    def team(self, slug: str) -> TeamDesired:
        for team in self.teams:
            if team.team_slug == slug:
                return team
        return TeamDesired(team_slug=slug)
