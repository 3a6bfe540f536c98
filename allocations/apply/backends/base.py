"""The contract between the apply lifecycle and a backend.

One method, :meth:`ApplyBackend.sync`: make the cluster match ``desired`` for the named
teams (or for everything the portal manages there when ``teams`` is None, which is the
reconcile: it also removes what should be gone). It must be idempotent: a second call
with the same ``desired`` changes nothing and reports no changes. It reports what it
changed in words an admin understands ("created ResourceQuota gpupool-vision/gpupool
with requests.nvidia.com/gpu=2").

Errors: :class:`BackendPending` and plain :class:`BackendError` are retried with backoff
until the reservation's apply deadline; :class:`BackendRejected` fails the apply at once
(the cluster refused for a reason retrying will not change).
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol

from allocations.apply.desired import ClusterDesired


class BackendError(Exception):
    """The cluster or host could not be reached or answered with an error; worth retrying."""


class BackendPending(BackendError):
    """Accepted but not confirmed yet (e.g. a host agent has not picked up its leases)."""


class BackendRejected(BackendError):
    """The cluster refused the change for a reason retrying will not fix."""


@dataclass
class SyncReport:
    target: str  # what was synced, e.g. "kubernetes cluster lab (namespace gpupool-vision)"
    changes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.changes)


class ApplyBackend(Protocol):
    name: str  # "kubernetes" | "agent"
    # Whether sync reads ``desired.pools`` and the teams that hold nothing (quotas to zero). When
    # not, cluster_desired skips those queries: an apply then reads only the team's grants.
    reads_pools: bool

    def sync(self, desired: ClusterDesired, *, teams: Collection[str] | None = None) -> SyncReport: ...
