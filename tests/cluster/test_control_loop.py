"""The control loop against the real control plane: watches instead of polling, no request
in steady state, a restart that lists each kind once, superseded builds stopped, unused
engines removed, finished builds recorded whatever else is wrong, and SIGKILLs mid-rollout."""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cosyvoice_operator.api import labels
from cosyvoice_operator.shell.kube import COMPONENT as OPERATOR_COMPONENT
from tests.cluster.operator_process import (
    OperatorProcess,
    cache_claim,
    free_port,
    get_json,
    service,
    wait_for,
)
from tests.conftest import Cluster

KEY_LABEL = labels.KEY_LABEL
L20 = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L20"}}
# What only the operator does to these resources while nothing changes (kwok patches nodes
# and pods for its heartbeats, so those are read from the operator's own count instead).
OPERATOR_RESOURCES = {
    "cosyvoiceservices",
    "jobs",
    "configmaps",
    "persistentvolumeclaims",
    "secrets",
}
# What the operator writes in a service's namespace (read back by resourceVersion).
OPERATOR_KINDS = "cvs,deployments,services,poddisruptionbudgets,networkpolicies,configmaps,jobs"
LISTED_KINDS = {
    "cosyvoiceservices",
    "jobs",
    "configmaps",
    "pods",
    "persistentvolumeclaims",
    "nodes",
    "deployments",
    "services",
    "poddisruptionbudgets",
    "horizontalpodautoscalers",
    "networkpolicies",
}


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    name = cluster.namespace("loop")
    cluster.apply(name, cache_claim())
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def slow_builds(seconds: int) -> dict[str, str]:
    return {
        "COSYVOICE_BUILD_POD_ANNOTATIONS": json.dumps({"kwok.cosyvoice.dev/run-for": f"{seconds}s"})
    }


