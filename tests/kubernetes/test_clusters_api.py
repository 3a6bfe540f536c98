"""Registering a Kubernetes cluster: the kubeconfig is checked, stored encrypted and never shown back."""
from __future__ import annotations

import pytest
import yaml
from cryptography.fernet import Fernet
from django.db import connection

from common import crypto
from inventory.kubernetes.discovery import discover_cluster
from inventory.models import Cluster
from tests.factories import UserFactory
from tests.kubernetes.conftest import unique


@pytest.fixture
def staff(db):
    return UserFactory(username="cluster-admin", is_staff=True, is_superuser=True)


def _raw_columns(cluster_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM inventory_cluster WHERE id = %s", [cluster_id])
        return " ".join(str(value) for value in cursor.fetchone())


def test_register_with_a_kubeconfig_stores_it_encrypted_and_never_shows_it(staff, api, control_plane, core):
    name = unique("east")
    response = api(staff).post("/api/v1/clusters/", {"name": name, "kind": "kubernetes",
                                                     "kubeconfig": control_plane.kubeconfig}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert "kubeconfig" not in body and "kubeconfig_encrypted" not in body
    assert body["slug"] == name and body["has_credentials"] is True
    cluster = Cluster.objects.get(pk=body["id"])
    raw = _raw_columns(cluster.pk)
    assert control_plane.token not in raw and "certificate-authority-data" not in raw
    assert crypto.decrypt(cluster.kubeconfig_encrypted) == control_plane.kubeconfig
    for url in ("/api/v1/clusters/", f"/api/v1/clusters/{cluster.pk}/"):
        text = api(staff).get(url).content.decode()
        assert control_plane.token not in text and "kubeconfig_encrypted" not in text
    # Usable: discovery connects with it.
    discover_cluster(cluster)
    # The admin's change form does not show it either.
    from django.test import Client

    browser = Client()
    browser.force_login(staff)
    page = browser.get(f"/admin/inventory/cluster/{cluster.pk}/change/")
    assert page.status_code == 200
    assert control_plane.token not in page.content.decode()
    assert cluster.kubeconfig_encrypted not in page.content.decode()


def test_an_explicit_encryption_key_is_used_and_rotation_keeps_old_values_readable(settings, db):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.FIELD_ENCRYPTION_KEYS = [old]
    token = crypto.encrypt("secret kubeconfig")
    assert Fernet(old.encode()).decrypt(token.encode()) == b"secret kubeconfig"
    settings.FIELD_ENCRYPTION_KEYS = [new, old]
    assert crypto.decrypt(token) == "secret kubeconfig"
    settings.FIELD_ENCRYPTION_KEYS = [new]
    with pytest.raises(crypto.DecryptionFailed):
        crypto.decrypt(token)


@pytest.mark.parametrize(("kubeconfig", "rule"), [
    ("   \n", "required"),
    ("clusters: [", "invalid_yaml"),
    ("- just\n- a list\n", "invalid_yaml"),
    ("apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts: []\n", "no_current_context"),
    ("current-context: nope\ncontexts: []\n", "unknown_context"),
])
def test_a_bad_kubeconfig_is_a_400_naming_the_field(staff, api, kubeconfig, rule):
    response = api(staff).post("/api/v1/clusters/", {"name": unique("bad"), "kind": "kubernetes",
                                                     "kubeconfig": kubeconfig}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["errors"][0]
    assert (error["field"], error["rule"]) == ("kubeconfig", rule)
    assert not Cluster.objects.filter(kind="kubernetes").exists()


def test_kubeconfigs_that_read_files_or_run_programs_are_refused(staff, api, control_plane):
    config = yaml.safe_load(control_plane.kubeconfig)
    config["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "sh"}}
    response = api(staff).post("/api/v1/clusters/", {"name": unique("exec"), "kind": "kubernetes",
                                                     "kubeconfig": yaml.safe_dump(config)}, format="json")
    assert response.status_code == 400 and response.json()["errors"][0]["rule"] == "auth_plugin"
    config = yaml.safe_load(control_plane.kubeconfig)
    config["clusters"][0]["cluster"]["certificate-authority"] = "/etc/passwd"
    response = api(staff).post("/api/v1/clusters/", {"name": unique("file"), "kind": "kubernetes",
                                                     "kubeconfig": yaml.safe_dump(config)}, format="json")
    assert response.status_code == 400 and response.json()["errors"][0]["rule"] == "file_reference"


def test_in_cluster_credentials_and_the_combinations_refused(staff, api, control_plane, member_user):
    client = api(staff)
    response = client.post("/api/v1/clusters/", {"name": unique("incluster"), "kind": "kubernetes",
                                                 "in_cluster": True}, format="json")
    assert response.status_code == 201 and response.json()["has_credentials"] is True
    both = client.post("/api/v1/clusters/", {"name": unique("both"), "kind": "kubernetes", "in_cluster": True,
                                             "kubeconfig": control_plane.kubeconfig}, format="json")
    assert both.status_code == 400 and both.json()["errors"][0]["field"] == "kubeconfig"
    metal = client.post("/api/v1/clusters/", {"name": unique("metal"), "kind": "baremetal",
                                              "kubeconfig": control_plane.kubeconfig}, format="json")
    assert metal.status_code == 400 and metal.json()["errors"][0]["rule"] == "not_kubernetes"
    denied = api(member_user).post("/api/v1/clusters/", {"name": unique("nope"), "kind": "kubernetes",
                                                         "kubeconfig": control_plane.kubeconfig}, format="json")
    assert denied.status_code == 403


def test_replacing_and_removing_the_kubeconfig(staff, api, control_plane):
    client = api(staff)
    created = client.post("/api/v1/clusters/", {"name": unique("swap"), "kind": "kubernetes"}, format="json")
    assert created.status_code == 201 and created.json()["has_credentials"] is False
    url = f"/api/v1/clusters/{created.json()['id']}/"
    patched = client.patch(url, {"kubeconfig": control_plane.kubeconfig}, format="json")
    assert patched.status_code == 200 and patched.json()["has_credentials"] is True
    bad = client.patch(url, {"kubeconfig": "current-context: x"}, format="json")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "kubeconfig"
    removed = client.patch(url, {"kubeconfig": ""}, format="json")
    assert removed.status_code == 200 and removed.json()["has_credentials"] is False


@pytest.fixture
def member_user(db):
    return UserFactory(username="cluster-member")


def test_the_admin_form_takes_a_kubeconfig_write_only(staff, control_plane):
    from django.test import Client

    browser = Client()
    browser.force_login(staff)
    name = unique("admin")
    form = {"name": name, "slug": name, "kind": "kubernetes", "description": "", "kubeconfig": control_plane.kubeconfig}
    response = browser.post("/admin/inventory/cluster/add/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    cluster = Cluster.objects.get(slug=name)
    assert crypto.decrypt(cluster.kubeconfig_encrypted) == control_plane.kubeconfig
    page = browser.get(f"/admin/inventory/cluster/{cluster.pk}/change/").content.decode()
    assert control_plane.token not in page
    # Saving without pasting one keeps the stored kubeconfig.
    browser.post(f"/admin/inventory/cluster/{cluster.pk}/change/", {**form, "kubeconfig": ""})
    cluster.refresh_from_db()
    assert crypto.decrypt(cluster.kubeconfig_encrypted) == control_plane.kubeconfig
    bad = browser.post("/admin/inventory/cluster/add/", {**form, "name": "m2", "slug": "m2", "kind": "baremetal"})
    assert bad.status_code == 200 and "Only Kubernetes clusters take a kubeconfig." in bad.content.decode()
    broken = browser.post("/admin/inventory/cluster/add/", {**form, "name": "m3", "slug": "m3",
                                                            "kubeconfig": "current-context: x"})
    assert broken.status_code == 200 and "kubeconfig:" in broken.content.decode()
