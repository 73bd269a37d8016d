"""The local cluster's scheduler really enforces GPU capacity and node selection."""

from __future__ import annotations

import json
import time
from typing import Any

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


def _wait_pod(cluster: Cluster, ns: str, name: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    pod: dict[str, Any] = {}
    while time.monotonic() < deadline:
        pod = json.loads(cluster.kubectl("get", "pod", name, "-n", ns, "-o", "json").stdout)
        if pod["status"].get("phase") == "Running":
            return pod
        time.sleep(0.3)
    return pod


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
    deadline = time.monotonic() + 30
    reason = message = ""
    while time.monotonic() < deadline:
        pod = json.loads(cluster.kubectl("get", "pod", "nine", "-n", ns, "-o", "json").stdout)
        conds = {c["type"]: c for c in pod["status"].get("conditions", [])}
        if "PodScheduled" in conds:
            reason = conds["PodScheduled"].get("reason", "")
            message = conds["PodScheduled"].get("message", "")
            break
        time.sleep(0.3)
    assert pod["status"]["phase"] == "Pending"
    assert reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in message
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
    time.sleep(2)
    pod = json.loads(cluster.kubectl("get", "pod", "b200", "-n", ns, "-o", "json").stdout)
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
