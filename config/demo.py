"""Demo data for the embedded mode: a bare-metal cluster, four pools (whole H100s, whole L40Ss, A100 MIG slices,
time-sliced L4s) with GPU model weights, two teams with quotas, users.

Loaded once, on first start, into an empty database.
"""
from __future__ import annotations

import secrets
import uuid

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.db import transaction

from allocations.models import Quota
from inventory.models import Cluster, Gpu, GpuModel, GpuPool, Node
from teams.models import Membership, Team

H100 = ("NVIDIA H100 80GB HBM3", 81559)
L40S = ("NVIDIA L40S", 46068)
A100 = ("NVIDIA A100-SXM4-80GB", 81920)
L4 = ("NVIDIA L4", 23034)


def _gpu_uuid(node: str, index: int) -> str:
    # Deterministic per demo host and index, in NVML's GPU-<uuid> form.
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.demo.gpupool/{index}')}"


ADMIN = {"username": "admin", "email": "admin@localhost"}


def check_admin_password(password: str) -> None:
    """Django's password validators (AUTH_PASSWORD_VALIDATORS) on the demo admin's chosen password:
    the demo's admin is a superuser on a server anyone on the network may reach.
    Raises django.core.exceptions.ValidationError with every reason."""
    validate_password(password, get_user_model()(**ADMIN))


@transaction.atomic
def load_demo(admin_password: str | None = None) -> dict[str, str]:
    """Create the demo fleet and accounts; returns {username: password} for the ones created.
    A chosen admin password must pass the password validators (check_admin_password)."""
    User = get_user_model()
    if admin_password is not None:
        check_admin_password(admin_password)
    cluster = Cluster.objects.create(name="Lab bare metal", slug="lab", kind=Cluster.Kind.BAREMETAL,
                                     description="Demo hosts (simulated GPUs)")
    h100 = GpuPool.objects.create(name="H100 80GB", slug="h100", sharing_mode="exclusive",
                                  description="Whole H100 GPUs for training")
    l40s = GpuPool.objects.create(name="L40S", slug="l40s", sharing_mode="exclusive",
                                  description="Whole L40S GPUs for inference and notebooks")
    a100_mig = GpuPool.objects.create(
        name="A100 MIG slices", slug="a100-mig", sharing_mode="mig",
        sharing_config={"mig_layout": "all-balanced"},
        description="A100 80GB cards carved into MIG instances (2 × 1g.10gb, 2g.20gb, 3g.40gb each): notebooks, "
                    "CI and small fine-tunes")
    l4_shared = GpuPool.objects.create(
        name="L4 shared", slug="l4-shared", sharing_mode="time_slicing", sharing_config={"replicas": 4},
        description="L4 GPUs time-sliced 4 ways for light inference (no memory isolation between tenants)")
    for host, (model, memory), pool, count in [
        ("gpu-h100-01", H100, h100, 8), ("gpu-h100-02", H100, h100, 8), ("gpu-l40s-01", L40S, l40s, 4),
        ("gpu-a100-01", A100, a100_mig, 4), ("gpu-l4-01", L4, l4_shared, 4),
    ]:
        node = Node.objects.create(cluster=cluster, name=host, cpu_milli=192000, memory_mib=2048 * 1024,
                                   labels={"nvidia.com/gpu.product": model.replace(" ", "-")})
        Gpu.objects.bulk_create(
            Gpu(node=node, pool=pool, index=i, uuid=_gpu_uuid(host, i), model_name=model, memory_mib=memory,
                mig_capable=pool in (h100, a100_mig), driver_version="550.90.07", cuda_version="12.4")
            for i in range(count)
        )

    vision = Team.objects.create(slug="vision", name="Vision")
    nlp = Team.objects.create(slug="nlp", name="NLP")
    Quota.objects.create(team=vision, pool=h100, max_ge=8, ge_hours_per_month=2000)
    Quota.objects.create(team=vision, pool=l40s, max_ge=2)
    Quota.objects.create(team=nlp, pool=h100, max_ge=12)
    Quota.objects.create(team=nlp, pool=l40s, max_ge=4, ge_hours_per_month=500)
    Quota.objects.create(team=vision, pool=a100_mig, max_ge=1.5)
    Quota.objects.create(team=nlp, pool=a100_mig, max_ge="1.2")
    Quota.objects.create(team=vision, pool=l4_shared, max_ge=1)
    Quota.objects.create(team=nlp, pool=l4_shared, max_ge="0.5", ge_hours_per_month=100)
    # What a whole card of each model counts against quotas, in GPU-equivalents (an H100 is the unit).
    for model, weight in ((H100[0], "1.0"), (A100[0], "0.6"), (L40S[0], "0.35"), (L4[0], "0.2")):
        GpuModel.objects.create(name=model, weight=weight)

    created: dict[str, str] = {}
    admin_password = admin_password or secrets.token_urlsafe(12)
    User.objects.create_superuser(ADMIN["username"], ADMIN["email"], admin_password)
    created["admin"] = admin_password
    for username, team, role in [("alice", vision, Membership.Role.MANAGER), ("bob", vision, Membership.Role.MEMBER),
                                 ("carol", nlp, Membership.Role.MANAGER)]:
        password = secrets.token_urlsafe(9)
        user = User.objects.create_user(username, f"{username}@localhost", password)
        Membership.objects.create(user=user, team=team, role=role)
        created[username] = password
    return created
