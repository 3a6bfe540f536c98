"""A cluster's telemetry settings through the API: checked together (4xx naming the field and the rule),
the Prometheus credential stored encrypted, never shown back, and sent as the source expects."""
from __future__ import annotations

import base64
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection

from common import crypto
from inventory.models import Cluster
from monitoring import kubernetes as kube_telemetry
from tests.factories import ClusterFactory, UserFactory
from tests.kubernetes.conftest import unique


@pytest.fixture
def staff(db):
    return UserFactory(username=unique("ops"), is_staff=True)


@pytest.fixture
def cluster(db):
    return ClusterFactory(slug=unique("k8s"), kind=Cluster.Kind.KUBERNETES)


def _patch(api, staff, cluster, body):
    return api(staff).patch(f"/api/v1/clusters/{cluster.pk}/", body, format="json")


@pytest.mark.parametrize("body, field, rule", [
    ({"telemetry_source": "prometheus"}, "prometheus_url", "required"),
    ({"telemetry_source": "exporter"}, "telemetry_source", "no_credentials"),
    ({"telemetry_source": "grafana"}, "telemetry_source", "invalid_choice"),
    ({"telemetry_source": "prometheus", "prometheus_url": "ftp://prom:9090"}, "prometheus_url", "invalid"),
    ({"telemetry_period_seconds": 0.1}, "telemetry_period_seconds", "min_value"),
    ({"telemetry_period_seconds": 3600}, "telemetry_period_seconds", "max_value"),
    ({"prometheus_auth": {"bearer_token": "t", "username": "u", "password": "p"}}, "prometheus_auth", "exclusive"),
    ({"prometheus_auth": {"username": "u"}}, "prometheus_auth", "incomplete"),
    ({"prometheus_auth": {"token": "t"}}, "prometheus_auth", "unknown_field"),
    ({"exporter_port": 70000}, "exporter_port", "range"),
    ({"telemetry_source": "prometheus", "prometheus_url": "http://prometheus-server:9090?x=1"}, "prometheus_url",
     "invalid"),
])
def test_bad_telemetry_settings_are_refused_naming_the_field(api, staff, cluster, body, field, rule):
    response = _patch(api, staff, cluster, body)
    assert response.status_code == 400, response.content
    text = response.content.decode()
    assert field in text and rule in text, text
    fresh = Cluster.objects.get(pk=cluster.pk)
    assert fresh.telemetry_source == "none" and fresh.prometheus_auth_encrypted == ""  # nothing half-written


def test_a_bare_metal_cluster_takes_no_telemetry_source(api, staff, db):
    hosts = ClusterFactory(slug=unique("hosts"), kind=Cluster.Kind.BAREMETAL)
    response = _patch(api, staff, hosts, {"telemetry_source": "prometheus", "prometheus_url": "http://prometheus-server:9090"})
    assert response.status_code == 400 and "not_kubernetes" in response.content.decode()


def test_members_cannot_change_telemetry_settings(api, cluster, db):
    member = UserFactory(username=unique("member"))
    response = _patch(api, member, cluster, {"telemetry_source": "none"})
    assert response.status_code in (403, 404)


class _Recorder(BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):  # noqa: N802
        type(self).seen.append(self.headers.get("Authorization"))
        body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("auth, header", [
    ({"bearer_token": "s3cret-token"}, "Bearer s3cret-token"),
    ({"username": "reader", "password": "pa55"}, "Basic " + base64.b64encode(b"reader:pa55").decode()),
])
def test_prometheus_credentials_are_stored_encrypted_never_shown_and_sent(api, staff, cluster, auth, header):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Recorder.seen = []
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        response = _patch(api, staff, cluster, {"telemetry_source": "prometheus", "prometheus_url": url,
                                                "prometheus_auth": auth, "telemetry_period_seconds": 10})
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["has_prometheus_auth"] is True and "prometheus_auth" not in body
        secret = next(v for v in auth.values() if v != "reader")
        for text in (response.content.decode(), api(staff).get(f"/api/v1/clusters/{cluster.pk}/").content.decode()):
            assert secret not in text
        with connection.cursor() as cursor:
            cursor.execute("SELECT prometheus_auth_encrypted FROM inventory_cluster WHERE id = %s", [cluster.pk])
            stored = cursor.fetchone()[0]
        assert secret not in stored and secret in crypto.decrypt(stored)
        status = kube_telemetry.cluster_telemetry_read(cluster=Cluster.objects.get(pk=cluster.pk))
        assert status.error == "" and status.series_read == 0
        assert _Recorder.seen and set(_Recorder.seen) == {header}
        # {} removes the credential.
        assert _patch(api, staff, cluster, {"prometheus_auth": {}}).json()["has_prometheus_auth"] is False
    finally:
        server.shutdown()
        server.server_close()


def test_an_answer_that_is_not_prometheus_is_a_clear_error(staff, cluster):
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("NotProm", (BaseHTTPRequestHandler,), {
        "do_GET": lambda self: (self.send_response(200), self.send_header("Content-Length", "5"), self.end_headers(),
                                self.wfile.write(b"hello")),
        "log_message": lambda self, *a: None}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cluster.telemetry_source, cluster.prometheus_url = "prometheus", f"http://127.0.0.1:{server.server_address[1]}"
        cluster.save()
        status = kube_telemetry.cluster_telemetry_read(cluster=cluster)
        assert "not its JSON API" in status.error and status.last_success_at is None
    finally:
        server.shutdown()
        server.server_close()


def test_the_admin_form_sets_the_source_by_the_same_rules(db):
    from django.test import Client

    admin = UserFactory(username=unique("root"), is_staff=True, is_superuser=True)
    cluster = ClusterFactory(slug=unique("k8s"), kind=Cluster.Kind.KUBERNETES)
    browser = Client()
    browser.force_login(admin)
    url = f"/admin/inventory/cluster/{cluster.pk}/change/"
    assert browser.get(url).status_code == 200
    form = {"name": cluster.name, "slug": cluster.slug, "kind": "kubernetes", "description": "",
            "telemetry_source": "prometheus", "prometheus_url": "", "exporter_selector": "app=nvidia-dcgm-exporter",
            "exporter_namespace": "", "exporter_port": 9400, "telemetry_period_seconds": 5}
    refused = browser.post(url, form)
    assert refused.status_code == 200 and "needs prometheus_url" in refused.content.decode()
    saved = browser.post(url, {**form, "prometheus_url": "http://prometheus-server.monitoring:9090",
                               "prometheus_bearer_token": "admin-s3cret"})
    assert saved.status_code == 302, saved.content.decode()[-2000:]
    cluster.refresh_from_db()
    assert cluster.telemetry_source == "prometheus" and "admin-s3cret" in crypto.decrypt(cluster.prometheus_auth_encrypted)
    assert "admin-s3cret" not in browser.get(url).content.decode()
