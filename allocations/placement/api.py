"""The seam the portal calls: ``place(state, request)`` -> :class:`Placement` or :class:`Unplaceable`."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from .arrays import ClusterArrays
from .engine import ScoreCache, decide
from .mig import MIG_GEOMETRY
from .policies import DEFAULT_POLICY, get_policy
from .policies.base import Policy, PolicyContext
from .reasons import Reason, diagnose, quota_reason
from .requests import Kind, PlacementRequest
from .state import ClusterState, Holding
from .timeline import WholeGpuState
from .workload import WorkloadProfile, demand_for


@dataclass(frozen=True)
class GpuAssignment:
    gpu_id: Hashable
    index: int
    milli: int  # 1000 for a whole GPU; the compute share for MIG
    memory_mib: int
    mig_profile: str | None = None
    mig_start: int | None = None


@dataclass(frozen=True)
class Placement:
    node_id: Hashable
    gpus: tuple[GpuAssignment, ...]
    cpu_milli: int
    memory_mib: int
    start: float
    end: float
    policy: str
    score: float

    ok = True

    def holdings(self, reservation_id: Hashable | None = None, team: str | None = None) -> list[Holding]:
        """The holdings this placement adds (CPU and memory ride on the first one)."""
        if not self.gpus:
            return [
                Holding(
                    self.node_id,
                    self.start,
                    self.end,
                    cpu_milli=self.cpu_milli,
                    memory_mib=self.memory_mib,
                    reservation_id=reservation_id,
                    team=team,
                )
            ]
        out = []
        for k, g in enumerate(self.gpus):
            out.append(
                Holding(
                    self.node_id,
                    self.start,
                    self.end,
                    gpu_id=g.gpu_id,
                    milli=g.milli if g.mig_profile is None else 0,
                    gpu_memory_mib=g.memory_mib if g.mig_profile is None else 0,
                    mig_profile=g.mig_profile,
                    mig_start=g.mig_start,
                    cpu_milli=self.cpu_milli if k == 0 else 0,
                    memory_mib=self.memory_mib if k == 0 else 0,
                    reservation_id=reservation_id,
                    team=team,
                )
            )
        return out


@dataclass(frozen=True)
class Unplaceable:
    reasons: tuple[Reason, ...]

    ok = False

    @property
    def code(self) -> str:
        return self.reasons[0].code

    @property
    def message(self) -> str:
        return self.reasons[0].message

    @property
    def codes(self) -> list[str]:
        return [r.code for r in self.reasons]


Decision = Placement | Unplaceable


def requested_gpus(request: PlacementRequest) -> float:
    """GPU-equivalents a request counts against quota."""
    kind = request.kind
    if kind is Kind.WHOLE:
        return float(request.gpus)
    if kind is Kind.FRACTION:
        return (request.milli or 0) / 1000.0
    if kind is Kind.MIG:
        return demand_for(request).milli / 1000.0
    return 0.0


def _invalid(request: PlacementRequest) -> Reason | None:
    if request.kind is Kind.MIG:
        known = any(request.mig_profile in profiles for profiles in MIG_GEOMETRY.values())
        if not known:
            return Reason("invalid_request", f"{request.mig_profile!r} is not a MIG profile of any supported GPU.")
    return None


def place(
    state: ClusterState,
    request: PlacementRequest,
    policy: str = DEFAULT_POLICY,
    *,
    profile: WorkloadProfile | None = None,
    seed: int = 0,
) -> Decision:
    """Where ``request`` goes for its window, or why it cannot go anywhere.

    Ties between equally scored nodes go to the node listed first in ``state.nodes``.
    ``profile`` describes the usual work (defaults to :meth:`WorkloadProfile.default`);
    ``seed`` only matters for the ``random`` policy.
    """
    ctx = PolicyContext(rng=np.random.default_rng(seed), profile=profile or WorkloadProfile.default())
    return _place(state, request, state.arrays_for_window, get_policy(policy), ctx)


def _place(
    state: ClusterState,
    request: PlacementRequest,
    arrays_for: Callable[[float, float], ClusterArrays],
    pol: Policy,
    ctx: PolicyContext,
    cache: ScoreCache | None = None,
) -> Decision:
    """place()'s decision, with the window's arrays from ``arrays_for`` and the policy's scores through ``cache``
    where the caller keeps one (:class:`WindowPlacer`)."""
    invalid = _invalid(request)
    if invalid is not None:
        return Unplaceable((invalid,))
    pre: list[Reason] = []
    if request.quota_gpus_remaining is not None:
        needed = requested_gpus(request)
        if needed > request.quota_gpus_remaining + 1e-9:
            pre.append(quota_reason(needed, request.quota_gpus_remaining))
    start, end = request.window
    arrays = arrays_for(start, end)
    demand = demand_for(request)
    label_mask = state.label_mask(request.node_labels)
    choice = decide(arrays, demand, pol, ctx, label_mask=label_mask, cache=cache)
    if choice is None:
        return Unplaceable(tuple(pre + diagnose(arrays, demand, label_mask)))
    if pre:
        return Unplaceable(tuple(pre))
    node = state.nodes[choice.node]
    gpus = state.sorted_gpus(node)
    assignments = []
    for slot in choice.slots:
        gpu = gpus[slot]
        if request.kind is Kind.MIG:
            assignments.append(GpuAssignment(gpu.id, gpu.index, demand.milli, 0, request.mig_profile, choice.mig_start))
        else:
            assignments.append(GpuAssignment(gpu.id, gpu.index, demand.milli, request.gpu_memory_mib))
    return Placement(
        node_id=node.id,
        gpus=tuple(assignments),
        cpu_milli=request.cpu_milli,
        memory_mib=request.memory_mib,
        start=start,
        end=end,
        policy=pol.name,
        score=choice.score,
    )


class WindowPlacer:
    """place() in one :class:`WholeGpuState`, window after window, with the same answers: the window's arrays
    are kept and only the rows of nodes whose holdings in it changed are written again
    (:meth:`WholeGpuState.window_arrays`), and each policy keeps one instance (its prepared terms) and a
    :class:`ScoreCache`, so a decision rescores only those rows. A queue plan places hundreds of requests
    in windows of one pool one after the other; between two of them a couple of its thousand nodes change,
    and place() built and scored them all every time. Book in the state between calls as the plan does."""

    def __init__(self, state: WholeGpuState) -> None:
        self.state = state
        self._policies: dict[str, tuple[Policy, ScoreCache]] = {}
        self._ctx: PolicyContext | None = None

    def place(
        self, request: PlacementRequest, policy: str = DEFAULT_POLICY, *, profile: WorkloadProfile | None = None
    ) -> Decision:
        """place(state, request, policy, profile=profile)'s answer (its seed 0)."""
        profile = profile or WorkloadProfile.default()
        if self._ctx is None or self._ctx.profile is not profile:
            # A cached score was made under the profile it was asked with (portal's terms come from it): another
            # profile starts the caches afresh.
            self._ctx = PolicyContext(profile=profile)  # its generator unused: a node-local policy draws nothing
            self._policies = {}
        if policy not in self._policies:
            pol = get_policy(policy)
            self._policies[policy] = (pol, ScoreCache(len(self.state.nodes)))
        pol, cache = self._policies[policy]
        if not pol.node_local:
            # It draws random numbers: a fresh generator seeded as place() seeds it, and no cached scores.
            ctx = PolicyContext(rng=np.random.default_rng(0), profile=profile)
            return _place(self.state, request, self.state.window_arrays, pol, ctx)
        return _place(self.state, request, self.state.window_arrays, pol, self._ctx, cache)


