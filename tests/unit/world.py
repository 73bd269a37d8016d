"""An in-memory plan.service.World for the planners' table tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cosyvoice_operator.api import gpus, labels

from .objects import CACHE, node


@dataclass
class FakeWorld:
    nodes: list[dict[str, Any]] = field(default_factory=lambda: [node("l20-0", "NVIDIA-L20")])
    claims: dict[str, str] = field(default_factory=lambda: {CACHE.claim: CACHE.uid})
    records: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    job_list: list[Mapping[str, Any]] = field(default_factory=list)
    pod_list: dict[str, list[Mapping[str, Any]]] = field(default_factory=dict)
    # (kind, name) -> object, for what the serving planner reads
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    serving_pod_list: list[Mapping[str, Any]] = field(default_factory=list)

    def gpu_nodes(self) -> Sequence[gpus.GPUNode]:
        found = (gpus.GPUNode.from_node(n) for n in self.nodes)
        return [n for n in found if n is not None]

    def claim_uid(self, namespace: str, name: str) -> str | None:
        return self.claims.get(name)

    def record(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.records.get(name)

    def jobs(self, namespace: str, key: str, tag: str) -> Sequence[Mapping[str, Any]]:
        return [
            j
            for j in self.job_list
            if j["metadata"]["labels"].get(labels.KEY_LABEL) == key
            and j["metadata"]["labels"].get(labels.CLAIM_LABEL, tag) == tag
        ]

    def pods(self, namespace: str, job: str) -> Sequence[Mapping[str, Any]]:
        return self.pod_list.get(job, [])

    def deployments(self, namespace: str, service: str) -> Sequence[Mapping[str, Any]]:
        return [
            d
            for d in self.objects.values()
            if d.get("kind") == "Deployment"
            and (d["metadata"].get("labels") or {}).get(labels.SERVICE_LABEL) == service
        ]

    def owned(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        found = self.objects.get((kind, name))
        return found

    def serving_pods(self, namespace: str, service: str) -> Sequence[Mapping[str, Any]]:
        return self.serving_pod_list
