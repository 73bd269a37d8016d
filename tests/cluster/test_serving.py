"""Serving on the local cluster: engine Ready -> Deployments -> pods placed by the real
scheduler on nodes of the right product within GPU capacity -> Ready; scaling, Pending pods,
restricted Pod Security, engine changes without a moment without a Ready pod, deletion by the
real garbage collector, and no write in steady state."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cosyvoice_operator.api import labels
from cosyvoice_operator.devtools.localcluster.binaries import kubectl_path
from tests.cluster.operator_process import (
    OperatorProcess,
    cache_claim,
    free_port,
    get_json,
    service,
    wait_for,
)
from tests.cluster.test_control_loop import namespace_versions, operator_events
from tests.conftest import Cluster

L20 = {"nvidia.com/gpu.product": "NVIDIA-L20"}
SELECTOR = "tts.cosyvoice.dev/service"
# The Triton pods and Deployments: the router's carry the service label too (issue 30).
TRITON = "app.kubernetes.io/component=serving"


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
    items: list[dict[str, Any]] = get_json(
        cluster, "pods", "-n", ns, "-l", f"{SELECTOR}={name},{TRITON}"
    )["items"]
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
    assert st["selector"] == f"{SELECTOR}=tts,{TRITON}"
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
    # Clients reach the router (spec.routing.mode Router by default, issue 30): its gRPC and
    # HTTP ports and HAProxy's metrics; the router finds the Triton pods by cvs-tts-pods.
    service_obj = get_json(cluster, "service", "cvs-tts", "-n", ns)
    assert {p["name"]: p["port"] for p in service_obj["spec"]["ports"]} == {
        "grpc": 8001,
        "http": 8000,
        "metrics": 8404,
    }
    assert service_obj["spec"]["selector"] == {
        SELECTOR: "tts",
        "app.kubernetes.io/component": "router",
    }
    headless = get_json(cluster, "service", "cvs-tts-pods", "-n", ns)["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["selector"] == {SELECTOR: "tts", "app.kubernetes.io/component": "serving"}
    assert get_json(cluster, "pdb", "cvs-tts", "-n", ns)["spec"]["maxUnavailable"] == 1
    router = get_json(cluster, "deployment", "cvs-tts-router", "-n", ns)
    wait_for(
        "2 Ready router pods",
        lambda: (
            (get_json(cluster, "deployment", "cvs-tts-router", "-n", ns)["status"]).get(
                "readyReplicas"
            )
            == 2
        ),
        timeout=60,
    )
    [haproxy] = router["spec"]["template"]["spec"]["containers"]
    assert haproxy["image"] == "docker.io/library/haproxy:3.2"
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


# kwok keeps a pod with this annotation Running and not Ready for the duration it gives
# (devtools/localcluster/stages/pods.yaml): as a real serving pod, whose readiness probe
# passes only once Triton has loaded its engines.
READY_AFTER = "kwok.cosyvoice.dev/ready-after"


@contextmanager
def serving_pods_ready_after(cluster: Cluster, ns: str, delay: str) -> Iterator[None]:
    """Every serving pod created in `ns` gets READY_AFTER: `delay`, from the API server's own
    admission (a MutatingAdmissionPolicy, GA in Kubernetes 1.36: a CEL apply configuration,
    no webhook), so nothing in the operator exists for this test."""
    name = f"kwok-ready-after-{ns}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ]
            },
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "mutations": [
                {
                    "patchType": "ApplyConfiguration",
                    "applyConfiguration": {
                        "expression": "Object{metadata: Object.metadata{annotations: "
                        f'{{"{READY_AFTER}": "{delay}"}}}}}}'
                    },
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "objectSelector": {
                    "matchLabels": {labels.COMPONENT_LABEL: labels.SERVING_COMPONENT}
                },
            },
        },
    }
    cluster.apply(ns, json.dumps({"apiVersion": "v1", "kind": "List", "items": [policy, binding]}))
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "admission-probe",
            "labels": {labels.COMPONENT_LABEL: labels.SERVING_COMPONENT},
        },
        "spec": {"containers": [{"name": "c", "image": "probe"}]},
    }

    def annotated() -> bool:
        # The API server's policy informer takes a moment: a dry run says when it applies.
        made = cluster.kubectl(
            "create", "-n", ns, "--dry-run=server", "-o", "json", "-f", "-",
            input=json.dumps(probe),
        )  # fmt: skip
        found = json.loads(made.stdout)["metadata"].get("annotations", {})
        return bool(found.get(READY_AFTER) == delay)

    try:
        wait_for("the admission policy in effect", annotated, timeout=120)
        yield
    finally:
        cluster.kubectl(
            "delete", "mutatingadmissionpolicybinding,mutatingadmissionpolicy", name,
            "--ignore-not-found",
        )  # fmt: skip


class DeploymentWatch:
    """`kubectl get deployments --watch` of one service's Deployments: every version the API
    server sends, in order, from its first listing on (a watch misses no state, where a poll
    misses any that lasts less than its interval)."""

    def __init__(self, cluster: Cluster, ns: str, name: str) -> None:
        self.events: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            [
                str(kubectl_path()), f"--kubeconfig={cluster.kubeconfig}",
                "get", "deployments", "-n", ns, "-l", f"{SELECTOR}={name},{TRITON}",
                "--watch", "--output-watch-events", "-o", "json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for line in self.proc.stdout:
            buffer += line
            try:
                event, end = decoder.raw_decode(buffer.lstrip())
            except ValueError:
                continue  # the event's JSON is not complete yet
            self.events.append(event)
            buffer = buffer.lstrip()[end:]

    def ready_over_time(self) -> list[tuple[int, int]]:
        """After each event: (the service's pods, its Ready pods), summed over its
        Deployments as their status says (replicas, readyReplicas)."""
        latest: dict[str, dict[str, Any]] = {}
        found = []
        for event in list(self.events):
            obj = event["object"]
            if event["type"] == "DELETED":
                latest.pop(obj["metadata"]["name"], None)
            else:
                latest[obj["metadata"]["name"]] = obj.get("status") or {}
            found.append(
                (
                    sum(st.get("replicas", 0) for st in latest.values()),
                    sum(st.get("readyReplicas", 0) for st in latest.values()),
                )
            )
        return found

    def latest(self) -> dict[str, Any] | None:
        return self.events[-1]["object"] if self.events else None

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.reader.join(timeout=10)


def test_an_engine_change_serves_throughout_and_steady_state_writes_nothing(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    slow = {"COSYVOICE_BUILD_POD_ANNOTATIONS": json.dumps({"kwok.cosyvoice.dev/run-for": "6s"})}
    op = OperatorProcess(cluster, ns, tmp_path, **slow).with_metrics(free_port()).start()
    watch: DeploymentWatch | None = None
    try:
        with serving_pods_ready_after(cluster, ns, "5s"):
            cluster.apply(ns, service("tts", replicas=2, serving={"nodeSelector": L20}))
            old_key = wait_phase(cluster, ns, "tts", "Ready", timeout=120)["status"]["engines"][0][
                "key"
            ]
            watch = DeploymentWatch(cluster, ns, "tts")
            wait_for("the watch's listing", watch.latest, timeout=120)
            cluster.kubectl(
                "patch", "cvs", "tts", "-n", ns, "--type=merge",
                "-p", json.dumps({"spec": {"engine": {"precision": "float16"}}}),
            )  # fmt: skip

            def served_new() -> str | None:
                st = cvs(cluster, ns, "tts").get("status", {})
                served = [e["engineKey"] for e in st.get("serving", [])]
                new = st.get("phase") == "Ready" and served and served[0] != old_key
                return served[0] if new else None

            new_key = wait_for("the service serving the new engine", served_new, timeout=120)

            def rolled_out() -> bool:
                d = watch.latest() if watch else None
                st = (d or {}).get("status") or {}
                return bool(
                    d
                    and d["metadata"]["annotations"].get(labels.SERVED_KEY_ANNOTATION) == new_key
                    and st.get("observedGeneration") == d["metadata"]["generation"]
                    and st.get("replicas") == st.get("updatedReplicas") == 2
                    and st.get("readyReplicas") == st.get("availableReplicas") == 2
                )

            wait_for("the rollout complete, as the watch saw it", rolled_out, timeout=120)
            watch.stop()
            over_time = watch.ready_over_time()
            print("the Deployments' (pods, Ready pods) at each watch event:", over_time)
            # A Ready pod at every version of the Deployments' status, from before the change
            # to the end of the rollout...
            assert min(ready for _, ready in over_time) >= 1, over_time
            # ...while the new pods did wait for readiness: a pod not Ready was there (a rollout
            # that dropped the old pods first would have left none Ready).
            assert any(pods > ready for pods, ready in over_time), over_time
            placed = pods(cluster, ns, "tts")
            assert {p["metadata"]["labels"][labels.KEY_LABEL] for p in placed} == {new_key}
            for pod in placed:
                assert pod["metadata"]["annotations"][READY_AFTER] == "5s"
                [cond] = [c for c in pod["status"]["conditions"] if c["type"] == "Ready"]
                started = dt.datetime.fromisoformat(pod["status"]["startTime"])
                became_ready = dt.datetime.fromisoformat(cond["lastTransitionTime"])
                assert became_ready - started >= dt.timedelta(seconds=4), pod["status"]

        # The old engine is no longer used: the cleanup marks it (one write, once).
        def marked() -> bool:
            records = get_json(
                cluster, "configmaps", "-n", ns, "-l", f"{labels.KEY_LABEL}={old_key}"
            )["items"]
            return bool(records) and labels.UNREFERENCED_ANNOTATION in (
                records[0]["metadata"].get("annotations") or {}
            )

        wait_for("the old engine marked unreferenced", marked, timeout=120)

        # Steady state: nothing written across a quiet stretch. Three views: the operator's
        # own count of its requests (its metrics, read now: no other client's in it); its
        # Events (and kopf's); and the objects of its kinds in the namespace, whoever might
        # write them (read back by resourceVersion: other tests' namespaces do not count).
        def writes_so_far() -> dict[tuple[str, str], int]:
            return {k: v for k, v in op.requests_made().items() if k[0] not in ("WATCH", "GET")}

        def at_rest() -> bool:
            before = writes_so_far()
            time.sleep(3)
            return writes_so_far() == before

        wait_for("the operator at rest", at_rest, timeout=120)
        before, events = writes_so_far(), operator_events(cluster)
        versions = namespace_versions(cluster, ns)
        time.sleep(10)
        made = {k: n - before.get(k, 0) for k, n in writes_so_far().items() if n != before.get(k)}
        assert made == {}, f"the operator wrote in steady state: {made}"
        assert operator_events(cluster) == events
        assert namespace_versions(cluster, ns) == versions
    finally:
        if watch is not None and watch.proc.poll() is None:
            watch.stop()
        op.stop()
        print(op.log())
