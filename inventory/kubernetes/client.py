"""API clients for registered clusters, kubeconfig checks, and one error type for every failure.

``api_client(cluster)`` builds a :class:`kubernetes.client.ApiClient` from the cluster's
decrypted kubeconfig (or the in-cluster service account); nothing is read from or written
to ``~/.kube``. Every call goes through :func:`call`, which adds a request timeout and turns
what can go wrong (unreachable server, TLS failure, 401/403, 4xx/5xx answers) into a
:class:`ClusterError` saying whether retrying can help.
"""
from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import urllib3
import yaml
from django.conf import settings
from django.utils.translation import gettext as _
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import load_incluster_config
from kubernetes.config.kube_config import new_client_from_config_dict

from common.errors import ApplicationError, ValidationFailed
from common import crypto

T = TypeVar("T")

# Keys that make the kubeconfig read files or run programs on the portal's machines: an
# uploaded kubeconfig must carry its credentials inline (…-data, token) instead.
_FILE_KEYS = {"certificate-authority", "client-certificate", "client-key", "tokenFile"}
_PLUGIN_KEYS = {"exec", "auth-provider"}


class ClusterError(Exception):
    """A Kubernetes API call failed. ``retryable``: a later attempt may succeed (network, 5xx, 409, 429)."""

    def __init__(self, message: str, *, kind: str, status: int | None = None, retryable: bool) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind  # unreachable | tls | unauthorized | forbidden | not_found | conflict | invalid | server | credentials
        self.status = status
        self.retryable = retryable


class ClusterUnavailable(ApplicationError):
    """The portal's answer when a cluster it had to ask failed: 503 unreachable, 502 it answered with an error."""

    status = 502


def as_application_error(cluster_name: str, error: ClusterError) -> ApplicationError:
    # The cluster's own words (error.message: what the API server or the connection said) stay as they came.
    exc = ClusterUnavailable(_("Kubernetes cluster %(cluster)s: %(error)s") % {"cluster": cluster_name,
                                                                              "error": error.message},
                             field="cluster", rule=f"cluster_{error.kind}")
    exc.status = 503 if error.kind == "unreachable" else 502
    return exc


def parse_kubeconfig(text: Any) -> dict:
    """The kubeconfig as a dict, checked enough to be usable; ValidationFailed naming `kubeconfig` if not."""

    def bad(message: str, rule: str = "invalid") -> ValidationFailed:
        """`message`: the whole sentence, "kubeconfig: …" included (translated as one)."""
        return ValidationFailed(message, field="kubeconfig", rule=rule)

    if not isinstance(text, str) or not text.strip():
        raise bad(_("kubeconfig: must be a non-empty kubeconfig YAML document."), "required")
    if len(text) > 256 * 1024:
        raise bad(_("kubeconfig: is larger than 256 KiB."), "max_length")
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise bad(_("kubeconfig: is not valid YAML (%(error)s).") % {"error": str(exc).splitlines()[0]},
                  "invalid_yaml") from exc
    except RecursionError as exc:  # PyYAML recurses once per nesting level: "[[[[…" 256 KiB deep
        raise bad(_("kubeconfig: is nested too deeply."), "invalid_yaml") from exc
    if not isinstance(config, dict):
        raise bad(_("kubeconfig: must be a YAML mapping (apiVersion: v1, kind: Config, ...)."), "invalid_yaml")

    def named(section: str) -> dict[str, dict]:
        entries = config.get(section) or []
        if not isinstance(entries, list):
            raise bad(_("kubeconfig: %(section)s must be a list.") % {"section": section})
        out = {}
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise bad(_("kubeconfig: every entry of %(section)s needs a name.") % {"section": section})
            out[entry["name"]] = entry
        return out

    def mapping(entry: dict, key: str, what: str) -> dict:
        # Any YAML can stand where a mapping belongs (a string, a list): each one is checked before it
        # is read, or a .get() or a lookup by an unhashable name fails as a 500.
        value = entry.get(key) or {}
        if not isinstance(value, dict):
            raise bad(what)
        return value

    clusters, users, contexts = named("clusters"), named("users"), named("contexts")
    current = config.get("current-context")
    if not current:
        raise bad(_("kubeconfig: has no current-context."), "no_current_context")
    if not isinstance(current, str) or current not in contexts:
        raise bad(_("kubeconfig: current-context %(context)r is not among contexts.") % {"context": current},
                  "unknown_context")
    context = mapping(contexts[current], "context",
                      _("kubeconfig: context %(context)r must be a mapping.") % {"context": current})
    cluster_name, user_name = context.get("cluster"), context.get("user")
    if not isinstance(cluster_name, str) or cluster_name not in clusters:
        raise bad(_("kubeconfig: context %(context)r names cluster %(cluster)r, which is not among clusters.")
                  % {"context": current, "cluster": cluster_name}, "unknown_cluster")
    if not isinstance(user_name, str) or user_name not in users:
        raise bad(_("kubeconfig: context %(context)r names user %(user)r, which is not among users.")
                  % {"context": current, "user": user_name}, "unknown_user")
    cluster = mapping(clusters[cluster_name], "cluster",
                      _("kubeconfig: cluster %(cluster)r must be a mapping.") % {"cluster": cluster_name})
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise bad(_("kubeconfig: cluster %(cluster)r needs a server URL (https://...).") % {"cluster": cluster_name},
                  "no_server")
    user = mapping(users[user_name], "user", _("kubeconfig: user %(user)r must be a mapping.") % {"user": user_name})
    for key in sorted((_FILE_KEYS & set(cluster)) | (_FILE_KEYS & set(user))):
        raise bad(_("kubeconfig: %(key)r points at a file on the portal's machine; embed it instead "
                    "(%(key)s-data, or token).") % {"key": key}, "file_reference")
    for key in sorted(_PLUGIN_KEYS & set(user)):
        raise bad(_("kubeconfig: user %(user)r uses %(key)r, which would run a program on the portal's machine; "
                    "use a token or a client certificate.") % {"user": user_name, "key": key}, "auth_plugin")
    if not any(user.get(k) for k in ("token", "client-certificate-data", "username")):
        raise bad(_("kubeconfig: user %(user)r has no credentials (token, client-certificate-data or username).")
                  % {"user": user_name}, "no_credentials")
    return config


