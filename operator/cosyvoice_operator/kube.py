"""The few Kubernetes reads and writes the operator makes, on the ``kubernetes.aio`` client.

Everything returns plain dicts in the API's own JSON shape, so the pure core never sees a
client model class.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import socket
from collections.abc import Awaitable, Mapping
from typing import Any

from kubernetes.aio import client, config
from kubernetes.aio.client.exceptions import ApiException

from . import peering

log = logging.getLogger(__name__)
COMPONENT = "cosyvoice-operator"


async def _unless_missing(request: Awaitable[Any]) -> Any | None:
    """The response, or None when the object does not exist (404); other errors raise."""
    try:
        return await request
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def api_error(exc: ApiException) -> str:
    """The API server's own words for a refused request (its Status message)."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return f"{exc.status} {exc.reason}: {message or exc.body or ''}".strip().rstrip(":")


class Kube:
    """A thin, typed facade over the generated async API classes."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    @classmethod
    async def connect(cls) -> Kube:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            await config.load_kube_config()
        return cls(client.ApiClient())

    async def close(self) -> None:
        await self.api.close()

    def _plain(self, obj: Any) -> Any:
        return self.api.sanitize_for_serialization(obj)

    async def list_services(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        """CosyVoiceServices of the given namespaces (all namespaces when empty)."""
        args = ("tts.cosyvoice.dev", "v1alpha1")
        if not namespaces:
            found: Any = await self.custom.list_cluster_custom_object(*args, "cosyvoiceservices")
            return list(found.get("items") or [])
        items: list[dict[str, Any]] = []
        for ns in namespaces:
            page: Any = await self.custom.list_namespaced_custom_object(
                *args, ns, "cosyvoiceservices"
            )
            items.extend(page.get("items") or [])
        return items

    async def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = await _unless_missing(
            self.custom.get_namespaced_custom_object(
                "tts.cosyvoice.dev", "v1alpha1", namespace, "cosyvoiceservices", name
            )
        )
        return None if found is None else dict(found)

    async def peering_statuses(
        self, name: str, namespaces: tuple[str, ...]
    ) -> list[dict[str, Any] | None]:
        """The status of kopf's peering object `name`: the cluster-wide one when no namespace
        is served, else the one in each served namespace; None for one that does not exist.
        (Listed, not read by name: the chart grants kopf's list/watch/patch, no more.)"""
        group, version = peering.GROUP, peering.VERSION
        pages: list[Any] = []
        if not namespaces:
            pages.append(
                await self.custom.list_cluster_custom_object(group, version, peering.CLUSTER_PLURAL)
            )
        for ns in namespaces:
            pages.append(
                await self.custom.list_namespaced_custom_object(
                    group, version, ns, peering.NAMESPACED_PLURAL
                )
            )
        found: list[dict[str, Any] | None] = []
        for page in pages:
            named = [
                item
                for item in page.get("items") or []
                if (item.get("metadata") or {}).get("name") == name
            ]
            found.append(dict(named[0].get("status") or {}) if named else None)
        return found

    async def patch_service_status(
        self, namespace: str, name: str, changes: dict[str, Any], resource_version: str = ""
    ) -> bool:
        """Merge-patch the status; with `resource_version`, only if the object is still at
        that version (False, and nothing written, if it changed meanwhile)."""
        body: dict[str, Any] = {"status": changes}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            await self.custom.patch_namespaced_custom_object_status(
                "tts.cosyvoice.dev", "v1alpha1", namespace, "cosyvoiceservices", name, body
            )
        except ApiException as exc:
            if exc.status == 409 and resource_version:
                return False
            raise
        return True

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
        (log.warning if kind == "Warning" else log.info)("%s: %s", reason, message)
        try:
            await self.core.create_namespaced_event(meta.get("namespace"), body)  # type: ignore[arg-type]
        except Exception:
            log.exception("could not post the event %s", reason)

    async def list_nodes(self) -> list[dict[str, Any]]:
        result = await self.core.list_node()
        return list(self._plain(result).get("items") or [])

    async def list_jobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        result = await self.batch.list_namespaced_job(namespace, label_selector=selector)
        return list(self._plain(result).get("items") or [])

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        result = await self.core.list_namespaced_pod(namespace, label_selector=selector)
        return list(self._plain(result).get("items") or [])

    async def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = await _unless_missing(self.core.read_namespaced_config_map(name, namespace))
        return None if found is None else dict(self._plain(found))

    async def claim_uid(self, namespace: str, name: str) -> str | None:
        """The uid of a PersistentVolumeClaim, or None when there is none of that name."""
        claim = await _unless_missing(
            self.core.read_namespaced_persistent_volume_claim(name, namespace)
        )
        return None if claim is None else str(self._plain(claim)["metadata"]["uid"])

    async def secret_exists(self, namespace: str, name: str) -> bool:
        # Only the status matters: the operator never looks at a Secret's data.
        found = await _unless_missing(
            self.core.read_namespaced_secret_with_http_info(name, namespace)
        )
        return found is not None

    async def create_if_absent(self, body: dict[str, Any]) -> bool:
        """Create the object; False (and no error) when one of that name already exists."""
        namespace = body["metadata"]["namespace"]
        try:
            if body["kind"] == "Job":
                # The generated client serializes the JSON form as it is.
                await self.batch.create_namespaced_job(namespace, body)  # type: ignore[arg-type]
            elif body["kind"] == "ConfigMap":
                await self.core.create_namespaced_config_map(namespace, body)  # type: ignore[arg-type]
            else:
                raise ValueError(f"create_if_absent: unsupported kind {body['kind']}")
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True