def explain(state: ClusterState, request: PlacementRequest) -> list[Reason]:
    """Reasons ``request`` cannot be placed now ([] if it can); never places anything."""
    decision = place(state, request, "first_fit")
    return [] if decision.ok else list(decision.reasons)  # type: ignore[union-attr]


def place_many(
    state: ClusterState,
    requests: Sequence[PlacementRequest],
    policy: str = DEFAULT_POLICY,
    *,
    profile: WorkloadProfile | None = None,
) -> tuple[list[Decision], ClusterState]:
    """Place requests one after another, each seeing the ones before it; returns the new state."""
    decisions: list[Decision] = []
    for k, request in enumerate(requests):
        decision = place(state, request, policy, profile=profile)
        decisions.append(decision)
        if isinstance(decision, Placement):
            state = state.with_holdings(decision.holdings(reservation_id=("batch", k), team=request.team))
    return decisions, state


def earliest_start(
    state: ClusterState,
    request: PlacementRequest,
    policy: str = DEFAULT_POLICY,
    *,
    profile: WorkloadProfile | None = None,
    not_after: float = math.inf,
) -> Placement | None:
    """The earliest window of the request's length, starting at its ``start`` or when some
    holding ends, in which it can be placed (None if none before ``not_after``)."""
    start, end = request.window
    length = end - start
    candidates: Iterable[float] = [start, *state.boundaries_after(start)]
    for t in candidates:
        if t > not_after:
            break
        moved = replace(request, start=t, end=t + length)
        decision = place(state, moved, policy, profile=profile)
        if isinstance(decision, Placement):
            return decision
        if any(
            r.code
            in ("invalid_request", "over_quota", "no_gpu_model", "too_large", "no_matching_nodes", "no_mig_profile")
            for r in decision.reasons
        ):
            return None  # waiting will not help
    return None
