"""Live telemetry of Kubernetes GPUs (monitoring.kubernetes) end to end: a real Prometheus scraping the DCGM
exporter stand-in (tests/kubernetes/dcgm_standin.py, the one stand-in), the real control plane holding the
nodes, namespaces and (bound, never running) pods the exporter's labels name, and the portal reading either
through the one ingest: WebSocket groups, history, attribution, idle and "without a reservation" alerts
mailed through a real SMTP server, and a Prometheus that goes away and comes back."""
from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from kubernetes.client.exceptions import ApiException
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing.websocket import WebsocketCommunicator
from django.test import Client
from django.utils import timezone

from allocations.apply.desired import team_namespace
from allocations.models import Allocation
from allocations.services import ReservationRequest, reservation_activate, reservation_create
from config.asgi import application
from inventory import services as inventory_services
from inventory.kubernetes.discovery import discover_cluster
from inventory.models import Cluster, Gpu, GpuPool, Node
from monitoring import kubernetes as kube_telemetry
from monitoring.alerts import alerts_evaluate
from monitoring.models import Alert, AlertRule, ClusterTelemetry, Sample
from monitoring.selectors import usage
from teams.models import Team
from teams.services import api_token_create
from tests.factories import MembershipFactory, QuotaFactory, TeamFactory, UserFactory
from tests.kubernetes.conftest import make_gpu_node, unique
from tests.kubernetes.dcgm_standin import DcgmStandIn, SimGpu
from tests.kubernetes.prometheus_server import PrometheusServer, free_port

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def standin():
    server = DcgmStandIn([]).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def prometheus(standin):
    """One real Prometheus for the module, scraping the stand-in every second."""
    server = PrometheusServer([f"127.0.0.1:{standin.port}"], scrape_interval="1s").start()
    yield server
    server.cleanup()


def _pod(core, namespace: str, name: str, node: str, labels: dict | None = None, containers: list | None = None) -> None:
    """A pod bound to `node` (no kubelet here: it never runs), asking for one GPU. A new namespace's default
    service account comes a moment after the namespace (the API server says to retry): retried for 20 s."""
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": containers or [{"name": "main", "image": "registry.example/train:1",
                                                   "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    deadline = time.monotonic() + 20
    while True:
        try:
            core.create_namespaced_pod(namespace, body)
            return
        except ApiException as exc:
            if exc.status != 500 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture
def fleet(kube_cluster, core, standin, prometheus):
    """A discovered 2-GPU node; team `owner` holds GPU `held` (its pod runs there), team `other` has a pod
    on the other GPU without a reservation; the exporter also reports a GPU the inventory lacks."""
    node = unique("gpu-node")
    uuids = [f"GPU-{unique('a')}-{i}" for i in range(2)]
    make_gpu_node(core, node, gpus=2, annotations={"gpupool.io/gpu-uuids": ",".join(uuids)})
    discover_cluster(kube_cluster)
    node_row = Node.objects.get(cluster=kube_cluster, name=node)
    pool = Gpu.objects.get(uuid=uuids[0]).pool
    owner, other = TeamFactory(slug=unique("vision")), TeamFactory(slug=unique("speech"))
    member, manager = UserFactory(username=unique("member")), UserFactory(username=unique("mgr"))
    MembershipFactory(user=member, team=owner, role="manager")
    MembershipFactory(user=manager, team=other, role="manager")
    QuotaFactory(team=owner, pool=pool, max_ge=2)
    reservation = reservation_create(actor=member, request=ReservationRequest(
        team=owner.slug, pool=pool.slug, gpus=1, ends_at=timezone.now() + timedelta(hours=1)))
    assert reservation_activate(reservation_id=reservation.pk)
    held = Allocation.objects.get(reservation=reservation).gpu
    free = Gpu.objects.exclude(pk=held.pk).get(node=node_row)
    for team in (owner, other):
        namespace = team_namespace(team.slug)
        core.create_namespace({"metadata": {"name": namespace}})
    _pod(core, team_namespace(owner.slug), "train-0", node)
    _pod(core, team_namespace(other.slug), "sneaky-0", node)
    ghost = f"GPU-{unique('ghost')}"
    standin.gpus = [
        SimGpu(held.uuid, node, held.index, [(team_namespace(owner.slug), "train-0", "main")], util=80),
        SimGpu(free.uuid, node, free.index, [(team_namespace(other.slug), "sneaky-0", "main")], util=30),
        SimGpu(ghost, "ghost-node", 0, util=10),
    ]
    prometheus.wait_for_series(f'DCGM_FI_DEV_GPU_UTIL{{UUID="{ghost}"}}', 1)
    staff = UserFactory(username=unique("staff"), is_staff=True, email=f"{unique('ops')}@example.test")
    return type("Fleet", (), {"cluster": kube_cluster, "node": node_row, "held": held, "free": free, "ghost": ghost,
                              "owner": owner, "other": other, "member": member, "manager": manager, "staff": staff,
                              "reservation": reservation, "pool": pool, "standin": standin,
                              "prometheus_url": prometheus.url})


