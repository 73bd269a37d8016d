"""The operator's own metrics: what each call site records, read back from the registry and
from the text a scrape returns."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any, cast

import pytest
from prometheus_client import REGISTRY, generate_latest

from cosyvoice_operator.plan import cleanup
from cosyvoice_operator.plan.service import Policy
from cosyvoice_operator.shell import caches, metrics
from cosyvoice_operator.shell.controller import Controller, Settings
from cosyvoice_operator.shell.kube import Kube, KubeError


def value(name: str, **labels: str) -> float:
    found = REGISTRY.get_sample_value(name, labels)
    return float(found or 0.0)


def job(conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "cvs-engine-sm89-abc-a1",
            "namespace": "ml",
            "creationTimestamp": "2026-12-03T10:00:00Z",
            "labels": {"app.kubernetes.io/component": "engine-build"},
        },
        "status": {"conditions": conditions or []},
    }


COMPLETE = [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-12-03T10:42:30Z"}]
FAILED = [{"type": "Failed", "status": "True", "lastTransitionTime": "2026-12-03T10:00:05Z"}]


def test_every_name_is_prefixed_and_carries_its_unit() -> None:
    text = generate_latest(REGISTRY).decode()
    ours = dict(re.findall(r"^# TYPE (cosyvoice_\S+) (\S+)", text, re.M))
    assert {
        "cosyvoice_reconciles_total": "counter",
        "cosyvoice_reconcile_duration_seconds": "histogram",
        "cosyvoice_api_requests_total": "counter",
        "cosyvoice_api_request_duration_seconds": "histogram",
        "cosyvoice_engine_builds_started_total": "counter",
        "cosyvoice_engine_build_duration_seconds": "histogram",
        "cosyvoice_service_engines": "gauge",
        "cosyvoice_service_queue_latency_target_seconds": "gauge",
    }.items() <= ours.items()
    for name, kind in ours.items():
        if name.endswith("_created"):
            continue  # prometheus_client's creation timestamps of counters and histograms
        if kind == "counter":
            assert name.endswith("_total"), name
        if kind == "histogram" or "latency" in name or "duration" in name:
            assert name.endswith("_seconds"), f"{name}: a time must be in seconds"


def test_a_build_job_is_counted_once_when_it_ends_live_not_when_relisted() -> None:
    before = value("cosyvoice_engine_builds_finished_total", outcome="succeeded")
    count = value("cosyvoice_engine_build_duration_seconds_count", outcome="succeeded")
    total = value("cosyvoice_engine_build_duration_seconds_sum", outcome="succeeded")
    # A restart lists Jobs that finished long ago: (None, finished) is not an end seen live.
    assert metrics.build_finished(None, job(COMPLETE)) is None
    # Running -> running, and finished -> finished (a later update): nothing.
    assert metrics.build_finished(job(), job()) is None
    assert metrics.build_finished(job(COMPLETE), job(COMPLETE)) is None
    assert metrics.build_finished(job(), job(COMPLETE)) == ("succeeded", 2550.0)
    assert metrics.build_finished(job(), job(FAILED)) == ("failed", 5.0)
    # A condition that is not True is no end.
    not_yet = [{**FAILED[0], "status": "False"}]
    assert metrics.build_finished(job(), job(not_yet)) is None

    c = Controller(cast(Kube, object()), ("ml",), Settings(Policy(), cleanup.CleanupSettings()))

    async def events() -> None:
        c.router.on_job(None, caches.trim_job(job()))
        c.router.on_job(caches.trim_job(job()), caches.trim_job(job(COMPLETE)))
        c.router.on_job(None, caches.trim_job(job(COMPLETE)))  # a relist after a restart

    asyncio.run(events())
    assert value("cosyvoice_engine_builds_finished_total", outcome="succeeded") == before + 1
    assert value("cosyvoice_engine_build_duration_seconds_count", outcome="succeeded") == count + 1
    assert value("cosyvoice_engine_build_duration_seconds_sum", outcome="succeeded") == (
        total + 2550.0
    )


@pytest.mark.parametrize(
    ("entry", "state"),
    [
        ({"key": "k", "state": "Ready"}, "Ready"),
        ({"key": "k", "state": "Building"}, "Building"),
        ({"key": "k", "state": "Pending"}, "Pending"),
        ({"key": "k", "state": "Failed", "nextRetryTime": "2026-12-03T10:00:00Z"}, "Retrying"),
        ({"key": "k", "state": "Failed"}, "GaveUp"),
        ({"key": "", "state": "Failed", "message": "unknown GPU product"}, "Unsupported"),
    ],
)
def test_engine_states_tell_a_retry_from_a_give_up(entry: dict[str, Any], state: str) -> None:
    counts = metrics.engine_states([entry, {"key": "r", "state": "Ready"}])
    assert counts[state] == 1 + (state == "Ready")
    assert sum(counts.values()) == 2
    assert set(counts) == set(metrics.ENGINE_STATES)


def test_a_services_series_go_with_it() -> None:
    status = {"engines": [{"key": "k", "state": "Failed"}, {"key": "j", "state": "Ready"}]}
    metrics.record_engines("ml", "gone", status)
    metrics.record_autoscaling_spec("ml", "gone", 250.0, 1, 3, 2)
    metrics.record_evaluation("ml", "gone", "hold", "Active", 3, 3, None, "NoData")
    assert value("cosyvoice_service_engines", namespace="ml", service="gone", state="GaveUp") == 1
    assert value("cosyvoice_service_engines", namespace="ml", service="gone", state="Ready") == 1
    assert value("cosyvoice_service_engines", namespace="ml", service="gone", state="Pending") == 0
    labels = {"namespace": "ml", "service": "gone"}
    assert value("cosyvoice_service_queue_latency_target_seconds", **labels) == 0.25
    assert value("cosyvoice_service_max_replicas", **labels) == 3
    assert value("cosyvoice_service_scaling_conflict", **labels) == 2
    assert value("cosyvoice_service_metrics_available", **labels) == 0
    metrics.forget_service("ml", "gone")
    text = generate_latest(REGISTRY).decode()
    assert 'service="gone"' not in text


def test_passes_are_counted_by_kind_and_outcome() -> None:
    def bucket(le: str) -> float:
        return value("cosyvoice_reconcile_duration_seconds_bucket", kind="autoscale", le=le)

    before = value("cosyvoice_reconciles_total", kind="service", outcome="retry")
    seen = value("cosyvoice_reconcile_duration_seconds_count", kind="autoscale")
    under, at = bucket("0.25"), bucket("0.5")
    metrics.record_pass("service", "retry", 0.02)
    metrics.record_pass("scale", "success", 0.4)
    assert value("cosyvoice_reconciles_total", kind="service", outcome="retry") == before + 1
    assert value("cosyvoice_reconcile_duration_seconds_count", kind="autoscale") == seen + 1
    assert bucket("0.25") == under and bucket("0.5") == at + 1


class FakeResponse:
    def __init__(self, status: int) -> None:
        self.status = status


class FakeRest:
    def __init__(self, answers: list[int | Exception]) -> None:
        self.answers = answers

    async def request(self, *args: Any, **kwargs: Any) -> Any:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return type("Wrapped", (), {"response": FakeResponse(answer)})()


class FakeConfiguration:
    host = "https://127.0.0.1:6443"


class FakeApi:
    def __init__(self, answers: list[int | Exception]) -> None:
        self.rest_client = FakeRest(answers)
        self.default_headers: dict[str, str] = {}
        self.configuration = FakeConfiguration()

    async def update_params_for_auth(self, *args: Any) -> None:
        return None


@pytest.fixture
def kube() -> Iterator[Kube]:
    yield Kube(cast(Any, FakeApi([200, 409, OSError("connection refused"), 200])))


def test_api_requests_are_counted_by_verb_resource_and_outcome(kube: Kube) -> None:
    jobs = "/apis/batch/v1/namespaces/ml/jobs"
    labels = {"resource": "jobs"}
    ok = value("cosyvoice_api_requests_total", verb="POST", outcome="2xx", **labels)
    conflict = value("cosyvoice_api_requests_total", verb="POST", outcome="4xx", **labels)
    failed = value("cosyvoice_api_requests_total", verb="DELETE", outcome="error", **labels)
    watches = value("cosyvoice_api_requests_total", verb="WATCH", outcome="2xx", **labels)

    async def calls() -> None:
        await kube._send("POST", jobs, body={})
        await kube._send("POST", jobs, body={})
        with pytest.raises(KubeError):
            await kube._send("DELETE", jobs + "/x")
        await kube._send("GET", jobs, {"watch": True})

    asyncio.run(calls())
    assert value("cosyvoice_api_requests_total", verb="POST", outcome="2xx", **labels) == ok + 1
    assert (
        value("cosyvoice_api_requests_total", verb="POST", outcome="4xx", **labels) == conflict + 1
    )
    assert (
        value("cosyvoice_api_requests_total", verb="DELETE", outcome="error", **labels)
        == failed + 1
    )
    assert (
        value("cosyvoice_api_requests_total", verb="WATCH", outcome="2xx", **labels) == watches + 1
    )
    # The liveness report's own counts agree.
    assert kube.requests[("POST", "jobs")] == 2 and kube.requests[("WATCH", "jobs")] == 1


@pytest.mark.parametrize(
    ("status", "outcome"), [(0, "error"), (200, "2xx"), (201, "2xx"), (404, "4xx"), (503, "5xx")]
)
def test_outcome_of_status(status: int, outcome: str) -> None:
    assert metrics.outcome_of_status(status) == outcome
