"""GPU placement engine: which node and GPUs a reservation gets, or why it cannot get any.

Pure Python + NumPy; imports nothing from Django or the rest of the project. The portal's
reservation service calls it through one function, :func:`place`.

Calling it
----------
Build the pool from the database as plain dataclasses, describe the request, ask::

    from allocations.placement import (
        ClusterState, NodeInfo, GpuInfo, Holding, PlacementRequest, place,
    )

    state = ClusterState(
        nodes=[
            NodeInfo(id=7, cpu_milli=96_000, memory_mib=786_432, labels={"zone": "a"},
                     gpus=(GpuInfo(id=70, index=0, model="A100-SXM4-80GB", memory_mib=81_920,
                                   mig_capable=True), ...)),
            ...
        ],
        holdings=[  # every live allocation, past its start or in the future
            Holding(node_id=7, gpu_id=70, milli=1000, start=t0, end=t1, cpu_milli=8000,
                    memory_mib=65_536, reservation_id=12, team="vision"),
            Holding(node_id=7, gpu_id=71, mig_profile="3g.40gb", mig_start=4, start=t0, end=t2),
            ...
        ],
    )
    decision = place(state, PlacementRequest(gpus=4, cpu_milli=32_000, memory_mib=262_144,
                                             allowed_models={"A100-SXM4-80GB"},
                                             start=t0, end=t3, team="vision",
                                             quota_gpus_remaining=6))
    if decision.ok:        # Placement
        decision.node_id, [(g.gpu_id, g.milli, g.memory_mib, g.mig_profile, g.mig_start)
                           for g in decision.gpus]
        new_holdings = decision.holdings(reservation_id=..., team=...)
    else:                  # Unplaceable
        decision.code      # e.g. "fragmented"
        decision.message   # "5 GPUs are free in total but no node has 4 free (the most on one node is 3)."
        decision.reasons   # every Reason(code, message, details), most fundamental first

Request kinds (:class:`PlacementRequest`): ``gpus=n`` whole GPUs on one node; ``milli=1..999``
of one GPU (with optional ``gpu_memory_mib``); ``mig_profile="2g.20gb"`` on a MIG-capable
A100-40GB/A100-80GB/H100-80GB/H200 with real start-slice geometry (:mod:`.mig`); or none of
these for CPU-only work. Plus ``cpu_milli``, ``memory_mib``, ``allowed_models`` (empty =
any), ``min_gpu_memory_mib``, ``node_labels`` (all must match), the window
``start``/``end`` (floats in seconds or datetimes; ``[start, end)``), and optionally
``quota_gpus_remaining`` (GPU-equivalents the team may still take; a fraction counts
milli/1000, a MIG slice its compute share).

Time windows: a request gets only what is free for its *whole* window: capacity minus
the peak concurrent use of the holdings that overlap it (:mod:`.state`). Holdings that end
before the window starts or start after it ends do not matter; future reservations block
exactly the windows they overlap.

Stable API (semantic versioning of this package starts here):

* :func:`place` (state, request, policy="portal", *, profile=None, seed=0) -> Placement | Unplaceable
* :func:`place_many` (state, requests, policy, *, profile) -> (decisions, new_state): one after another
* :func:`earliest_start` (state, request, policy, *, profile, not_after) -> Placement | None:
  the first start (the request's own, or when a holding ends) at which it fits
* :func:`explain` (state, request) -> list[Reason]: why it does not fit ([] if it does)
* data: :class:`ClusterState`, :class:`NodeInfo`, :class:`GpuInfo`, :class:`Holding`,
  :class:`PlacementRequest`, :class:`Placement`, :class:`GpuAssignment`, :class:`Unplaceable`,
  :class:`Reason`, :class:`WorkloadProfile`
* :data:`POLICY_NAMES`: ``random, first_fit, best_fit, spread, packing, dot_product,
  clustering, fgd, portal`` (default ``portal``)
* reason codes: see :mod:`.reasons`
* queue ordering and backfill for requests that must wait: :mod:`.queueing`

The default policy, ``portal``, is FGD's fragmentation gradient descent (place where the
expected GPU capacity typical work cannot use grows least, ties to the first node) plus two
costs FGD does not see: GPUs a node's CPU or memory can no longer feed (so CPU-hungry work
goes to CPU-rich nodes before GPUs get stranded), and remnants no common request size can
fill (so 320 milli goes next to a 650 rather than into the 530 a second 470 would fill).
On Alibaba's trace it leaves 3.96% of GPUs unallocated where FGD leaves 4.79%; details and
measurements in :mod:`.policies.portal`.

``profile`` (:class:`WorkloadProfile`) tells the fragmentation-aware policies (``fgd``,
``portal``) what work usually looks like; build it from recent reservations with
``WorkloadProfile.from_requests(...)``. Without one a neutral mix of whole GPUs, halves and
quarters is assumed.

Ties between equally good nodes go to the node listed first in ``state.nodes``, so list
nodes in a stable order (e.g. by id): a fixed order is what keeps the packing policies
filling the same nodes first.

Internals (also used by ``benchmarks/placement.py``): :mod:`.arrays` (free capacity as NumPy
arrays), :mod:`.feasibility`, :mod:`.fragmentation` (the FGD measure), :mod:`.policies`,
:mod:`.engine` (filter, score, tie-break; :class:`~.engine.Placer` for many decisions in a
row with a per-shape score cache).
"""

from __future__ import annotations

from .api import Decision, GpuAssignment, Placement, Unplaceable, earliest_start, explain, place, place_many
from .policies import DEFAULT_POLICY, POLICY_NAMES, get_policy
from .reasons import Reason
from .requests import InvalidRequest, Kind, PlacementRequest
from .state import ClusterState, GpuInfo, Holding, InvalidState, NodeInfo
from .workload import WorkloadProfile

__all__ = [
    "ClusterState",
    "Decision",
    "DEFAULT_POLICY",
    "GpuAssignment",
    "GpuInfo",
    "Holding",
    "InvalidRequest",
    "InvalidState",
    "Kind",
    "NodeInfo",
    "Placement",
    "PlacementRequest",
    "POLICY_NAMES",
    "Reason",
    "Unplaceable",
    "WorkloadProfile",
    "earliest_start",
    "explain",
    "get_policy",
    "place",
    "place_many",
]