def cvs(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = get_json(cluster, "cvs", name, "-n", ns)
    return found


def all_services(cluster: Cluster, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(cluster, "cvs", "-n", ns)["items"]
    return items


def ready(obj: dict[str, Any]) -> bool:
    conds = {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}
    return bool(conds.get("EngineReady", {}).get("status") == "True")


def jobs(cluster: Cluster, ns: str, component: str = "engine-build") -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(
        cluster, "jobs", "-n", ns, "-l", f"app.kubernetes.io/component={component}"
    )["items"]
    return items


def apiserver_requests(cluster: Cluster) -> Counter[tuple[str, str]]:
    """apiserver_request_total summed by (verb, resource[/subresource])."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    found: Counter[tuple[str, str]] = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        found[(labels.get("verb", ""), resource)] += int(float(line.rsplit(" ", 1)[1]))
    return found


def operator_events(cluster: Cluster) -> dict[tuple[str, str], str]:
    """The operator's own Events (its and kopf's), all namespaces: (namespace, name) ->
    resourceVersion.

    Every component writes Events (the scheduler and the controllers POST and PATCH theirs,
    in any namespace an earlier test left behind), so the API server's count of Event
    writes says nothing about who wrote them; the reporting component does."""
    found = [
        event
        for component in (OPERATOR_COMPONENT, "kopf")  # kopf posts the handlers' warnings
        for event in get_json(
            cluster, "events", "-A", "--field-selector", f"reportingComponent={component}"
        )["items"]
    ]
    return {
        (e["metadata"]["namespace"], e["metadata"]["name"]): e["metadata"]["resourceVersion"]
        for e in found
    }


def namespace_versions(cluster: Cluster, ns: str) -> dict[str, str]:
    """kind/name -> resourceVersion of everything of the kinds the operator writes in `ns`
    (whoever writes them: a change by anyone shows)."""
    items = get_json(cluster, OPERATOR_KINDS, "-n", ns)["items"]
    return {f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"] for o in items}


def _at_rest(cluster: Cluster) -> bool:
    """No request on the operator's resources (but watches), and no Event of the operator
    posted or updated, over ten seconds."""
    before, events = apiserver_requests(cluster), operator_events(cluster)
    time.sleep(10)
    moved = apiserver_requests(cluster) - before
    quiet = not [k for k in moved if k[1].split("/")[0] in OPERATOR_RESOURCES and k[0] != "WATCH"]
    return quiet and operator_events(cluster) == events


def services_with_distinct_engines(
    cluster: Cluster, ns: str, count: int, prefix: str = "s"
) -> None:
    docs = [
        json.loads(
            service(
                f"{prefix}{i}",
                model={
                    "variant": "cosyvoice3",
                    "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
                    "revision": f"rev-{prefix}{i}",
                },
                serving=L20,
            )
        )
        for i in range(count)
    ]
    cluster.apply(ns, json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))


def wait_all_ready(
    cluster: Cluster, ns: str, count: int, timeout: float = 120
) -> list[dict[str, Any]]:
    def probe() -> list[dict[str, Any]] | None:
        items = all_services(cluster, ns)
        return items if len(items) == count and all(ready(s) for s in items) else None

    return wait_for(f"{count} services EngineReady", probe, timeout=timeout)


def test_steady_state_makes_no_requests_and_a_restart_lists_each_kind_once(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    op = OperatorProcess(cluster, ns, tmp_path).with_metrics(free_port())
    op.start(liveness_port=free_port())
    try:
        services_with_distinct_engines(cluster, ns, 10)
        wait_all_ready(cluster, ns, 10)
        # Let the last Events and records settle, then measure a quiet stretch.
        wait_for("an idle queue", lambda: op.loop()["queued"] == 0, timeout=120)
        time.sleep(2)
        # The garbage collector checks, once, the owner of each new NetworkPolicy (a GET of
        # the service, some seconds after they are made): not the operator's, and not steady.
        wait_for("the API server at rest", lambda: _at_rest(cluster), timeout=90)
        # The operator's count from its metrics, read now (the liveness report is a copy up
        # to 10 s old).
        # Besides, its Events, and the objects of its kinds in this namespace by whoever
        # (the API server's counts are cluster-wide: other tests' namespaces in them).
        before_op = op.requests_made()
        events, versions = operator_events(cluster), namespace_versions(cluster, ns)
        time.sleep(12)  # what used to be a dozen resync passes
        made = {k: v for k, v in (op.requests_made() - before_op).items() if k[0] != "WATCH"}
        assert made == {}, f"the operator made requests in steady state: {made}"
        assert operator_events(cluster) == events
        assert namespace_versions(cluster, ns) == versions
        first = op.loop()["requests"]
        op.kill()

        # A restart with every engine ready: one list per kind, no other read, no write.
        op = OperatorProcess(cluster, ns, tmp_path).start(liveness_port=free_port())
        report = wait_for(
            "every service looked at after the restart",
            lambda: (lambda r: r if r["passes"] >= 10 and r["queued"] == 0 else None)(op.loop()),
            timeout=60,
        )
        requests = Counter(report["requests"])
        lists = {k.split(" ", 1)[1]: v for k, v in requests.items() if k.startswith("GET ")}
        assert {kind: lists.get(kind) for kind in LISTED_KINDS} == dict.fromkeys(LISTED_KINDS, 1), (
            requests
        )
        others = {
            k: v
            for k, v in requests.items()
            if not k.startswith(("WATCH ", "GET ")) and k != "GET /version"
        }
        assert others == {}, f"a restart with nothing to do wrote: {others}"
        assert set(lists) <= LISTED_KINDS | {"/version"}, lists
        assert len(first) > 0  # the first run did make its requests
    finally:
        op.stop()
        print(op.log())


def test_a_build_no_service_wants_any_more_is_stopped(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    op = OperatorProcess(
        cluster, ns, tmp_path, COSYVOICE_SUPERSEDED_GRACE_SECONDS="1", **slow_builds(600)
    ).start()
    try:
        cluster.apply(ns, service("svc", serving=L20))
        [first] = wait_for("the first build Job", lambda: jobs(cluster, ns))
        cluster.kubectl(
            "patch",
            "cvs",
            "svc",
            "-n",
            ns,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"engine": {"precision": "float16"}}}),
        )

        def replaced() -> list[dict[str, Any]] | None:
            now = jobs(cluster, ns)
            uids = {j["metadata"]["uid"] for j in now}
            return now if len(now) == 1 and first["metadata"]["uid"] not in uids else None

        [second] = wait_for("the superseded build deleted", replaced, timeout=60)
        key = cvs(cluster, ns, "svc")["status"]["engines"][0]["key"]
        assert (
            second["metadata"]["labels"][KEY_LABEL] == key != first["metadata"]["labels"][KEY_LABEL]
        )
        assert "no service" in op.log(whole=True) and first["metadata"]["name"] in op.log(
            whole=True
        )
    finally:
        op.stop()
        print(op.log())


def test_an_engine_no_service_uses_is_removed_after_the_retention_and_a_used_one_is_kept(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    op = OperatorProcess(cluster, ns, tmp_path, COSYVOICE_ENGINE_RETENTION_SECONDS="3").start()
    try:
        services_with_distinct_engines(cluster, ns, 2, prefix="gc")
        items = wait_all_ready(cluster, ns, 2)
        keys = {s["metadata"]["name"]: s["status"]["engines"][0]["key"] for s in items}
        cluster.kubectl("delete", "cvs", "gc1", "-n", ns)

        def records() -> dict[str, dict[str, Any]]:
            found = get_json(cluster, "configmaps", "-n", ns, "-l", KEY_LABEL)["items"]
            return {r["metadata"]["labels"][KEY_LABEL]: r for r in found}

        wait_for(
            "the unused engine's record removed", lambda: keys["gc1"] not in records(), timeout=90
        )
        [cleaner] = jobs(cluster, ns, "engine-cleanup")
        args = cleaner["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[:3] == ["remove", "--key", keys["gc1"]]
        assert cleaner["status"].get("succeeded") == 1
        # The engine in use keeps its record, unmarked, and its build Job.
        kept = records()[keys["gc0"]]
        assert not any(
            k.endswith(("removing", "unreferenced-since"))
            for k in kept["metadata"].get("annotations", {})
        )
        assert {j["metadata"]["labels"][KEY_LABEL] for j in jobs(cluster, ns)} == {keys["gc0"]}

        # Wanted again: built again (its old build Job went with it, so it is not trusted).
        services_with_distinct_engines(cluster, ns, 2, prefix="gc")
        wait_all_ready(cluster, ns, 2)
        assert keys["gc1"] in records()
        assert len(jobs(cluster, ns)) == 2
    finally:
        op.stop()
        print(op.log())


def test_a_build_that_finishes_while_blocked_is_recorded(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    cluster.apply(ns, cache_claim("models"))
    op = OperatorProcess(cluster, ns, tmp_path, **slow_builds(10)).start()
    try:
        cluster.apply(
            ns,
            service(
                "blocked",
                model={"variant": "cosyvoice3", "uri": "pvc://models/cosyvoice3"},
                serving=L20,
            ),
        )
        wait_for("the build Job", lambda: jobs(cluster, ns))
        # The model claim is deleted mid-build (it stays Terminating while the pod uses it).
        cluster.kubectl("delete", "pvc", "models", "-n", ns, "--wait=false")
        wait_for(
            "ModelClaimMissing",
            lambda: any(
                c.get("reason") == "ModelClaimMissing"
                for c in cvs(cluster, ns, "blocked").get("status", {}).get("conditions", [])
            ),
            timeout=120,
        )
        obj = wait_for(
            "the finished build recorded",
            lambda: (lambda o: o if ready(o) else None)(cvs(cluster, ns, "blocked")),
            timeout=60,
        )
        assert obj["status"]["engines"][0]["state"] == "Ready"
        assert len(jobs(cluster, ns)) == 1
    finally:
        op.stop()
        print(op.log())


def test_a_missing_credentials_secret_is_read_from_the_build_pod_not_the_secret(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    op = OperatorProcess(cluster, ns, tmp_path, **slow_builds(600)).start()
    try:
        cluster.apply(
            ns,
            service(
                "creds",
                model={
                    "variant": "cosyvoice3",
                    "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
                    "credentialsSecret": "hf-token",
                },
                serving=L20,
            ),
        )
        [job] = wait_for("the build Job", lambda: jobs(cluster, ns))
        container = job["spec"]["template"]["spec"]["containers"][0]
        refs = [
            e["valueFrom"]["secretKeyRef"] for e in container.get("env", []) if "valueFrom" in e
        ]
        assert refs == [{"name": "hf-token", "key": "HF_TOKEN"}] and "envFrom" not in container
        name = job["metadata"]["name"]
        pod = wait_for(
            "the running build pod",
            lambda: [
                p
                for p in get_json(cluster, "pods", "-n", ns, "-l", f"job-name={name}")["items"]
                if p["status"].get("phase") == "Running"
            ],
        )[0]
        # kwok runs no kubelet: write the status a kubelet writes when the Secret is missing.
        status = {
            "status": {
                "containerStatuses": [
                    {
                        "name": "builder",
                        "image": container["image"],
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "waiting": {
                                "reason": "CreateContainerConfigError",
                                "message": 'secret "hf-token" not found',
                            }
                        },
                    }
                ]
            }
        }
        cluster.kubectl(
            "patch",
            "pod",
            pod["metadata"]["name"],
            "-n",
            ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(status),
        )

        def missing() -> dict[str, Any] | None:
            for c in cvs(cluster, ns, "creds").get("status", {}).get("conditions", []):
                if c["type"] == "EngineReady" and c["reason"] == "CredentialsSecretMissing":
                    return dict(c)
            return None

        cond = wait_for("CredentialsSecretMissing", missing, timeout=120)
        assert "hf-token" in cond["message"]
    finally:
        op.stop()
        print(op.log())


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkills_during_a_rollout_leave_no_duplicate_and_no_orphan(
    cluster: Cluster, ns: str, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    count = 16
    op = OperatorProcess(cluster, ns, tmp_path, **slow_builds(3)).start()
    try:
        services_with_distinct_engines(cluster, ns, count, prefix=f"c{seed}-")
        for _ in range(3):
            time.sleep(rng.uniform(0.2, 2.5))
            op.kill()
            op = OperatorProcess(cluster, ns, tmp_path, **slow_builds(3)).start()
        items = wait_all_ready(cluster, ns, count, timeout=180)
        keys = {s["status"]["engines"][0]["key"] for s in items}
        made = jobs(cluster, ns)
        per_key = Counter(j["metadata"]["labels"][KEY_LABEL] for j in made)
        assert per_key == Counter(dict.fromkeys(keys, 1)), per_key  # one Job per engine
        records = get_json(cluster, "configmaps", "-n", ns, "-l", KEY_LABEL)["items"]
        assert sorted(r["metadata"]["labels"][KEY_LABEL] for r in records) == sorted(keys)
    finally:
        op.stop()
        print(op.log())
