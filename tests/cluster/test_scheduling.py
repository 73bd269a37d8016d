"""The local cluster's scheduler really enforces GPU capacity and node selection."""

from __future__ import annotations

import json
from typing import Any

from tests.cluster.operator_process import wait_for
from tests.conftest import Cluster


def _pod(name: str, gpus: int, node_selector: dict[str, str] | None = None) -> str:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "c",
                "image": "example/gpu:1",
                "resources": {"limits": {"nvidia.com/gpu": gpus}},
            }
        ]
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def _get_pod(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        cluster.kubectl("get", "pod", name, "-n", ns, "-o", "json").stdout
    )
    return found


def _wait_pod(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    """The pod once Running."""
    return wait_for(
        f"pod {name} Running",
        lambda: (lambda p: p if p["status"].get("phase") == "Running" else None)(
            _get_pod(cluster, ns, name)
        ),
        timeout=120,
    )


def _wait_unschedulable(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    """The pod once the scheduler has said it cannot place it (PodScheduled False,
    Unschedulable): the verdict itself, not a pod that merely has not been placed yet."""

    def verdict() -> dict[str, Any] | None:
        pod = _get_pod(cluster, ns, name)
        conds = {c["type"]: c for c in pod["status"].get("conditions", [])}
        said = conds.get("PodScheduled", {})
        return (
            pod if (said.get("status"), said.get("reason")) == ("False", "Unschedulable") else None
        )

    return wait_for(f"the scheduler's verdict on {name}", verdict, timeout=120)


def _scheduled_message(pod: dict[str, Any]) -> str:
    [cond] = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    return str(cond.get("message", ""))


def test_eight_gpu_pod_runs_on_an_eight_gpu_node(cluster: Cluster) -> None:
    ns = cluster.namespace("sched")
    cluster.apply(ns, _pod("eight", 8))
    pod = _wait_pod(cluster, ns, "eight")
    assert pod["status"]["phase"] == "Running"
    node = pod["spec"]["nodeName"]
    capacity = cluster.kubectl(
        "get", "node", node, "-o", "jsonpath={.status.allocatable.nvidia\\.com/gpu}"
    ).stdout
    assert capacity == "8"
    cluster.kubectl("delete", "namespace", ns, "--wait=false")


def test_nine_gpu_pod_stays_pending_as_unschedulable(cluster: Cluster) -> None:
    ns = cluster.namespace("sched")
    cluster.apply(ns, _pod("nine", 9))
    pod = _wait_unschedulable(cluster, ns, "nine")
    assert pod["status"]["phase"] == "Pending"
    assert "Insufficient nvidia.com/gpu" in _scheduled_message(pod)
    assert not pod["spec"].get("nodeName")
    cluster.kubectl("delete", "namespace", ns, "--wait=false")


def test_node_selector_on_gpu_product_is_honoured(cluster: Cluster) -> None:
    ns = cluster.namespace("sched")
    for i in range(4):
        cluster.apply(ns, _pod(f"h100-{i}", 2, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}))
    for i in range(4):
        pod = _wait_pod(cluster, ns, f"h100-{i}")
        node = pod["spec"]["nodeName"]
        product = cluster.kubectl(
            "get", "node", node, "-o", "jsonpath={.metadata.labels.nvidia\\.com/gpu\\.product}"
        ).stdout
        assert product == "NVIDIA-H100-80GB-HBM3"
    # A product no node has: the pod cannot be placed anywhere.
    cluster.apply(ns, _pod("b200", 1, {"nvidia.com/gpu.product": "NVIDIA-B200"}))
    pod = _wait_unschedulable(cluster, ns, "b200")
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    assert "node affinity/selector" in _scheduled_message(pod)
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