def _use(fleet, source: str, **fields):
    return inventory_services.cluster_update(actor=fleet.staff, cluster=fleet.cluster, telemetry_source=source,
                                             **fields)


def _listen_while(read, paths: list[tuple[str, object]]) -> list[dict]:
    """Join each WebSocket path (with its user's token), run `read` and return the first telemetry
    message each socket got."""
    headers = []
    for _, user in paths:
        _, key = api_token_create(user=user)
        headers.append([(b"authorization", f"Token {key}".encode())])

    async def run():
        sockets = []
        for (path, _), header in zip(paths, headers):
            communicator = WebsocketCommunicator(application, path, headers=header)
            connected, _ = await communicator.connect(timeout=5)
            assert connected, path
            assert json.loads(await communicator.receive_from(timeout=5))["type"] == "hello"
            sockets.append(communicator)
        await sync_to_async(read)()
        got = []
        for communicator in sockets:
            while True:
                message = json.loads(await communicator.receive_from(timeout=5))
                if message["type"] == "telemetry.samples":
                    got.append(message)
                    break
            await communicator.disconnect()
        return got

    return async_to_sync(run)()


def test_prometheus_source_reaches_websocket_history_and_attributes_pods(fleet, settings):
    settings.METRICS_PUBLIC = True
    cluster = _use(fleet, "prometheus", prometheus_url=fleet.prometheus_url)
    first_read = time.monotonic()
    node_msg, team_msg = _listen_while(lambda: kube_telemetry.cluster_telemetry_read(cluster=cluster),
                                       [(f"/ws/nodes/{fleet.node.pk}/", fleet.staff),
                                        (f"/ws/teams/{fleet.owner.slug}/", fleet.member)])
    by_gpu = {s["gpu"]: s for s in node_msg["samples"]}
    assert set(by_gpu) == {fleet.held.pk, fleet.free.pk}  # the ghost GPU is no GPU of ours
    assert by_gpu[fleet.held.pk]["util"] == 80 and by_gpu[fleet.free.pk]["util"] == 30
    assert by_gpu[fleet.held.pk]["mem_total"] == 81559
    assert abs(node_msg["t"] - time.time()) < 10
    # The team's group gets only its GPU, and the pod's memory counts for its reservation.
    (mine,) = team_msg["samples"]
    assert mine["gpu"] == fleet.held.pk
    (share,) = mine["shares"]
    assert share["reservation"] == fleet.reservation.pk and share["used"] == by_gpu[fleet.held.pk]["mem_used"] > 0
    # Allocated vs used (the dashboard's): the team's Kubernetes GPU is allocated and busy.
    (team_use,) = usage(GpuPool.objects.filter(pk=fleet.pool.pk), Team.objects.filter(pk=fleet.owner.pk))[1]
    assert (team_use.allocated, team_use.used, team_use.avg_util) == (1, 1, 80)
    # History: the same samples, in the raw table the rollups read.
    assert set(Sample.objects.filter(gpu_id__in=[fleet.held.pk, fleet.free.pk]).values_list("gpu_id", flat=True)) \
        == {fleet.held.pk, fleet.free.pk}
    status = ClusterTelemetry.objects.get(cluster=cluster)
    assert status.error == "" and status.last_success_at is not None and status.series_read >= 6 * 3
    assert status.gpus_read == 3 and status.samples_ingested == 2 and 0 <= status.lag_seconds < 10
    assert status.unknown_gpus == 1 and status.unknown_examples == [{"uuid": fleet.ghost, "hostname": "ghost-node"}]
    (unleased,) = status.unleased
    assert (unleased["gpu"], unleased["namespace"], unleased["pod"], unleased["team"]) == (
        fleet.free.pk, team_namespace(fleet.other.slug), "sneaky-0", fleet.other.slug)
    # A second read after the next scrape stores the new samples once, and learns the real period.
    # The period is that of the samples stored: Prometheus's 1 s scrapes as far apart as the reads that saw
    # them, so at most the time between the reads plus one scrape (a loaded machine reads later).
    time.sleep(2.2)
    again = kube_telemetry.cluster_telemetry_read(cluster=cluster)
    between_reads = time.monotonic() - first_read
    assert again.samples_ingested == 2 and 0.5 <= again.sample_period_seconds <= between_reads + 1.0
    # A read before the next scrape stores nothing twice.
    assert kube_telemetry.cluster_telemetry_read(cluster=cluster).samples_ingested in (0, 2)
    # Staff see it all on the status page; the node page names the source and the pod.
    client = Client()
    client.force_login(fleet.staff)
    page = client.get("/telemetry/").content.decode()
    assert cluster.slug in page and fleet.ghost in page and "sneaky-0" in page and "prometheus" in page
    metrics = client.get("/metrics").content.decode()
    assert f'gpupool_k8s_telemetry_unknown_gpus{{cluster="{cluster.slug}",source="prometheus"}} 1.0' in metrics
    assert f'gpupool_dcgm_fi_dev_gpu_util{{' in metrics and fleet.held.uuid in metrics
    node_page = client.get(f"/nodes/{fleet.node.pk}/").content.decode()
    assert "its Prometheus" in node_page and "samples" in node_page and "sneaky-0" in node_page


