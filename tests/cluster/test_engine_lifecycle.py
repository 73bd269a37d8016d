"""Engine lifecycle against the real control plane: the operator runs as a process, the Job
controller and scheduler are real, kwok plays the build pods (they succeed after a few
seconds, or fail for the model URI hf://simulated/build-failure)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cosyvoice_operator.api import labels
from tests.cluster.operator_process import (
    FAST_SETTINGS,
    OperatorProcess,
    cache_claim,
    get_json,
    service,
    wait_for,
)
from tests.conftest import Cluster

KEY_LABEL = labels.KEY_LABEL
MANIFESTS = Path(__file__).parent / "manifests"
L20 = {"nvidia.com/gpu.product": "NVIDIA-L20"}


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    name = cluster.namespace("engine")
    cluster.apply(name, cache_claim())
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture
def operator(cluster: Cluster, ns: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster, ns, tmp_path).start()
    yield op
    op.stop()
    print(op.log())  # captured: pytest shows it only when the test failed


def jobs(cluster: Cluster, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(cluster, "jobs", "-n", ns)["items"]
    return items


def cvs(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = get_json(cluster, "cvs", name, "-n", ns)
    return obj


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return dict(c)
    return {}


def wait_engine_ready(cluster: Cluster, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        obj = cvs(cluster, ns, name)
        return obj if condition(obj, "EngineReady").get("status") == "True" else None

    return wait_for(f"{name} EngineReady", probe, timeout)


def refused_job_creates(cluster: Cluster) -> int:
    """Job creates the API server refused as invalid (422), from its own metrics."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    total = 0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            if (labels.get("verb"), labels.get("resource"), labels.get("code")) == (
                "POST",
                "jobs",
                "422",
            ):
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


def pod_product(cluster: Cluster, ns: str, job: str) -> str:
    pods = get_json(cluster, "pods", "-n", ns, "-l", f"job-name={job}")["items"]
    assert pods, f"no pod for {job}"
    node = pods[0]["spec"]["nodeName"]
    labels = get_json(cluster, "node", node)["metadata"]["labels"]
    return str(labels["nvidia.com/gpu.product"])


def test_service_builds_on_the_right_product_and_a_twin_reuses_it(
    cluster: Cluster, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(ns, service("first", serving={"nodeSelector": L20}))
    first = wait_engine_ready(cluster, ns, "first")
    [entry] = first["status"]["engines"]
    assert entry["gpuProduct"] == "NVIDIA-L20" and entry["gpuArch"] == "sm_89"
    assert entry["state"] == "Ready"
    [job] = jobs(cluster, ns)
    assert job["metadata"]["labels"][KEY_LABEL] == entry["key"]
    assert not job["metadata"].get("ownerReferences")  # engines outlive any one service
    assert pod_product(cluster, ns, job["metadata"]["name"]) == "NVIDIA-L20"
    record = get_json(cluster, "configmap", "-n", ns, "-l", f"{KEY_LABEL}={entry['key']}")
    assert len(record["items"]) == 1

    # A second service asking for the same engine: no Job, ready at once.
    cluster.apply(
        ns, service("second", replicas=3, serving={"nodeSelector": L20, "instancesPerGpu": 2})
    )
    second = wait_engine_ready(cluster, ns, "second", timeout=120)
    assert second["status"]["engines"][0]["key"] == entry["key"]
    assert len(jobs(cluster, ns)) == 1
    # No finalizer: deleting a service never waits on the operator being up.
    assert not second["metadata"].get("finalizers")
    out = cluster.kubectl("get", "cvs", "-n", ns).stdout
    assert "second" in out and "Ready" in out


def test_scaling_changes_make_no_job_and_a_precision_change_makes_one(
    cluster: Cluster, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(ns, service("svc", serving={"nodeSelector": L20}))
    key = wait_engine_ready(cluster, ns, "svc")["status"]["engines"][0]["key"]
    cluster.kubectl(
        "patch",
        "cvs",
        "svc",
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"replicas": 3, "autoscaling": {"enabled": True, "maxReplicas": 6}}}),
    )
    cluster.kubectl("scale", "cvs", "svc", "-n", ns, "--replicas=5")
    # Let several reconciles (create/update/timer at 1 s) pass.
    wait_for(
        "the spec change to be observed",
        lambda: cvs(cluster, ns, "svc")["status"].get("observedGeneration", 0) >= 3,
        timeout=120,
    )
    # Observed means decided: a Job would have been created before that status was written.
    assert len(jobs(cluster, ns)) == 1
    assert cvs(cluster, ns, "svc")["status"]["engines"][0]["key"] == key

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

    def new_key() -> str | None:
        st = cvs(cluster, ns, "svc")["status"]
        k = st["engines"][0]["key"]
        return (
            k
            if k != key and condition(cvs(cluster, ns, "svc"), "EngineReady")["status"] == "True"
            else None
        )

    fp16 = wait_for("the float16 engine", new_key)
    all_jobs = jobs(cluster, ns)
    assert len(all_jobs) == 2
    assert {j["metadata"]["labels"][KEY_LABEL] for j in all_jobs} == {key, fp16}


