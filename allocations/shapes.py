"""A request's amount in its pool's unit: which fields each sharing mode takes, and the booking.Shape they
make, checked against the pool. The create (services) and the availability timeline (selectors) both
read requests through here, so they refuse the same fields with the same rules."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.translation import gettext as _

from allocations import booking
from allocations.placement import mig
from common.errors import FieldError, ValidationFailed
from inventory.models import GpuPool
from inventory.sharing import REPLICA_MODES, SharingMode, mig_dynamic, mig_layout_names


@dataclass(frozen=True)
class Amounts:
    """The amount fields of a request (None: not given); which apply depends on the pool's mode."""

    gpus: int | None = None
    shares: int | None = None
    mig_profile: str | None = None
    count: int | None = None
    gpu_memory_mib: int | None = None
    gpu_memory_pct: int | None = None
    gpu_cores_pct: int | None = None

    def amounts(self) -> dict:
        """The amount fields given, by name."""
        return {name: getattr(self, name) for name in AMOUNT_FIELDS if getattr(self, name) is not None}

    def given(self) -> bool:
        return bool(self.amounts())


AMOUNT_FIELDS = tuple(field.name for field in dataclasses.fields(Amounts))
MAX_GPUS_PER_REQUEST = 1024
# The bounds of the numeric amounts, the same for the API, the reserve form and the availability query (a
# pool's own limits, e.g. shares above its replicas, are shape_for's to check).
AMOUNT_LIMITS = {
    "gpus": {"min_value": 1, "max_value": MAX_GPUS_PER_REQUEST},
    "shares": {"min_value": 1, "max_value": 64},
    "count": {"min_value": 1, "max_value": MAX_GPUS_PER_REQUEST},
    "gpu_memory_mib": {"min_value": 1, "max_value": 2**31 - 1},
    "gpu_memory_pct": {"min_value": 1, "max_value": 100},
    "gpu_cores_pct": {"min_value": 1, "max_value": 100},
}

# The request fields each sharing mode takes (the rest are refused with `not_for_mode`).
MODE_FIELDS = {
    SharingMode.EXCLUSIVE: ("gpus",),
    SharingMode.TIME_SLICING: ("shares",),
    SharingMode.MPS: ("shares",),
    SharingMode.MIG: ("mig_profile", "count"),
    SharingMode.VGPU: ("gpus", "gpu_memory_mib", "gpu_memory_pct", "gpu_cores_pct"),
}
# The field a refusal for lack of room or quota names, per mode.
AMOUNT_FIELD = {SharingMode.EXCLUSIVE: "gpus", SharingMode.TIME_SLICING: "shares", SharingMode.MPS: "shares",
                SharingMode.MIG: "count", SharingMode.VGPU: "gpus"}


# A request names a few models it accepts ("H100 only", "A100 or H100"); a pool has a handful. More than this is a
# mistake (or an attempt to make every create scan a long list), not a need.
MAX_GPU_MODELS = 16
GPU_MODEL_NAME_MAX = 128  # inventory.Gpu.model_name's max_length


def gpu_models_problem(value) -> FieldError | None:
    """What is wrong with a `gpu_models` value as given (before the pool is known), or None: a list of at
    most MAX_GPU_MODELS distinct, non-empty model names. The API's field and the service ask the same."""
    def problem(rule: str, message: str) -> FieldError:
        return FieldError(field="gpu_models", rule=rule, message=message)

    if not isinstance(value, (list, tuple)):
        return problem("not_a_list", _("gpu_models must be a list of GPU model names, e.g. [\"NVIDIA H100 80GB "
                                       "HBM3\"]."))
    for item in value:
        if not isinstance(item, str) or not item.strip() or len(item) > GPU_MODEL_NAME_MAX or "\x00" in item:
            return problem("not_a_string", _("Each entry of gpu_models must be a GPU model name (text of 1 to "
                                             "%(max)d characters); %(item)s is not.")
                           % {"max": GPU_MODEL_NAME_MAX, "item": repr(item)[:60]})
    if len(value) > MAX_GPU_MODELS:
        return problem("max_length", _("gpu_models may name at most %(max)d models; %(count)d given.")
                       % {"max": MAX_GPU_MODELS, "count": len(value)})
    seen: set[str] = set()
    for item in value:
        if item in seen:
            return problem("duplicate", _("gpu_models names %(model)s twice.") % {"model": item})
        seen.add(item)
    return None


def checked_gpu_models(pool: GpuPool, value: Sequence[str] | None, snapshot: booking.PoolSnapshot
                       ) -> tuple[str, ...]:
    """The models a request accepts, sorted (empty: any), checked: 400 `gpu_models` naming the rule for a
    value that is not a list of distinct names (gpu_models_problem), or for a model no GPU of the pool has
    (naming the pool's models)."""
    if not value:
        return ()
    error = gpu_models_problem(value)
    if error is not None:
        raise ValidationFailed(error.message, errors=[error])
    pool_models = sorted({gpu.model for gpu in snapshot.gpus if gpu.model})
    unknown = [model for model in value if model not in pool_models]
    if unknown:
        raise ValidationFailed(_("Pool %(pool)s has no GPU of model %(model)s (its models: %(models)s).")
                               % {"pool": pool.name, "model": unknown[0],
                                  "models": ", ".join(pool_models) or _("none")},
                               field="gpu_models", rule="not_in_pool")
    return tuple(sorted(value))


