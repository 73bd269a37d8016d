"""The operator's HTTP conversation with the API server, on the ``kubernetes.aio`` client.

Every request goes through :meth:`Kube.request`: plain JSON in, plain JSON out (the API's
own shape, so the pure core never sees a generated model class, and nothing is spent
converting thousands of watched objects into them). The same place counts requests by
verb and resource, which the tests and benchmarks compare with the API server's own
``apiserver_request_total``.

The generated client still does what it is good at: loading the kubeconfig or the
in-cluster configuration, TLS, and authentication.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import json
import logging
import socket
import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes.aio import client, config

from cosyvoice_operator.shell import metrics

log = logging.getLogger(__name__)
COMPONENT = "cosyvoice-operator"


class KubeError(Exception):
    """A request the API server refused (or could not be made); ``status`` 0 when no answer."""

    def __init__(self, status: int, reason: str, message: str, verb: str, path: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.verb = verb
        self.path = path
        super().__init__(f"{verb} {path}: {status} {reason}: {message}".rstrip(": "))

    @property
    def transient(self) -> bool:
        """The API server is in trouble (no answer, throttling, a 5xx), not refusing this
        request: the same request may succeed later, so the whole pass is retried."""
        return self.status in (0, 429) or self.status >= 500

    @property
    def api_message(self) -> str:
        """The API server's own words, as users should read them."""
        return f"{self.status} {self.reason}: {self.message}".strip().rstrip(":")


class ConnectError(Exception):
    """The API server cannot be reached or the credentials cannot be loaded (one clear line)."""


def _any_file(paths: str) -> bool:
    """Whether one of the kubeconfig paths (``os.pathsep``-separated, as KUBECONFIG) exists."""
    import os

    return any(os.path.isfile(os.path.expanduser(p)) for p in paths.split(os.pathsep) if p)


@dataclass(frozen=True)
class Kind:
    """A resource the operator reads or writes, by URL path."""

    group_version: str  # "v1", "batch/v1", "tts.cosyvoice.dev/v1alpha1"
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        prefix = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        if self.namespaced and namespace:
            prefix += f"/namespaces/{urllib.parse.quote(namespace, safe='')}"
        path = f"{prefix}/{self.plural}"
        if name:
            path += f"/{urllib.parse.quote(name, safe='')}"
        return path


SERVICES = Kind("tts.cosyvoice.dev/v1alpha1", "cosyvoiceservices")
JOBS = Kind("batch/v1", "jobs")
CONFIG_MAPS = Kind("v1", "configmaps")
PODS = Kind("v1", "pods")
CLAIMS = Kind("v1", "persistentvolumeclaims")
NODES = Kind("v1", "nodes", namespaced=False)
EVENTS = Kind("v1", "events")
DEPLOYMENTS = Kind("apps/v1", "deployments")
CORE_SERVICES = Kind("v1", "services")
DISRUPTION_BUDGETS = Kind("policy/v1", "poddisruptionbudgets")
NETWORK_POLICIES = Kind("networking.k8s.io/v1", "networkpolicies")
HORIZONTAL_AUTOSCALERS = Kind("autoscaling/v2", "horizontalpodautoscalers")
# spec.routing.mode GatewayAPI, with COSYVOICE_GATEWAY_API (their CRDs are not core).
GRPC_ROUTES = Kind("gateway.networking.k8s.io/v1", "grpcroutes")
TRAFFIC_POLICIES = Kind("gateway.envoyproxy.io/v1alpha1", "backendtrafficpolicies")
CLUSTER_PEERINGS = Kind("kopf.dev/v1", "clusterkopfpeerings", namespaced=False)
PEERINGS = Kind("kopf.dev/v1", "kopfpeerings")
KINDS_BY_OBJECT = {
    ("batch/v1", "Job"): JOBS,
    ("v1", "ConfigMap"): CONFIG_MAPS,
    ("apps/v1", "Deployment"): DEPLOYMENTS,
    ("v1", "Service"): CORE_SERVICES,
    ("policy/v1", "PodDisruptionBudget"): DISRUPTION_BUDGETS,
    ("networking.k8s.io/v1", "NetworkPolicy"): NETWORK_POLICIES,
    ("gateway.networking.k8s.io/v1", "GRPCRoute"): GRPC_ROUTES,
    ("gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy"): TRAFFIC_POLICIES,
}
KINDS_BY_NAME = {kind: k for (_, kind), k in KINDS_BY_OBJECT.items()}
FIELD_MANAGER = "cosyvoice-operator"