def test_idle_reservation_and_a_pod_without_one_fire_alerts_and_mail_the_teams(fleet, smtp):
    AlertRule.objects.update(enabled=False)
    AlertRule.objects.create(name=unique("idle"), metric="gpu_idle_allocated", scope="gpu", comparison="<=",
                             threshold=1, for_seconds=0, notify_team_managers=True)
    # As the shipped rule (migration 0007), without its minute of patience.
    AlertRule.objects.create(name="Kubernetes GPU busy without a reservation", metric="gpu_unleased", scope="gpu",
                             comparison=">=", threshold=1, for_seconds=0, notify_team_managers=True, notify_staff=True)
    cluster = _use(fleet, "prometheus", prometheus_url=fleet.prometheus_url)
    fleet.standin.set(fleet.held.uuid, util=0)
    time.sleep(2.2)  # a scrape with the idle value
    kube_telemetry.cluster_telemetry_read(cluster=cluster)
    totals = alerts_evaluate()
    assert totals.get("fired") == 2, totals
    idle = Alert.objects.get(rule__metric="gpu_idle_allocated")
    assert idle.state == "firing" and idle.team_id == fleet.owner.pk
    unleased = Alert.objects.get(rule__metric="gpu_unleased")
    assert unleased.state == "firing" and unleased.team_id == fleet.other.pk and "sneaky" not in unleased.subject
    deadline = time.monotonic() + 5
    while len(smtp.messages) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    mails = {m["Subject"]: to for to, m in smtp.messages}
    assert any(fleet.member.email in to for subject, to in mails.items() if "idle" in subject), mails
    assert any(fleet.manager.email in to and fleet.staff.email in to for subject, to in mails.items()
               if "without a reservation" in subject), mails