def shape_for(pool: GpuPool, request: Amounts, snapshot: booking.PoolSnapshot, *,
              gpu_models: Sequence[str] | None = None) -> booking.Shape:
    """The request in the pool's unit, checked against the pool: 400 naming the field and the rule for a
    field that does not belong to the pool's mode, a missing one, or an amount no GPU of the pool
    could ever give. `gpu_models`: the models it accepts (checked_gpu_models); the amounts are then
    checked against the GPUs of those models alone."""
    if gpu_models is None:  # a create's request carries them (services.ReservationRequest); an Amounts does not
        gpu_models = getattr(request, "gpu_models", None)
    models = checked_gpu_models(pool, gpu_models, snapshot)
    shape = _shape_for(pool, request, snapshot.of_models(models), pinned=bool(models))
    return dataclasses.replace(shape, gpu_models=models) if models else shape


def _shape_for(pool: GpuPool, request: Amounts, snapshot: booking.PoolSnapshot, *, pinned: bool) -> booking.Shape:
    mode, config = pool.sharing_mode, pool.sharing_config or {}
    takes = MODE_FIELDS.get(mode, ())
    given = list(request.amounts())
    wrong = [name for name in given if name not in takes]
    if wrong:
        errors = [FieldError(field=name, rule="not_for_mode",
                             message=_("%(field)s does not apply to pool %(pool)s, which shares GPUs by %(mode)s; it "
                                       "takes %(fields)s.") % {"field": name, "pool": pool.name, "mode": mode,
                                                               "fields": " and ".join(takes)})
                  for name in wrong]
        raise ValidationFailed(errors[0].message, errors=errors)
    usable = [gpu for gpu in snapshot.gpus if gpu.usable] or list(snapshot.gpus)

    def required(name: str) -> ValidationFailed:
        return ValidationFailed(_("Pool %(pool)s shares GPUs by %(mode)s: give %(field)s.")
                                % {"pool": pool.name, "mode": mode, "field": name}, field=name, rule="required")

    if mode in REPLICA_MODES:
        if request.shares is None:
            raise required("shares")
        replicas = int(config.get("replicas") or 0)
        if request.shares > replicas:
            raise ValidationFailed(_("Pool %(pool)s offers each GPU as %(replicas)d shares; %(shares)d requested.")
                                   % {"pool": pool.name, "replicas": replicas, "shares": request.shares},
                                   field="shares", rule="max_value")
        return booking.Shape(mode=mode, shares=request.shares, replicas=replicas)
    if mode == SharingMode.MIG:
        if not request.mig_profile:
            raise required("mig_profile")
        layout = mig_layout_names(config)
        dynamic = mig_dynamic(config)
        offered = {profile.name for profile in booking.layout_profiles({gpu.model for gpu in usable}, layout,
                                                                       dynamic=dynamic)}
        if request.mig_profile not in offered:
            known = set().union(*(mig.profiles_for(gpu.model) for gpu in usable)) if usable else set()
            rule = "not_in_layout" if request.mig_profile in known else "unknown_profile"
            text = (_("'%(profile)s' is not in the layout of pool %(pool)s (it offers %(offered)s).")
                    if rule == "not_in_layout" else
                    _("'%(profile)s' is not a MIG profile of the GPUs of pool %(pool)s (it offers %(offered)s)."))
            raise ValidationFailed(text % {"profile": request.mig_profile, "pool": pool.name,
                                           "offered": ", ".join(sorted(offered)) or _("none")},
                                   field="mig_profile", rule=rule)
        return booking.Shape(mode=mode, mig_profile=request.mig_profile, mig_count=request.count or 1,
                             mig_layout=layout, mig_dynamic=dynamic)
    if mode == SharingMode.VGPU:
        if request.gpu_memory_mib is not None and request.gpu_memory_pct is not None:
            raise ValidationFailed(_("Give gpu_memory_mib or gpu_memory_pct, not both."), field="gpu_memory_pct",
                                   rule="exclusive_with")
        memory_mib = request.gpu_memory_mib
        memory_pct = request.gpu_memory_pct
        if memory_mib is None and memory_pct is None:
            memory_mib = config.get("default_memory_mib")
            if memory_mib is None:
                raise required("gpu_memory_mib or gpu_memory_pct")
        largest = max((gpu.memory_mib for gpu in usable), default=0)
        if memory_mib is not None and memory_mib > largest:
            raise ValidationFailed(_("%(mib)d MiB is more than the memory of any GPU of pool %(pool)s (%(largest)d MiB).")
                                   % {"mib": memory_mib, "pool": pool.name, "largest": largest},
                                   field="gpu_memory_mib", rule="exceeds_gpu_memory")
        cores = request.gpu_cores_pct or config.get("default_cores_pct")
        if cores is None:
            # A share of the memory gets the same share of the cores, so it counts as it is used.
            share = memory_pct if memory_pct is not None else 100 * memory_mib / max(largest, 1)
            cores = max(1, min(100, math.ceil(share)))
        return booking.Shape(mode=mode, gpus=request.gpus or 1, memory_mib=memory_mib or 0,
                             memory_pct=memory_pct or 0, cores_pct=int(cores))
    if request.gpus is None:
        raise required("gpus")
    if request.gpus > len(snapshot.gpus):
        words = (_("Pool %(pool)s has %(count)d GPUs of the models in gpu_models; %(gpus)d requested.") if pinned
                 else _("Pool %(pool)s has %(count)d GPUs; %(gpus)d requested."))
        raise ValidationFailed(words % {"pool": pool.name, "count": len(snapshot.gpus), "gpus": request.gpus},
                               field="gpus", rule="exceeds_pool_size")
    return booking.Shape(mode=SharingMode.EXCLUSIVE, gpus=request.gpus)
