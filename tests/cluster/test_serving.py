"""Serving on the local cluster: engine Ready -> Deployments -> pods placed by the real
scheduler on nodes of the right product within GPU capacity -> Ready; scaling, Pending pods,
restricted Pod Security, engine changes without a moment without a Ready pod, deletion by the
real garbage collector, and no write in steady state."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.operator_process import (
    OperatorProcess,
    cache_claim,
    get_json,
    service,
    wait_for,
)
from tests.cluster.test_control_loop import apiserver_requests
from tests.conftest import Cluster

L20 = {"nvidia.com/gpu.product": "NVIDIA-L20"}
SELECTOR = "tts.cosyvoice.dev/service"


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    name = cluster.namespace("serve")
    cluster.apply(name, cache_claim())
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture
def operator(cluster: Cluster, ns: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster, ns, tmp_path).start()
    yield op
    op.stop()
    print(op.log())


def cvs(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = get_json(cluster, "cvs", name, "-n", ns)
    return found


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}


def pods(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(cluster, "pods", "-n", ns, "-l", f"{SELECTOR}={name}")[
        "items"
    ]
    return items


def ready_pods(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in pods(cluster, ns, name)
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions", [])
        )
        and not p["metadata"].get("deletionTimestamp")
    ]


def wait_phase(
    cluster: Cluster, ns: str, name: str, phase: str, timeout: float = 90
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        obj = cvs(cluster, ns, name)
        return obj if obj.get("status", {}).get("phase") == phase else None

    return wait_for(f"{name} phase {phase}", probe, timeout)


def test_a_service_serves_on_nodes_of_its_products_and_reads_ready(
    cluster: Cluster, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(
        ns, service("tts", replicas=3, serving={"nodeSelector": L20, "gpusPerReplica": 2})
    )
    obj = wait_phase(cluster, ns, "tts", "Ready")
    st = obj["status"]
    assert (st["replicas"], st["readyReplicas"], st["readySummary"]) == (3, 3, "3/3")
    assert st["selector"] == f"{SELECTOR}=tts"
    assert st["endpoints"]["grpc"] == f"cvs-tts.{ns}.svc:8001"
    [entry] = st["serving"]
    assert entry["gpuArch"] == "sm_89" and entry["engineKey"] == st["engines"][0]["key"]
    conds = conditions(obj)
    assert conds["Available"]["status"] == "True" and conds["EngineReady"]["status"] == "True"
    placed = pods(cluster, ns, "tts")
    assert len(placed) == 3
    for pod in placed:
        node = get_json(cluster, "node", pod["spec"]["nodeName"])
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L20"
        [c] = pod["spec"]["containers"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    service_obj = get_json(cluster, "service", "cvs-tts", "-n", ns)
    assert {p["name"]: p["port"] for p in service_obj["spec"]["ports"]} == {
        "grpc": 8001,
        "http": 8000,
        "metrics": 8002,
    }
    assert get_json(cluster, "pdb", "cvs-tts", "-n", ns)["spec"]["maxUnavailable"] == 1
    printed = cluster.kubectl("get", "cvs", "tts", "-n", ns).stdout
    assert "Ready" in printed and "3/3" in printed

    # kubectl scale: the pod count follows, and the pods that were there stay.
    before = {p["metadata"]["uid"] for p in placed}
    cluster.kubectl("scale", "cvs", "tts", "-n", ns, "--replicas=4")
    wait_for("4 ready pods", lambda: len(ready_pods(cluster, ns, "tts")) == 4, timeout=60)
    after = {p["metadata"]["uid"] for p in pods(cluster, ns, "tts")}
    assert before <= after

    # Deleted: the real garbage collector removes everything the service owned.
    cluster.kubectl("delete", "cvs", "tts", "-n", ns)

    def gone() -> bool:
        left = cluster.kubectl(
            "get", "deploy,svc,pdb,configmap", "-n", ns, "-l", f"{SELECTOR}=tts", "-o", "name"
        ).stdout.strip()
        return not left and not pods(cluster, ns, "tts")

    wait_for("the workloads garbage-collected", gone, timeout=90)


def test_more_gpus_than_free_leaves_pods_pending_and_says_why(
    cluster: Cluster, ns: str, operator: OperatorProcess
) -> None:
    # Two L20 nodes of 8 GPUs: three pods of 8 GPUs cannot all fit.
    cluster.apply(
        ns, service("big", replicas=3, serving={"nodeSelector": L20, "gpusPerReplica": 8})
    )

    def unschedulable() -> dict[str, Any] | None:
        c = conditions(cvs(cluster, ns, "big")).get("Progressing", {})
        return c if c.get("reason") == "Unschedulable" else None

    cond = wait_for("Progressing reason Unschedulable", unschedulable, timeout=90)
    assert "nvidia.com/gpu" in cond["message"]
    obj = wait_for(
        "the two pods that fit Ready",
        lambda: (lambda o: o if o["status"].get("readySummary") == "2/3" else None)(
            cvs(cluster, ns, "big")
        ),
        timeout=60,
    )
    assert obj["status"]["phase"] == "Deploying"
    assert conditions(obj)["Available"]["status"] == "False"
    # Fewer replicas: it fits, and the condition clears.
    cluster.kubectl("scale", "cvs", "big", "-n", ns, "--replicas=2")
    wait_phase(cluster, ns, "big", "Ready")


def test_a_restricted_namespace_accepts_the_pods(cluster: Cluster, tmp_path: Path) -> None:
    ns = cluster.namespace("restricted")
    cluster.kubectl(
        "label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )  # fmt: skip
    cluster.apply(ns, cache_claim())
    op = OperatorProcess(cluster, ns, tmp_path).start()
    try:
        cluster.apply(ns, service("tts", replicas=1, serving={"nodeSelector": L20}))
        wait_phase(cluster, ns, "tts", "Ready")
        events = get_json(cluster, "events", "-n", ns)["items"]
        refusals = [e for e in events if "violates PodSecurity" in e.get("message", "")]
        assert refusals == []
    finally:
        op.stop()
        print(op.log())
        cluster.kubectl("delete", "namespace", ns, "--wait=false")


def test_an_engine_change_serves_throughout_and_steady_state_writes_nothing(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    slow = {"COSYVOICE_BUILD_POD_ANNOTATIONS": json.dumps({"kwok.cosyvoice.dev/run-for": "6s"})}
    op = OperatorProcess(cluster, ns, tmp_path, **slow).start()
    try:
        cluster.apply(ns, service("tts", replicas=2, serving={"nodeSelector": L20}))
        old_key = wait_phase(cluster, ns, "tts", "Ready")["status"]["engines"][0]["key"]
        cluster.kubectl(
            "patch", "cvs", "tts", "-n", ns, "--type=merge",
            "-p", json.dumps({"spec": {"engine": {"precision": "float16"}}}),
        )  # fmt: skip
        # While the new engine builds and the pods roll, a Ready pod is there at every look.
        lowest = 99
        deadline = time.monotonic() + 120
        new_key = ""
        while time.monotonic() < deadline:
            lowest = min(lowest, len(ready_pods(cluster, ns, "tts")))
            st = cvs(cluster, ns, "tts").get("status", {})
            served = [e["engineKey"] for e in st.get("serving", [])]
            if st.get("phase") == "Ready" and served and served[0] != old_key:
                new_key = served[0]
                break
            time.sleep(0.3)
        assert new_key, "the service never served the new engine"
        assert lowest >= 1
        keys = {
            p["metadata"]["labels"]["tts.cosyvoice.dev/engine-key"]
            for p in ready_pods(cluster, ns, "tts")
        }
        wait_for(
            "the old pods gone",
            lambda: (
                {
                    p["metadata"]["labels"]["tts.cosyvoice.dev/engine-key"]
                    for p in pods(cluster, ns, "tts")
                }
                == {new_key}
            ),
            timeout=60,
        )
        del keys

        # The old engine is no longer used: the cleanup marks it (one write, once).
        def marked() -> bool:
            records = get_json(
                cluster, "configmaps", "-n", ns, "-l", f"tts.cosyvoice.dev/engine-key={old_key}"
            )["items"]
            return bool(records) and "tts.cosyvoice.dev/unreferenced-since" in (
                records[0]["metadata"].get("annotations") or {}
            )

        wait_for("the old engine marked unreferenced", marked, timeout=120)
        # Steady state: nothing the operator owns is written across a quiet stretch.
        time.sleep(2)
        before = apiserver_requests(cluster)
        time.sleep(10)
        after = apiserver_requests(cluster)
        # (Verbs the operator uses; the controllers' own status updates are PUTs.)
        mine = {
            "cosyvoiceservices/status", "deployments", "services", "poddisruptionbudgets",
            "configmaps", "jobs", "events",
        }  # fmt: skip
        written = Counter(
            {
                k: v
                for k, v in (after - before).items()
                if k[0] in ("POST", "PATCH", "APPLY", "DELETE") and k[1] in mine
            }
        )
        assert written == Counter(), written
    finally:
        op.stop()
        print(op.log())