def _message(body: bytes) -> str:
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return body.decode(errors="replace")[:500]
    if isinstance(data, dict) and data.get("message"):
        return str(data["message"])
    return body.decode(errors="replace")[:500]


def resource_of(path: str) -> str:
    """`jobs`, `cosyvoiceservices/status`, ... of a request path, as the API server's
    request metrics name them (resource and subresource)."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if not parts or parts[0] not in ("api", "apis"):
        return path
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    if not rest:
        return ""
    resource = rest[0]
    return f"{resource}/{rest[2]}" if len(rest) >= 3 else resource


class Kube:
    """Requests to one API server, with their counts."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()

    @classmethod
    async def connect(cls, attempts: int = 5, delay: float = 2.0) -> Kube:
        """Load the in-cluster configuration or the kubeconfig, then prove the API server
        answers (``/version``), retrying a few times; a ConnectError says what and where."""
        where = "in-cluster service account"
        try:
            config.load_incluster_config()
        except config.ConfigException:
            import os

            where = os.environ.get("KUBECONFIG") or "~/.kube/config"
            if not _any_file(where):
                # The loader would log "Config not found" and blame a missing current-context.
                named = "KUBECONFIG names" if os.environ.get("KUBECONFIG") else "the default is"
                raise ConnectError(
                    f"no kubeconfig: {named} {where}, and no such file exists (and this is not "
                    "a pod with a service account). Set KUBECONFIG to a kubeconfig file, or run "
                    "the operator in a pod."
                ) from None
            try:
                await config.load_kube_config()
            except Exception as exc:  # the loader raises several unrelated types
                raise ConnectError(
                    f"cannot load the kubeconfig {where}: {exc}. Set KUBECONFIG to a readable "
                    "kubeconfig, or run the operator in a pod with a service account."
                ) from None
        kube = cls(client.ApiClient())
        host = kube.api.configuration.host
        last = ""
        for attempt in range(1, attempts + 1):
            try:
                await kube.request("GET", "/version", limit=10)
                return kube
            except KubeError as exc:
                if exc.status in (401, 403):
                    await kube.close()
                    raise ConnectError(
                        f"the API server at {host} refused the credentials from {where}: "
                        f"{exc.api_message}"
                    ) from None
                last = exc.api_message
            if attempt < attempts:
                log.warning(
                    "API server at %s not answering (%s); try %d/%d", host, last, attempt, attempts
                )
                await asyncio.sleep(delay * attempt)
        await kube.close()
        raise ConnectError(
            f"the API server at {host} (from {where}) did not answer after {attempts} tries: "
            f"{last}. Check that it runs and that the kubeconfig points at it."
        )

    async def close(self) -> None:
        await self.api.close()

    def _url(self, path: str, query: Mapping[str, Any] | None) -> str:
        url = str(self.api.configuration.host) + path
        if query:
            url += "?" + urllib.parse.urlencode(
                {k: str(v).lower() if isinstance(v, bool) else v for k, v in query.items()}
            )
        return url

    async def _send(
        self,
        verb: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        limit: float | aiohttp.ClientTimeout | None = 60,
    ) -> Any:
        """The raw response (an open aiohttp response) of one request."""
        headers: dict[str, str] = {"Accept": "application/json", "Content-Type": content_type}
        headers.update(self.api.default_headers)
        query_params: list[tuple[str, str]] = []
        await self.api.update_params_for_auth(
            headers, query_params, ["BearerToken"], path, verb, body
        )
        resource = resource_of(path)
        counted = verb if not (query or {}).get("watch") else "WATCH"
        self.requests[(counted, resource)] += 1
        if isinstance(limit, (int, float)):
            limit = aiohttp.ClientTimeout(total=limit)
        started = time.monotonic()
        try:
            response = await self.api.rest_client.request(
                verb,
                self._url(path, query),
                headers=headers,
                body=body,
                _request_timeout=limit,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            metrics.record_request(counted, resource, 0, time.monotonic() - started)
            raise KubeError(0, type(exc).__name__, str(exc), verb, path) from None
        metrics.record_request(
            counted, resource, response.response.status, time.monotonic() - started
        )
        return response.response

    async def request(
        self,
        verb: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        limit: float = 60,
    ) -> Any:
        """One request; the decoded JSON answer. A KubeError for a status >= 400."""
        raw = await self._send(verb, path, query, body, content_type, limit)
        try:
            data = await raw.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeError(0, type(exc).__name__, str(exc), verb, path) from None
        finally:
            raw.release()
        if raw.status >= 400:
            raise KubeError(raw.status, raw.reason or "", _message(data), verb, path)
        return json.loads(data) if data else None

    async def watch_lines(
        self, path: str, query: Mapping[str, Any], server_seconds: float
    ) -> AsyncIterator[dict[str, Any]]:
        """The events of one watch request, decoded, until the server ends it."""
        raw = await self._send(
            "GET",
            path,
            query,
            limit=aiohttp.ClientTimeout(total=None, sock_connect=15, sock_read=server_seconds + 30),
        )
        try:
            if raw.status >= 400:
                data = await raw.read()
                raise KubeError(raw.status, raw.reason or "", _message(data), "WATCH", path)
            buffer = b""
            async for chunk in raw.content.iter_any():
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeError(0, type(exc).__name__, str(exc), "WATCH", path) from None
        finally:
            raw.release()

    # ---- the writes of the operator -------------------------------------------------------

    async def create(self, body: Mapping[str, Any]) -> bool:
        """Create the object; False (and no error) when one of that name already exists."""
        return await self.create_object(body) is not None

    async def create_object(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create the object: the object made, as the API server answered; None (and no
        error) when one of that name already exists."""
        kind = KINDS_BY_OBJECT[(body["apiVersion"], body["kind"])]
        try:
            made = await self.request("POST", kind.path(body["metadata"]["namespace"]), body=body)
        except KubeError as exc:
            if exc.status == 409:
                return None
            raise
        return dict(made or {})

    async def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of the whole object under the operator's field manager: the
        object as the API server answered."""
        kind = KINDS_BY_OBJECT[(body["apiVersion"], body["kind"])]
        meta = body["metadata"]
        applied = await self.request(
            "PATCH",
            kind.path(meta["namespace"], meta["name"]),
            {"fieldManager": FIELD_MANAGER, "force": True},
            body=dict(body),
            content_type="application/apply-patch+yaml",
        )
        return dict(applied or {})

    async def delete(self, kind: Kind, namespace: str, name: str, uid: str) -> bool:
        """Delete the object of that uid (not a namesake made since); False if already gone."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
            "preconditions": {"uid": uid},
        }
        try:
            await self.request("DELETE", kind.path(namespace, name), body=body)
        except KubeError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def merge_patch(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        subresource: str = "",
    ) -> bool:
        """A JSON merge patch; False when the object is gone or, with a resourceVersion in the
        patch, changed meanwhile (nothing is written then)."""
        written = await self.merge_patch_object(kind, namespace, name, patch, subresource)
        return written is not None

    async def merge_patch_object(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        subresource: str = "",
    ) -> dict[str, Any] | None:
        """A JSON merge patch: the object as written; None when it is gone or, with a
        resourceVersion in the patch, changed meanwhile (nothing is written then)."""
        path = kind.path(namespace, name) + (f"/{subresource}" if subresource else "")
        try:
            written = await self.request(
                "PATCH", path, body=dict(patch), content_type="application/merge-patch+json"
            )
        except KubeError as exc:
            if exc.status in (404, 409):
                return None
            raise
        return dict(written or {})

    async def post_event(
        self, regarding: Mapping[str, Any], kind: str, reason: str, message: str
    ) -> None:
        """An Event on the object, as `kubectl describe` shows them. Never raises: a lost
        Event must not fail the reconcile that produced it."""
        meta = regarding.get("metadata") or {}
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{meta.get('name', 'object')}.",
                "namespace": meta.get("namespace"),
            },
            "involvedObject": {
                "apiVersion": regarding.get("apiVersion"),
                "kind": regarding.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": socket.gethostname(),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        (log.warning if kind == "Warning" else log.info)(
            "%s/%s %s: %s", meta.get("namespace"), meta.get("name"), reason, message
        )
        try:
            await self.request("POST", EVENTS.path(str(meta.get("namespace"))), body=body)
        except Exception:
            log.exception("could not post the event %s", reason)
