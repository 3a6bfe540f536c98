"""Reads about the fleet that more than one caller needs: GPU models and their weights."""
from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from django.db.models import Count

from inventory.models import DEFAULT_GPU_MODEL_WEIGHT, Gpu, GpuModel, GpuModelWeightChange


@dataclass(frozen=True)
class GpuModelInfo:
    """A GPU model as staff weigh it: its weight (1.0 without a GpuModel row), whether a row sets it,
    how many GPUs of it the inventory holds, and (when asked for) the history of its weight."""

    name: str
    weight: Decimal
    weighted: bool
    gpus: int
    updated_at: object | None = None
    history: list[GpuModelWeightChange] = field(default_factory=list)


def model_weights() -> dict[str, Decimal]:
    """{model name: weight} of the models that have a GpuModel row; any other model weighs
    DEFAULT_GPU_MODEL_WEIGHT (use weight_of)."""
    return dict(GpuModel.objects.values_list("name", "weight"))


def weight_of(weights: dict[str, Decimal], model_name: str) -> Decimal:
    return weights.get(model_name, DEFAULT_GPU_MODEL_WEIGHT)


def gpu_models() -> list[GpuModelInfo]:
    """Every model the inventory holds (distinct Gpu.model_name) and every model with a weight row,
    by name: two queries, however many GPUs."""
    counts = dict(Gpu.objects.order_by().values_list("model_name").annotate(n=Count("id")))
    rows = {row.name: row for row in GpuModel.objects.all()}
    return [_info(name, rows.get(name), counts.get(name, 0)) for name in sorted(counts.keys() | rows.keys())]


def gpu_model(name: str, *, with_history: bool = True) -> GpuModelInfo | None:
    """One model by its exact name, or None when neither the inventory nor a weight row knows it."""
    row = GpuModel.objects.filter(name=name).first()
    count = Gpu.objects.filter(model_name=name).count()
    if row is None and not count:
        return None
    info = _info(name, row, count)
    if with_history:
        info.history.extend(GpuModelWeightChange.objects.filter(name=name).select_related("actor"))
    return info


def _info(name: str, row: GpuModel | None, count: int) -> GpuModelInfo:
    return GpuModelInfo(name=name, weight=row.weight if row else DEFAULT_GPU_MODEL_WEIGHT, weighted=row is not None,
                        gpus=count, updated_at=row.updated_at if row else None)
