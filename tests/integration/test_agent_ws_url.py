"""An agent whose --portal is the WSGI web process (no WebSockets there) opens its lease channel and its
telemetry socket on the ws process named by --ws-url; without it, it says why the channel is refused, keeps to
the HTTP poll and sends its samples over HTTP."""
from __future__ import annotations

import subprocess
import sys

import pytest

from inventory import services as inventory_services
from inventory.models import Gpu, Node
from monitoring.models import Sample
from tests.conftest import BASE_DIR, free_port, healthz_answers, start_server, stop_process_group, wait_for
from tests.factories import ClusterFactory, UserFactory

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_the_lease_channel_goes_to_ws_url_while_http_goes_to_the_web_process(worker_env, tmp_path, request):
    ws = request.getfixturevalue("asgi_server")
    port = free_port()
    web = f"http://127.0.0.1:{port}"
    web_process = start_server([sys.executable, "-m", "config.web", "--host", "127.0.0.1", "--port", str(port)],
                               env=worker_env, log_path=tmp_path / "web.log", what="the web process",
                               ready=healthz_answers(web))
    staff = UserFactory(username="root", is_staff=True)
    cluster = ClusterFactory(slug="lab")
    agents = []
    try:
        for host, extra in (("split", ["--ws-url", ws.replace("http://", "ws://") + "/ws/agent/"]), ("plain", [])):
            _, key = inventory_services.host_token_create(actor=staff, cluster=cluster, host_name=host)
            log = tmp_path / f"{host}.log"
            agents.append((subprocess.Popen(
                [sys.executable, "-m", "agent", "--portal", web, f"--token={key}", "--simulate", "1xL4",
                 "--hostname", host, "--heartbeat", "0.5", "--telemetry-interval", "1",
                 "--state-dir", str(tmp_path / host), *extra],
                cwd=BASE_DIR, stdout=open(log, "wb"), stderr=subprocess.STDOUT), log))
        wait_for(lambda: Node.objects.filter(cluster=cluster).count() == 2, message="both hosts register over HTTP")
        split_log, plain_log = agents[0][1], agents[1][1]
        wait_for(lambda: b"lease channel open" in split_log.read_bytes(), timeout=20, message="channel on --ws-url")
        wait_for(lambda: b"(404): nothing serves WebSockets" in plain_log.read_bytes(), timeout=20,
                 message="the 404 explained")
        assert b"--ws-url" in plain_log.read_bytes()
        # The telemetry socket opens with the first batch, after the lease channel: wait for it.
        wait_for(lambda: b"telemetry: sending over ws://" in split_log.read_bytes(), timeout=20,
                 message="telemetry on the socket beside --ws-url")
        wait_for(lambda: b"telemetry: no WebSocket at" in plain_log.read_bytes(), timeout=20,
                 message="telemetry over HTTP where no socket answers")
        for host in ("split", "plain"):  # samples arrive both ways
            gpus = list(Gpu.objects.filter(node__cluster=cluster, node__name=host).values_list("pk", flat=True))
            wait_for(lambda: Sample.objects.filter(gpu_id__in=gpus).count() >= 2, timeout=20,
                     message=f"samples of {host}")
    finally:
        for process, _ in agents:
            process.kill()
            process.wait()
        stop_process_group(web_process)