def _configure(configuration: k8s.Configuration) -> k8s.Configuration:
    # Fail fast: the apply lifecycle and beat retry with their own backoff.
    configuration.retries = 0
    return configuration


def api_client(cluster: Any) -> k8s.ApiClient:
    """An ApiClient for a registered cluster (a Cluster row). ClusterError(kind=credentials) if it has none."""
    if cluster.in_cluster:
        configuration = k8s.Configuration()
        try:
            load_incluster_config(client_configuration=configuration)
        except ConfigException as exc:
            raise ClusterError(f"in-cluster configuration is not available here ({exc})", kind="credentials",
                               retryable=False) from exc
        return k8s.ApiClient(_configure(configuration))
    if not cluster.kubeconfig_encrypted:
        raise ClusterError("no kubeconfig is registered for this cluster", kind="credentials", retryable=False)
    try:
        config = yaml.safe_load(crypto.decrypt(cluster.kubeconfig_encrypted))
        configuration = _configure(k8s.Configuration())
        return new_client_from_config_dict(config, persist_config=False, client_configuration=configuration)
    except crypto.DecryptionFailed as exc:
        raise ClusterError(str(exc), kind="credentials", retryable=False) from exc
    except (ConfigException, ValueError, TypeError, yaml.YAMLError) as exc:
        raise ClusterError(f"the stored kubeconfig is unusable ({exc})", kind="credentials", retryable=False) from exc


@contextmanager
def connect(cluster: Any) -> Iterator[k8s.ApiClient]:
    client = api_client(cluster)
    try:
        yield client
    finally:
        client.close()


def _api_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
        message = body.get("message") if isinstance(body, dict) else None
    except (TypeError, ValueError):
        message = None
    return message or (exc.reason or "error")


def map_exception(exc: BaseException) -> ClusterError:
    """What went wrong, in words, and whether to retry."""
    if isinstance(exc, ClusterError):
        return exc
    if isinstance(exc, ApiException):
        status = exc.status or 0
        message = _api_message(exc)
        if status == 0:
            return ClusterError(f"no answer from the API server ({message})", kind="unreachable", retryable=True)
        if status == 401:
            return ClusterError(f"the API server refused the credentials (401: {message})", kind="unauthorized",
                                status=status, retryable=False)
        if status == 403:
            return ClusterError(f"forbidden by the cluster's RBAC (403: {message})", kind="forbidden", status=status,
                                retryable=False)
        if status == 404:
            return ClusterError(f"not found (404: {message})", kind="not_found", status=status, retryable=False)
        if status in (409, 429) or status >= 500:
            return ClusterError(f"the API server answered {status}: {message}",
                                kind="conflict" if status == 409 else "server", status=status, retryable=True)
        return ClusterError(f"the API server refused the request ({status}: {message})", kind="invalid",
                            status=status, retryable=False)
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc_reason = exc.reason
        if isinstance(exc_reason, urllib3.exceptions.SSLError):
            return ClusterError(f"TLS handshake with the API server failed ({exc_reason})", kind="tls",
                                retryable=False)
        return ClusterError(f"the API server is unreachable ({exc_reason})", kind="unreachable", retryable=True)
    if isinstance(exc, (urllib3.exceptions.SSLError, ssl.SSLError)):
        return ClusterError(f"TLS handshake with the API server failed ({exc})", kind="tls", retryable=False)
    if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
        return ClusterError(f"the API server is unreachable ({exc})", kind="unreachable", retryable=True)
    raise exc


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call one API method with the portal's timeout; every failure becomes a ClusterError."""
    kwargs.setdefault("_request_timeout", settings.KUBE_REQUEST_TIMEOUT_SECONDS)
    try:
        return fn(*args, **kwargs)
    except (ApiException, urllib3.exceptions.HTTPError, ssl.SSLError, OSError) as exc:
        raise map_exception(exc) from exc
