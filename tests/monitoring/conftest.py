"""Telemetry fixtures: the `world` fleet with a host token for node-a, and helpers to build agent batches."""
from __future__ import annotations

import itertools
import time

import pytest
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


@pytest.fixture
def asgi_server(worker_env, tmp_path):
    """The real ASGI app under uvicorn (2 workers, Redis channel layer) on this test's database; yields its URL."""
    import socket
    import subprocess
    import sys

    import httpx

    from tests.conftest import BASE_DIR

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp_path / "uvicorn.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "portal.asgi:application", "--host", "127.0.0.1", "--port", str(port),
             "--workers", "2", "--lifespan", "off", "--log-level", "warning"],
            # Its own process group: the workers are stopped with the supervisor, never orphaned
            # (an orphan keeps connections to the test database, which then cannot be dropped).
            env=worker_env, cwd=BASE_DIR, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail("uvicorn did not start:\n" + log_path.read_text()[-3000:])
        time.sleep(0.2)
    process.log_path = log_path
    yield url
    from tests.conftest import stop_process_group

    stop_process_group(process)