def test_mixed_fleet_builds_one_engine_per_architecture_each_pinned(
    cluster: Cluster, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(ns, service("mixed"))
    obj = wait_engine_ready(cluster, ns, "mixed")
    entries = {e["gpuProduct"]: e for e in obj["status"]["engines"]}
    assert set(entries) == {"NVIDIA-L20", "NVIDIA-H100-80GB-HBM3"}
    assert entries["NVIDIA-L20"]["gpuArch"] == "sm_89"
    assert entries["NVIDIA-H100-80GB-HBM3"]["gpuArch"] == "sm_90"
    assert entries["NVIDIA-L20"]["key"] != entries["NVIDIA-H100-80GB-HBM3"]["key"]
    by_key = {j["metadata"]["labels"][KEY_LABEL]: j for j in jobs(cluster, ns)}
    assert len(by_key) == 2
    for product, entry in entries.items():
        job = by_key[entry["key"]]
        terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0]["values"] == [product]
        assert pod_product(cluster, ns, job["metadata"]["name"]) == product
    assert obj["status"]["engineSummary"] == "Ready 2/2"


def test_operator_killed_mid_build_adopts_the_job(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    # Long enough that the kill and the restart happen mid-build on a loaded 2-core machine.
    slow = {"COSYVOICE_BUILD_POD_ANNOTATIONS": json.dumps({"kwok.cosyvoice.dev/run-for": "40s"})}
    op = OperatorProcess(cluster, ns, tmp_path, **slow).start()
    try:
        cluster.apply(ns, service("slow", serving={"nodeSelector": L20}))

        def building() -> dict[str, Any] | None:
            obj = cvs(cluster, ns, "slow")
            return obj if obj.get("status", {}).get("phase") == "BuildingEngine" else None

        wait_for("a build in flight", building)

        def progress() -> str | None:
            msg: str = cvs(cluster, ns, "slow")["status"]["engines"][0]["message"]
            return msg if "running on nvidia-l20-" in msg else None

        # Where it runs and since when, so a long build shows it is alive (once it has run
        # REPORT_RUNNING_AFTER, 10 s: a shorter build costs no status write for it).
        assert " since 20" in wait_for("the build pod's node", progress, timeout=120)
        [job] = jobs(cluster, ns)
        assert not job["status"].get("succeeded")
        op.kill()
        op = OperatorProcess(cluster, ns, tmp_path, **slow).start()
        obj = wait_engine_ready(cluster, ns, "slow", timeout=90)
        after = jobs(cluster, ns)
        assert [j["metadata"]["uid"] for j in after] == [job["metadata"]["uid"]]
        assert obj["status"]["engines"][0]["job"] == job["metadata"]["name"]
    finally:
        op.stop()


def test_failing_build_reports_its_message_and_retries_with_backoff_then_stops(
    cluster: Cluster, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(
        ns, service("broken", uri="hf://simulated/build-failure", serving={"nodeSelector": L20})
    )

    def failed_once() -> dict[str, Any] | None:
        obj = cvs(cluster, ns, "broken")
        engines = obj.get("status", {}).get("engines") or []
        return obj if engines and engines[0]["state"] == "Failed" else None

    obj = wait_for("the first failure", failed_once)
    entry = obj["status"]["engines"][0]
    assert "simulated failure: trtllm-build exited with status 1" in entry["message"]
    assert "step build" in entry["message"]
    # Failed, but another attempt is due: the service is still building.
    assert condition(obj, "EngineReady")["reason"] == "BuildRetrying"
    assert obj["status"]["phase"] == "BuildingEngine"

    created: dict[int, float] = {}

    def attempts_seen() -> bool:
        for j in jobs(cluster, ns):
            n = int(j["metadata"]["labels"]["tts.cosyvoice.dev/attempt"])
            created.setdefault(n, time.monotonic())
        return 3 in created

    wait_for("three attempts", attempts_seen, timeout=90, interval=0.2)

    def gave_up() -> dict[str, Any] | None:
        o = cvs(cluster, ns, "broken")
        e = o["status"]["engines"][0]
        return o if e["attempts"] == 3 and "Gave up" in e["message"] else None

    final = wait_for("the operator to give up", gave_up, timeout=60)
    # Backoff: attempt 2 waits >= 2 s after attempt 1 failed, attempt 3 >= 4 s after attempt 2.
    stamps = {
        int(j["metadata"]["labels"]["tts.cosyvoice.dev/attempt"]): j for j in jobs(cluster, ns)
    }

    def failed_at(n: int) -> float:
        conds = {c["type"]: c for c in stamps[n]["status"]["conditions"]}
        return _epoch(conds["Failed"]["lastTransitionTime"])

    def created_at(n: int) -> float:
        return _epoch(stamps[n]["metadata"]["creationTimestamp"])

    assert created_at(2) - failed_at(1) >= 2 - 1  # whole-second timestamps
    assert created_at(3) - failed_at(2) >= 4 - 1
    assert final["status"]["phase"] == "Failed"
    assert condition(final, "EngineReady")["reason"] == "BuildFailed"
    # Giving up is recorded, so it outlives the Jobs' TTL rather than starting over.
    records = get_json(
        cluster, "configmaps", "-n", ns, "-l", f"{KEY_LABEL}={final['status']['engines'][0]['key']}"
    )["items"]
    assert [r["data"]["state"] for r in records] == ["Failed"]
    # Giving up is final: no retry is scheduled, and none comes when a fourth attempt would
    # be due (the backoff after attempt 3 is base x 2^2 = 8 s from its failure; the Job's
    # timestamps are whole seconds, and the operator acts up to half a second after a retry
    # is due, so a margin of 3 s).
    assert "nextRetryTime" not in final["status"]["engines"][0]
    base = float(FAST_SETTINGS["COSYVOICE_BUILD_RETRY_BASE_SECONDS"])
    attempts = int(FAST_SETTINGS["COSYVOICE_BUILD_MAX_ATTEMPTS"])
    fourth_due = failed_at(attempts) + base * 2 ** (attempts - 1)
    time.sleep(max(0.0, fourth_due + 3 - time.time()))
    after = jobs(cluster, ns)
    assert sorted(int(j["metadata"]["labels"]["tts.cosyvoice.dev/attempt"]) for j in after) == [
        1,
        2,
        3,
    ]
    events = cluster.kubectl(
        "get", "events", "-n", ns, "--field-selector", "involvedObject.name=broken", "-o", "json"
    ).stdout
    reasons = {e["reason"] for e in json.loads(events)["items"]}
    assert {"EngineBuildStarted", "EngineBuildFailed"} <= reasons

    # The retry the message tells of: delete the key's Jobs and record, and it starts over.
    old_key = final["status"]["engines"][0]["key"]
    assert (
        f"kubectl delete jobs,configmaps -l {KEY_LABEL}={old_key}"
        in final["status"]["engines"][0]["message"]
    )
    cluster.kubectl("delete", "jobs,configmaps", "-n", ns, "-l", f"{KEY_LABEL}={old_key}")
    wait_for(
        "attempt 1 again",
        lambda: [
            j
            for j in jobs(cluster, ns)
            if j["metadata"]["labels"]["tts.cosyvoice.dev/attempt"] == "1"
        ],
        timeout=120,
    )

    # A new key starts fresh: attempt 1 of a new engine, whatever the old one went through.
    cluster.kubectl(
        "patch",
        "cvs",
        "broken",
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"engine": {"maxBatchSize": 32}}}),
    )

    def fresh_job() -> list[dict[str, Any]] | None:
        new = [j for j in jobs(cluster, ns) if j["metadata"]["labels"][KEY_LABEL] != old_key]
        return new or None

    [new_job] = wait_for("a Job for the new key", fresh_job, timeout=120)
    assert new_job["metadata"]["labels"]["tts.cosyvoice.dev/attempt"] == "1"


