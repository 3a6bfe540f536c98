"""Kubernetes admission webhooks (AdmissionReview admission.k8s.io/v1) that pin team pods to their GPUs.

- ``mutate-pods``: a pod created in a team namespace (``team_namespace(slug)``) that asks
  for a GPU resource gets a required node affinity (``kubernetes.io/hostname`` In the
  nodes of the team's current grants for that resource) and, on HAMi (vgpu) pools, the
  ``nvidia.com/use-gpuuuid`` annotation with the reserved GPUs' UUIDs (only real NVIDIA
  UUIDs; the made-up ids of discovered nodes are never handed to HAMi). An existing
  affinity is narrowed, not replaced: our expression is added to every node selector term.
  Pods without GPU requests, and pods outside team namespaces, pass untouched.
- ``validate-pods``: refuses a pod that asks for more of a GPU resource (sum over its
  containers, or its largest init container) than the team holds on the cluster now, in the
  mode's unit (whole GPUs, shares ``nvidia.com/gpu.shared``, MIG instances
  ``nvidia.com/mig-<profile>``, HAMi vGPU devices with memory and cores counted once per device,
  and no more memory or cores per device than the team holds on one GPU), naming both amounts:
  "pod asks for 3 nvidia.com/mig-3g.40gb; team vision holds 2 nvidia.com/mig-3g.40gb".

Routes (``config/urls.py``): ``/webhooks/kubernetes/{mutate,validate}-pods/[<cluster>/[<token>/]]``.
The cluster slug in the path limits the grants to that cluster (several clusters may
call one portal); without it every Kubernetes cluster's grants count.

Authentication: the API server is the only caller and sends no session or CSRF token, so
the views are CSRF-exempt and ignore sessions. When ``KUBE_WEBHOOK_TOKEN`` is set, a call
must carry it, either as ``Authorization: Bearer <token>`` (the API server sends that when
its AdmissionConfiguration kubeconfig names the token) or as the last path segment (for
managed clusters where the API server's flags cannot be changed; webhook URLs cannot carry
query strings). Unset, the routes are open and must be protected at the ingress (mTLS with
the API server's client certificate, or a network policy).
"""
from __future__ import annotations

import base64
import json
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from django.utils.translation import gettext as _

from allocations.apply import selectors
from allocations.apply.backends.kubernetes_manifests import (
    GPU,
    HAMI_CORES,
    HAMI_MEMORY,
    grant_resources,
    team_totals,
)
from allocations.apply.desired import RESERVATIONS_ANNOTATION, Grant
from common.secrets import bearer_token, same_secret
from inventory.kubernetes.nodes import is_real_gpu_uuid, parse_quantity
from inventory.models import Cluster

ADMISSION_API_VERSION = "admission.k8s.io/v1"
HOSTNAME_LABEL = "kubernetes.io/hostname"
HAMI_UUID_ANNOTATION = "nvidia.com/use-gpuuuid"
GPU_RESOURCE_PREFIX = "nvidia.com/"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


class BadReview(Exception):
    pass


# --- pure helpers --------------------------------------------------------------------------------

def _container_amounts(container: dict[str, Any]) -> dict[str, int]:
    """A container's GPU resources: its request, or its limit when it gives no request (extended
    resources may be set through limits alone)."""
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    out = {}
    for name in set(requests) | set(limits):
        if name.startswith(GPU_RESOURCE_PREFIX):
            out[name] = int(parse_quantity(requests.get(name, limits.get(name))))
    return out


def _in_held_units(amounts: dict[str, int]) -> dict[str, int]:
    """A container's amounts in the unit the team's holdings are counted in.

    HAMi's ``nvidia.com/gpumem`` and ``nvidia.com/gpucores`` are per device: a container asking
    ``gpu: 2, gpumem: 2000`` takes 2000 MiB on each of two GPUs, 4000 in all, as HAMi's quota
    counts it (one device when it names no ``nvidia.com/gpu``, as HAMi assumes)."""
    devices = amounts.get(GPU, 1) or 1
    return {name: amount * devices if name in (HAMI_MEMORY, HAMI_CORES) else amount
            for name, amount in amounts.items()}


