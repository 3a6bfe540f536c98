"""Placement policies, selectable by name (see each module for what it does)."""

from __future__ import annotations

from .base import Evaluation, Policy, PolicyContext
from .best_fit import BestFitPolicy
from .clustering import ClusteringPolicy
from .dot_product import DotProductPolicy
from .fgd import FgdPolicy
from .first_fit import FirstFitPolicy
from .packing import PackingPolicy
from .portal import PortalPolicy
from .random_fit import RandomPolicy
from .spread import SpreadPolicy

_CLASSES: tuple[type[Policy], ...] = (
    RandomPolicy,
    FirstFitPolicy,
    BestFitPolicy,
    SpreadPolicy,
    PackingPolicy,
    DotProductPolicy,
    ClusteringPolicy,
    FgdPolicy,
    PortalPolicy,
)
POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in _CLASSES}
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}") from None


DEFAULT_POLICY = PortalPolicy.name

__all__ = ["DEFAULT_POLICY", "Evaluation", "Policy", "PolicyContext", "POLICIES", "POLICY_NAMES", "get_policy"]