def _epoch(stamp: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize(
    ("case", "spec", "reason", "needle"),
    [
        (
            "unknown-product",
            {"engine": {"gpuProducts": ["NVIDIA-Quantum-9000"]}},
            "UnknownGPUProduct",
            "NVIDIA-Quantum-9000",
        ),
        ("missing-claim", {"engine": {"cacheClaimName": "nope"}}, "CacheClaimMissing", "nope"),
        (
            "fp8-on-ampere",
            {"engine": {"precision": "fp8", "gpuProducts": ["NVIDIA-A100-SXM4-80GB"]}},
            "PrecisionUnsupported",
            "fp8 needs sm_89 or newer: NVIDIA-A100-SXM4-80GB is sm_80",
        ),
        (
            "no-nodes",
            {"serving": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"}}},
            "NoEligibleGPUNodes",
            "nodeSelector",
        ),
    ],
)
def test_blocked_services_say_why_and_make_no_jobs(
    cluster: Cluster,
    ns: str,
    operator: OperatorProcess,
    case: str,
    spec: dict[str, Any],
    reason: str,
    needle: str,
) -> None:
    cluster.apply(ns, service(case, **spec))

    def blocked() -> dict[str, Any] | None:
        c = condition(cvs(cluster, ns, case), "EngineReady")
        return c if c.get("reason") == reason else None

    cond = wait_for(f"EngineReady reason {reason}", blocked, timeout=120)
    assert cond["status"] == "False"
    assert needle in cond["message"]
    # The pass that wrote this condition is the one that would have made the Job (Jobs are
    # created before the status is written), so none exists now and none will.
    assert jobs(cluster, ns) == []


def test_missing_claim_then_created_starts_the_build(
    cluster: Cluster, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(
        ns, service("later", engine={"cacheClaimName": "late-cache"}, serving={"nodeSelector": L20})
    )
    wait_for(
        "CacheClaimMissing",
        lambda: (
            condition(cvs(cluster, ns, "later"), "EngineReady").get("reason") == "CacheClaimMissing"
        ),
    )
    assert jobs(cluster, ns) == []
    cluster.apply(ns, cache_claim("late-cache"))
    obj = wait_engine_ready(cluster, ns, "later")
    assert len(jobs(cluster, ns)) == 1
    assert obj["status"]["phase"] in ("Deploying", "Ready")  # serving follows at once


def test_two_operators_and_three_services_racing_make_one_job(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    # Two standalone operators on one namespace (as during a botched rollout) and three
    # services created at once, all wanting one engine: create-if-absent makes one Job.
    ops = [OperatorProcess(cluster, ns, tmp_path / str(i)) for i in range(2)]
    for i, op in enumerate(ops):
        (tmp_path / str(i)).mkdir()
        op.start()
    try:
        manifests = "\n---\n".join(
            service(f"race-{i}", serving={"nodeSelector": L20}) for i in range(3)
        )
        cluster.apply(ns, manifests)
        keys = {
            wait_engine_ready(cluster, ns, f"race-{i}")["status"]["engines"][0]["key"]
            for i in range(3)
        }
        assert len(keys) == 1
        assert len(jobs(cluster, ns)) == 1
        records = get_json(cluster, "configmaps", "-n", ns, "-l", f"{KEY_LABEL}={keys.pop()}")
        assert len(records["items"]) == 1
    finally:
        for op in ops:
            op.stop()


def test_build_for_a_product_without_nodes_waits_and_says_why(
    cluster: Cluster, ns: str, operator: OperatorProcess
) -> None:
    # Engines may be built ahead of the fleet (spec.engine.gpuProducts); until a node of the
    # product exists the Job's pod cannot be placed, and the service relays the scheduler.
    cluster.apply(ns, service("ahead", engine={"gpuProducts": ["NVIDIA-A100-SXM4-80GB"]}))

    def waiting() -> dict[str, Any] | None:
        engines = cvs(cluster, ns, "ahead").get("status", {}).get("engines") or []
        return engines[0] if engines and "waits for a GPU node" in engines[0]["message"] else None

    entry = wait_for("the scheduler's reason", waiting, timeout=120)
    assert entry["state"] == "Pending" and entry["gpuArch"] == "sm_80"
    assert "node affinity" in entry["message"] or "didn't match" in entry["message"]
    assert cvs(cluster, ns, "ahead")["status"]["phase"] == "BuildingEngine"
    assert len(jobs(cluster, ns)) == 1


def test_a_job_the_api_server_refuses_is_reported_on_the_service(
    cluster: Cluster, ns: str, operator: OperatorProcess
) -> None:
    # A toleration the Job API rejects (a value with operator Exists): the service must
    # say so, not leave it in the operator's log, and must not post an Event per resync.
    bad = [{"key": "example.com/x", "operator": "Exists", "value": "y", "effect": "NoSchedule"}]
    cluster.apply(ns, service("refused", serving={"nodeSelector": L20, "tolerations": bad}))

    def refused() -> dict[str, Any] | None:
        c = condition(cvs(cluster, ns, "refused"), "EngineReady")
        return c if c.get("reason") == "JobCreateFailed" else None

    cond = wait_for("EngineReady reason JobCreateFailed", refused, timeout=120)
    assert cond["status"] == "False"
    assert "the API server refused build Job cvs-engine-sm89-" in cond["message"]
    assert "422" in cond["message"] and "tolerations" in cond["message"]
    assert cvs(cluster, ns, "refused")["status"]["phase"] == "BuildingEngine"
    # The operator retries the refused create with a doubling backoff (0.5 s, 1 s, 2 s, ...):
    # wait for two more refusals at the API server, then there must still be one Event.
    refused_before = refused_job_creates(cluster)
    wait_for(
        "two more refused Job creates",
        lambda: refused_job_creates(cluster) >= refused_before + 2,
        timeout=60,
    )
    assert jobs(cluster, ns) == []
    events = cluster.kubectl(
        "get", "events", "-n", ns, "--field-selector", "involvedObject.name=refused", "-o", "json"
    ).stdout
    refusals = [e for e in json.loads(events)["items"] if e["reason"] == "JobCreateFailed"]
    assert len(refusals) == 1

    # Fixed in the spec: the Job is made and the engine is built.
    cluster.kubectl(
        "patch",
        "cvs",
        "refused",
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"serving": {"tolerations": []}}}),
    )
    wait_engine_ready(cluster, ns, "refused")
    assert len(jobs(cluster, ns)) == 1


def test_a_cache_claim_deleted_and_created_again_is_built_into_anew(
    cluster: Cluster, ns: str, operator: OperatorProcess
) -> None:
    # The new claim of the same name is empty: the engine recorded in the old one must
    # not count as built, or serving would find no files.
    # No serving pods (replicas 0): they would hold the claim too, as on a real cluster.
    cluster.apply(ns, service("recreated", replicas=0, serving={"nodeSelector": L20}))
    first = wait_engine_ready(cluster, ns, "recreated")
    [old_job] = jobs(cluster, ns)
    # The finished build pod still holds the claim (PVC protection), as on a real cluster:
    # its Job goes first.
    cluster.kubectl("delete", "jobs", "--all", "-n", ns, "--cascade=foreground", "--timeout=60s")
    cluster.kubectl("delete", "pvc", "cosyvoice-engines", "-n", ns, "--timeout=60s")
    wait_for(
        "CacheClaimMissing",
        lambda: (
            condition(cvs(cluster, ns, "recreated"), "EngineReady").get("reason")
            == "CacheClaimMissing"
        ),
    )
    cluster.apply(ns, cache_claim())
    second = wait_engine_ready(cluster, ns, "recreated")
    assert second["status"]["engines"][0]["key"] == first["status"]["engines"][0]["key"]
    new_jobs = jobs(cluster, ns)
    assert len(new_jobs) == 1  # one new build, into the new claim
    claim_uid = get_json(cluster, "pvc", "cosyvoice-engines", "-n", ns)["metadata"]["uid"]
    annotations = new_jobs[0]["metadata"]["annotations"]
    assert annotations["tts.cosyvoice.dev/cache-claim-uid"] == claim_uid
    assert new_jobs[0]["metadata"]["name"] != old_job["metadata"]["name"]


def test_with_peering_one_replica_acts_and_a_standby_takes_over(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    # Two replicas as the chart runs them with peering.enabled: the control loop acts only
    # in the replica of the highest priority; when it dies, the other
    # takes over once its peering entry lapses.
    cluster.kubectl("apply", "-f", str(MANIFESTS / "kopf-peering-crds.yaml"))
    cluster.local.wait_established("kopfpeerings.kopf.dev")
    cluster.apply(ns, json.dumps({"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                                  "metadata": {"name": "cvs"}}))  # fmt: skip
    fast = {"COSYVOICE_PEERING_LIFETIME_SECONDS": "10"}
    (tmp_path / "low").mkdir()
    (tmp_path / "high").mkdir()
    low = OperatorProcess(cluster, ns, tmp_path / "low", "--peering", "cvs", "--priority", "10")
    high = OperatorProcess(cluster, ns, tmp_path / "high", "--peering", "cvs", "--priority", "20")
    low.env.update(fast)
    high.env.update(fast)
    low.start()
    high.start()
    try:
        wait_for(
            "the low-priority replica to stand by",
            lambda: "standing by: peer" in low.log(whole=True),
            timeout=60,
        )
        cluster.apply(ns, service("peered", serving={"nodeSelector": L20}))
        wait_engine_ready(cluster, ns, "peered", timeout=90)
        assert len(jobs(cluster, ns)) == 1
        assert "created Job cvs-engine-" in high.log(whole=True)
        assert "created Job" not in low.log(whole=True)  # the standby did nothing

        seen = len(low.log(whole=True))
        high.kill()
        wait_for(
            "the standby to take over",
            lambda: "active: priority 10" in low.log(whole=True)[seen:],
            timeout=60,
        )
        # It acts now: a new engine gets its Job from the former standby.
        cluster.kubectl(
            "patch",
            "cvs",
            "peered",
            "-n",
            ns,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"engine": {"maxBatchSize": 32}}}),
        )
        wait_for("a second Job", lambda: len(jobs(cluster, ns)) == 2, timeout=60)
        assert "created Job cvs-engine-" in low.log(whole=True)
    finally:
        low.stop()
        high.stop()