def test_prometheus_down_marks_the_cluster_silent_alerts_staff_and_recovers(fleet, standin, smtp, tmp_path):  # noqa: F811
    AlertRule.objects.update(enabled=False)
    # The shipped rule (migration 0007; transactional tests empty the table, so made again here).
    AlertRule.objects.create(name="Kubernetes telemetry silent", metric="telemetry_silent", scope="cluster",
                             comparison=">=", threshold=60, for_seconds=0, severity="critical",
                             notify_team_managers=False, notify_staff=True)
    port = free_port()
    own = PrometheusServer([f"127.0.0.1:{standin.port}"], scrape_interval="1s", port=port,
                           directory=tmp_path / "prom").start()
    try:
        own.wait_for_series(f'DCGM_FI_DEV_GPU_UTIL{{UUID="{fleet.held.uuid}"}}', 1)
        cluster = _use(fleet, "prometheus", prometheus_url=own.url)
        assert kube_telemetry.cluster_telemetry_read(cluster=cluster).error == ""
        own.stop()
        status = kube_telemetry.cluster_telemetry_read(cluster=cluster)
        assert "unreachable" in status.error and status.errors_total == 1
        # A minute on: the cluster counts as silent, the default rule fires and staff are mailed.
        ClusterTelemetry.objects.filter(pk=status.pk).update(last_success_at=timezone.now() - timedelta(minutes=2))
        assert alerts_evaluate().get("fired") == 1
        alert = Alert.objects.get(rule__metric="telemetry_silent")
        assert alert.subject == f"cluster:{cluster.pk}" and "unreachable" in alert.subject_label
        client = Client()
        client.force_login(fleet.staff)
        page = client.get("/telemetry/")
        assert page.status_code == 200 and "silent" in page.content.decode()
        assert client.get(f"/nodes/{fleet.node.pk}/").status_code == 200
        assert client.get(f"/pools/{fleet.pool.slug}/").status_code == 200
        # Prometheus comes back: the next read succeeds, the alert resolves with one mail.
        own.start()
        own.wait_for_series(f'DCGM_FI_DEV_GPU_UTIL{{UUID="{fleet.held.uuid}"}}', 1)
        status = kube_telemetry.cluster_telemetry_read(cluster=cluster)
        assert status.error == "" and status.last_success_at > timezone.now() - timedelta(seconds=30)
        deadline = time.monotonic() + 15
        while status.samples_ingested == 0 and time.monotonic() < deadline:  # until its first new scrape
            time.sleep(0.5)
            status = kube_telemetry.cluster_telemetry_read(cluster=cluster)
        assert status.samples_ingested >= 1
        assert alerts_evaluate().get("resolved") == 1
        deadline = time.monotonic() + 5
        while len(smtp.messages) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        subjects = [m["Subject"] for _, m in smtp.messages]
        assert subjects[0].startswith("[FIRING critical] Kubernetes telemetry silent") and \
            subjects[1].startswith("[RESOLVED"), subjects
        assert all(fleet.staff.email in to for to, _ in smtp.messages)
    finally:
        own.cleanup()