def _effective(pod: dict[str, Any], each) -> dict[str, int]:
    """Sum over the regular containers, or the largest init container if more (they run one at a time,
    before the others: Kubernetes' effective request)."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, amount in each(container).items():
            total[name] = total.get(name, 0) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in each(container).items():
            total[name] = max(total.get(name, 0), amount)
    return {name: amount for name, amount in total.items() if amount > 0}


def pod_gpu_requests(pod: dict[str, Any]) -> dict[str, int]:
    """GPU resources a pod asks for, as written: the sum over its containers, or its largest init container if more."""
    return _effective(pod, _container_amounts)


def pod_gpu_demand(pod: dict[str, Any]) -> dict[str, int]:
    """What a pod takes of each GPU resource in the unit a team holds it: as written, except HAMi's
    memory and cores, which count once per device the container gets."""
    return _effective(pod, lambda container: _in_held_units(_container_amounts(container)))


def pod_per_device(pod: dict[str, Any]) -> list[tuple[int, dict[str, int]]]:
    """Each container's ask of HAMi's memory and cores per device, with the number of devices it asks for."""
    out = []
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        amounts = _container_amounts(container)
        each = {name: amounts[name] for name in (HAMI_MEMORY, HAMI_CORES) if amounts.get(name, 0) > 0}
        if each:
            out.append((max(amounts.get(GPU, 1), 1), each))
    return out


def refusal(team_slug: str, asked: dict[str, int], per_device: list[tuple[int, dict[str, int]]],
            grants: tuple[Grant, ...]) -> str | None:
    """Why a pod that asks for `asked` (pod_gpu_demand) is more than the team's `grants`, or None.

    Each amount is compared with what the team holds of that resource in its mode's unit
    (GPUs, shares, MIG instances of the profile, vGPU devices, MiB and percent summed over
    devices). A HAMi container asking m MiB (or c %) on each of n GPUs also needs n vgpu grants
    of at least that much each (`per_device`, from pod_per_device)."""
    held = team_totals(grants)
    for name, amount in sorted(asked.items()):
        if amount > held.get(name, 0):
            return f"pod asks for {amount} {name}; team {team_slug} holds {held.get(name, 0)} {name}"
    devices = [grant_resources(g) for g in grants if g.sharing_mode == "vgpu"]
    for count, each in per_device:
        for name, amount in sorted(each.items()):
            enough = sum(1 for d in devices if d.get(name, 0) >= amount)
            if enough < count:
                return (f"pod asks for {amount} {name} on each of {count} GPU{'s' if count != 1 else ''}; "
                        f"team {team_slug} holds that much on {enough}")
    return None


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def affinity_patch(spec: dict[str, Any], hostnames: list[str]) -> list[dict[str, Any]]:
    """JSONPatch operations that require the pod to run on one of `hostnames`, keeping its own affinity."""
    expression = {"key": HOSTNAME_LABEL, "operator": "In", "values": sorted(hostnames)}
    required_value = {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}
    affinity = spec.get("affinity")
    if not affinity:
        return [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {REQUIRED: required_value}}}]
    node_affinity = affinity.get("nodeAffinity")
    if not node_affinity:
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {REQUIRED: required_value}}]
    required = node_affinity.get(REQUIRED) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return [{"op": "add", "path": f"/spec/affinity/nodeAffinity/{REQUIRED}", "value": required_value}]
    ops = []
    base = f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms"
    for index, term in enumerate(terms):
        expressions = term.get("matchExpressions")
        if expressions is None and not term.get("matchFields"):
            continue  # an empty term matches no node; narrowing it must not make it match ours
        if expressions and expression in expressions:
            continue  # already pinned (reinvocation)
        if expressions is None:
            ops.append({"op": "add", "path": f"{base}/{index}/matchExpressions", "value": [expression]})
        else:
            ops.append({"op": "add", "path": f"{base}/{index}/matchExpressions/-", "value": expression})
    return ops


def annotation_patch(metadata: dict[str, Any], annotations: dict[str, str]) -> list[dict[str, Any]]:
    existing = metadata.get("annotations")
    if existing is None:
        return [{"op": "add", "path": "/metadata/annotations", "value": dict(annotations)}]
    return [{"op": "add", "path": f"/metadata/annotations/{_escape(key)}", "value": value}
            for key, value in annotations.items() if existing.get(key) != value]


def relevant_grants(grants: tuple[Grant, ...], asked: dict[str, int]) -> list[Grant]:
    """The grants that back the resources the pod asks for (all of them if none match).

    A pod naming HAMi's memory or cores is a vGPU pod: only vgpu grants back it, not whole GPUs
    that also count as ``nvidia.com/gpu``."""
    if HAMI_MEMORY in asked or HAMI_CORES in asked:
        hami = [g for g in grants if g.sharing_mode == "vgpu"]
        if hami:
            return hami
    matching = [g for g in grants if set(grant_resources(g)) & set(asked)]
    return matching or list(grants)


# --- the views -------------------------------------------------------------------------------------

def _authorized(request: HttpRequest, token: str | None) -> bool:
    expected = settings.KUBE_WEBHOOK_TOKEN
    if not expected:
        return True
    given = bearer_token(request)
    return same_secret((token or "") if given is None else given, expected)


def _read_review(request: HttpRequest) -> dict[str, Any]:
    try:
        review = json.loads(request.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadReview("the body is not JSON") from exc
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise BadReview("the body is not an AdmissionReview")
    if review.get("apiVersion") != ADMISSION_API_VERSION:
        raise BadReview(f"only {ADMISSION_API_VERSION} AdmissionReviews are served "
                        "(set admissionReviewVersions: [v1])")
    body = review.get("request")
    if not isinstance(body, dict) or not isinstance(body.get("uid"), str):
        raise BadReview("the AdmissionReview has no request.uid")
    return body


def _answer(uid: str, *, allowed: bool = True, patch: list[dict[str, Any]] | None = None,
            message: str = "", code: int = 403) -> JsonResponse:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if not allowed:
        response["status"] = {"code": code, "reason": "Forbidden", "message": message}
    return JsonResponse({"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response})


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"detail": message, "errors": [{"field": "body", "rule": "invalid", "message": message}]},
                        status=status)


def _handle(request: HttpRequest, cluster: str | None, token: str | None, decide) -> JsonResponse:
    if not _authorized(request, token):
        return _error(401, "missing or wrong webhook token")
    cluster_row = None
    if cluster is not None:
        cluster_row = Cluster.objects.filter(slug=cluster, kind=Cluster.Kind.KUBERNETES).first()
        if cluster_row is None:
            return _error(404, f"no Kubernetes cluster {cluster!r} is registered")
    try:
        body = _read_review(request)
    except BadReview as exc:
        return _error(400, str(exc))
    uid = body["uid"]
    kind = (body.get("kind") or {}).get("kind")
    pod = body.get("object")
    if kind != "Pod" or body.get("operation") != "CREATE" or not isinstance(pod, dict) or body.get("subResource"):
        return _answer(uid)
    namespace = body.get("namespace") or (pod.get("metadata") or {}).get("namespace") or ""
    team_slug = selectors.team_slug_for_namespace(namespace)
    if team_slug is None:
        return _answer(uid)
    asked = pod_gpu_demand(pod)
    if not asked:
        return _answer(uid)
    grants, hostnames = selectors.team_grants(team_slug, cluster=cluster_row)
    return decide(uid, pod, team_slug, asked, grants, hostnames)


def _mutate(uid, pod, team_slug, asked, grants, hostnames) -> JsonResponse:
    grants = relevant_grants(grants, asked)
    if not grants:
        return _answer(uid)  # holds nothing: the validating webhook (and the quota) refuse it
    patch = affinity_patch(pod.get("spec") or {}, sorted({hostnames[g.node_name] for g in grants}))
    annotations = {RESERVATIONS_ANNOTATION: ",".join(str(r) for r in sorted({g.reservation_id for g in grants}))}
    uuids = sorted({g.gpu_uuid for g in grants if g.sharing_mode == "vgpu" and is_real_gpu_uuid(g.gpu_uuid)})
    if uuids:
        annotations[HAMI_UUID_ANNOTATION] = ",".join(uuids)
    patch += annotation_patch(pod.get("metadata") or {}, annotations)
    return _answer(uid, patch=patch)


def _validate(uid, pod, team_slug, asked, grants, hostnames) -> JsonResponse:
    why = refusal(team_slug, asked, pod_per_device(pod), grants)
    if why is None:
        return _answer(uid)
    reservations = ", ".join(f"#{r}" for r in sorted({g.reservation_id for g in grants})) or "none"
    return _answer(uid, allowed=False, message=_(
        "GPU Pool Portal: %(why)s on this cluster now (active reservations: %(reservations)s). Reserve more in the "
        "portal, or ask for less.") % {"why": why, "reservations": reservations})


@csrf_exempt
@require_POST
def mutate_pods(request: HttpRequest, cluster: str | None = None, token: str | None = None) -> JsonResponse:
    return _handle(request, cluster, token, _mutate)


@csrf_exempt
@require_POST
def validate_pods(request: HttpRequest, cluster: str | None = None, token: str | None = None) -> JsonResponse:
    return _handle(request, cluster, token, _validate)


# The trailing slash is optional: kube-apiserver drops it from a webhook URL's path (and
# follows Django's APPEND_SLASH redirect as a GET, which would be refused).
_TAIL = r"(?:/(?P<cluster>[-a-zA-Z0-9_]+))?(?:/(?P<token>[^/]+))?/?$"
urlpatterns = [
    re_path(r"^mutate-pods" + _TAIL, mutate_pods, name="kube-mutate-pods"),
    re_path(r"^validate-pods" + _TAIL, validate_pods, name="kube-validate-pods"),
]
