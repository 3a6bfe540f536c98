"""Inputs at the edges of the fleet API are refused with a 4xx naming the field and the rule, and
nothing is written. Each of these was a 500 before (found by probing the review)."""
from __future__ import annotations

import pytest

from inventory.models import Cluster, Node

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://k8s.example:6443"}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def _rules(response) -> list[tuple[str, str]]:
    return [(e["field"], e["rule"]) for e in response.json()["errors"]]


@pytest.mark.parametrize("kubeconfig, rule", [
    ("[" * 5000, "invalid_yaml"),  # PyYAML recursed past Python's limit
    ("current-context: [1]\ncontexts: []", "unknown_context"),  # a list is no dict key
    ("current-context: {a: b}\ncontexts: []", "unknown_context"),
    ("contexts: [{name: x, context: oops}]\ncurrent-context: x", "invalid"),
    ("contexts: [{name: x, context: {cluster: [1], user: u}}]\ncurrent-context: x", "unknown_cluster"),
    ("contexts: [{name: x, context: {cluster: c, user: [1]}}]\ncurrent-context: x\nclusters: [{name: c}]",
     "unknown_user"),
    (KUBECONFIG.replace('{server: "https://k8s.example:6443"}', "oops"), "invalid"),
    (KUBECONFIG.replace("{token: abc}", "[1, 2]"), "invalid"),
    (KUBECONFIG.replace("{token: abc}", "oops"), "invalid"),
])
def test_a_kubeconfig_of_the_wrong_shape_is_a_400(world, api, kubeconfig, rule):
    response = api(world.staff).post("/api/v1/clusters/", {"name": "k8s", "kind": "kubernetes",
                                                           "kubeconfig": kubeconfig}, format="json")
    assert response.status_code == 400, response.content
    assert ("kubeconfig", rule) in _rules(response)
    assert not Cluster.objects.filter(name="k8s").exists()


def test_a_well_formed_kubeconfig_is_still_taken(world, api):
    response = api(world.staff).post("/api/v1/clusters/", {"name": "k8s", "kind": "kubernetes",
                                                           "kubeconfig": KUBECONFIG}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["has_credentials"] is True


@pytest.mark.parametrize("labels", [{"a\x00": "b"}, {"a": "b\x00"}])
def test_a_nul_byte_in_a_nodes_labels_is_a_400(world, api, labels):
    # PostgreSQL's jsonb refuses \u0000 in any string.
    response = api(world.staff).post("/api/v1/nodes/", {"cluster": "lab", "name": "node-z", "labels": labels},
                                     format="json")
    assert response.status_code == 400, response.content
    assert ("labels", "null_characters_not_allowed") in _rules(response)
    assert not Node.objects.filter(name="node-z").exists()
