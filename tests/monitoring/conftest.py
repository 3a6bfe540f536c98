"""Telemetry fixtures: the `world` fleet with a host token for node-a, and helpers to build agent batches."""
from __future__ import annotations

import itertools
import time
from urllib.parse import urlsplit

import pytest
import redis.connection
from django.conf import settings
from rest_framework.test import APIClient

from inventory import services as inventory_services
from inventory.models import Gpu, Node

_seq = itertools.count(1)


def sample(gpu_uuid: str, util: float = 50, **overrides) -> dict:
    values = {"uuid": gpu_uuid, "utilization_gpu_pct": util, "utilization_memory_pct": util / 2,
              "memory_used_mib": 40000, "memory_total_mib": 81559, "temperature_c": 60, "power_w": 350.0,
              "processes": [{"pid": 4242, "used_memory_mib": 40000}]}
    values.update(overrides)
    return values


def batch(samples: list[dict], t: float | None = None, seq: int | None = None) -> dict:
    return {"seq": next(_seq) if seq is None else seq, "t": time.time() if t is None else t, "gpus": samples}


def payload(*batches: dict, stream: str = "test-stream") -> dict:
    return {"stream": stream, "batches": list(batches)}


def installation_url(db: int) -> str:
    """The suite's Redis URL on another database number: what a second portal sharing this Redis uses."""
    return urlsplit(settings.REDIS_URL)._replace(path=f"/{db}", query="").geturl()


def other_db() -> int:
    """A database of the suite's Redis that the suite does not use (15, or 14 when the suite is on 15)."""
    return 14 if redis.connection.parse_url(settings.REDIS_URL).get("db", 0) == 15 else 15


@pytest.fixture
def host(world):
    """node-a of the world's a100 pool, its token and an agent API client."""
    node = Node.objects.get(name="node-a")
    token, key = inventory_services.host_token_create(actor=world.staff, cluster=node.cluster, host_name=node.name)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Host {key}")
    gpus = list(Gpu.objects.filter(node=node).order_by("index"))
    return type("Host", (), {"node": node, "token": token, "key": key, "client": client, "gpus": gpus,
                             "uuids": [g.uuid for g in gpus]})


def post(host, body) -> object:
    return host.client.post("/api/v1/agent/telemetry/", body, format="json")