def _exporter_pod(core, node: str, address: str) -> tuple[str, str]:
    """A running dcgm-exporter pod on `node` at `address`, in a namespace of its own: (namespace, name). No
    kubelet here: its status is what one would post once it runs."""
    namespace = unique("gpu-operator")
    core.create_namespace({"metadata": {"name": namespace}})
    name = unique("nvidia-dcgm-exporter")
    _pod(core, namespace, name, node, labels={"app": "nvidia-dcgm-exporter"},
         containers=[{"name": "exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5-3.4.0-ubuntu22.04"}])
    core.patch_namespaced_pod_status(name, namespace, {"status": {
        "phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}})
    return namespace, name


def test_exporter_source_reads_the_exporter_pods_through_the_api_server(fleet, core, standin):
    namespace, name = _exporter_pod(core, fleet.node.name, "127.0.0.1")  # the stand-in's address
    cluster = _use(fleet, "exporter", exporter_namespace=namespace, exporter_port=standin.port,
                   telemetry_period_seconds=2)
    (node_msg,) = _listen_while(lambda: kube_telemetry.cluster_telemetry_read(cluster=cluster),
                                [(f"/ws/nodes/{fleet.node.pk}/", fleet.staff)])
    assert {s["gpu"]: s["util"] for s in node_msg["samples"]} == {fleet.held.pk: 80, fleet.free.pk: 30}
    assert Sample.objects.filter(gpu_id=fleet.held.pk).exists()
    status = ClusterTelemetry.objects.get(cluster=cluster)
    assert status.source == "exporter" and status.error == "" and status.unknown_gpus == 1
    assert [u["pod"] for u in status.unleased] == ["sneaky-0"]
    # The beat tick claims the cluster once per period.
    ClusterTelemetry.objects.filter(pk=status.pk).update(next_read_at=timezone.now())
    assert kube_telemetry.clusters_due() == [cluster.pk]
    assert kube_telemetry.clusters_due() == []
    # No exporter pod any more: a clear error, nothing half-written.
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    deadline = time.monotonic() + 10
    while core.list_namespaced_pod(namespace).items and time.monotonic() < deadline:
        time.sleep(0.1)
    failed = kube_telemetry.cluster_telemetry_read(cluster=cluster)
    assert "no running exporter pod" in failed.error and failed.last_success_at == status.last_success_at


def _routable_address() -> str | None:
    """This machine's own non-loopback IPv4 address (the source address of its default route), or None.
    A UDP socket's connect sends nothing; it only picks the route."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def _token_with_the_portals_cluster_role(kube_api, core) -> str:
    """A service account token bound to the ClusterRole deploy/base/rbac.yaml gives the portal (under a
    name of its own), so a test that reads with it shows the shipped role is enough."""
    from pathlib import Path

    import yaml
    from kubernetes import client as k8s

    role = next(d for d in yaml.safe_load_all(Path("deploy/base/rbac.yaml").read_text()) if d["kind"] == "ClusterRole")
    name = unique("gpupool-portal")
    rbac = k8s.RbacAuthorizationV1Api(kube_api)
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": role["rules"]})
    namespace = unique("gpupool")
    core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "portal"}})
    rbac.create_cluster_role_binding({"metadata": {"name": name},
                                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                  "name": name},
                                      "subjects": [{"kind": "ServiceAccount", "name": "portal",
                                                    "namespace": namespace}]})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # 1.20: the token controller fills a Secret for the account
        for secret in core.list_namespaced_secret(namespace).items:
            if (secret.type == "kubernetes.io/service-account-token" and (secret.data or {}).get("token")
                    and (secret.metadata.annotations or {}).get("kubernetes.io/service-account.name") == "portal"):
                import base64

                return base64.b64decode(secret.data["token"]).decode()
        time.sleep(0.1)
    raise AssertionError("no service account token was issued")


def test_exporter_source_through_the_api_servers_pod_proxy(fleet, core, kube_api, control_plane, standin):
    """exporter_via_proxy: the portal never dials the pod; the API server does (GET .../pods/NAME:PORT/proxy/
    metrics), as on a cluster whose pod network the portal cannot reach, with no more rights than the
    shipped ClusterRole gives. The API server refuses to proxy to a loopback address, so the exporter pod's
    address here is this machine's own routable one, where a second stand-in of the same GPUs listens."""
    from common import crypto

    address = _routable_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address for the API server to proxy to")
    token = _token_with_the_portals_cluster_role(kube_api, core)
    Cluster.objects.filter(pk=fleet.cluster.pk).update(
        kubeconfig_encrypted=crypto.encrypt(control_plane.kubeconfig_with(token=token)))
    fleet.cluster.refresh_from_db()
    routable = DcgmStandIn(standin.gpus, host=address).start()
    try:
        namespace, name = _exporter_pod(core, fleet.node.name, address)
        cluster = _use(fleet, "exporter", exporter_namespace=namespace, exporter_port=routable.port,
                       exporter_via_proxy=True, telemetry_period_seconds=2)
        (node_msg,) = _listen_while(lambda: kube_telemetry.cluster_telemetry_read(cluster=cluster),
                                    [(f"/ws/nodes/{fleet.node.pk}/", fleet.staff)])
        assert {s["gpu"]: s["util"] for s in node_msg["samples"]} == {fleet.held.pk: 80, fleet.free.pk: 30}
        status = ClusterTelemetry.objects.get(cluster=cluster)
        assert status.error == "" and status.unknown_gpus == 1 and routable.scrapes >= 1
        assert [u["pod"] for u in status.unleased] == ["sneaky-0"]
        # The exporter stops answering: the API server's proxy error reaches staff in words, nothing is stored.
        routable.stop()
        before = Sample.objects.count()
        failed = kube_telemetry.cluster_telemetry_read(cluster=cluster)
        assert "through the API server's proxy" in failed.error and name in failed.error
        assert failed.last_success_at == status.last_success_at and Sample.objects.count() == before
    finally:
        routable.stop()
