"""The operator's own metrics, on `/metrics` with `cosyvoice-operator run --metrics-port PORT`
(the official prometheus_client; every name prefixed `cosyvoice_`, units in the names).

Labels are bounded: kinds of work, outcomes, verbs, resources, directions, reasons and engine
states are fixed sets; `namespace`/`service` are as many as there are services, and a
service's series go when it goes (:func:`forget`, :func:`forget_service`).

Everything here is a definition or a small function the shell calls with plain values
(controller.py, kube.py), so that instrumenting a call site is one line. The chart's alerts
and dashboard (charts/cosyvoice-operator/templates/) read these names; a rename here is a
rename there.

Scraped through the chart's ServiceMonitor with `honorLabels: true`: the `namespace` and
`service` of the per-service series are the CosyVoiceService's, not the operator pod's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

# ---- the autoscaler ------------------------------------------------------------------------

DECISIONS = Counter(
    "cosyvoice_autoscaler_decisions_total",
    "Autoscaling evaluations by the direction they decided (up, down, hold) and mode.",
    ["direction", "mode"],
)
METRICS_UNAVAILABLE = Counter(
    "cosyvoice_autoscaler_metrics_unavailable_total",
    "Evaluations that found no usable metrics, by reason (NoData, Stale, NotANumber, "
    "QueryFailed, Unreachable, NoPrometheusURL, NoReadyPods).",
    ["reason"],
)
DESIRED = Gauge(
    "cosyvoice_service_desired_replicas",
    "Replicas the autoscaler wants for a service (reported in DryRun, applied in Active).",
    ["namespace", "service"],
)
READY = Gauge(
    "cosyvoice_service_ready_replicas",
    "Ready Triton replicas of a service, as the autoscaler last saw them.",
    ["namespace", "service"],
)
QUEUE_LATENCY = Gauge(
    "cosyvoice_service_queue_latency_seconds",
    "Average queue time per request of a service's orchestrator model, last observed.",
    ["namespace", "service"],
)
QUEUE_LATENCY_TARGET = Gauge(
    "cosyvoice_service_queue_latency_target_seconds",
    "The service's spec.autoscaling.targetQueueLatencyMilliseconds, in seconds.",
    ["namespace", "service"],
)
MIN_REPLICAS = Gauge(
    "cosyvoice_service_min_replicas",
    "The service's spec.autoscaling.minReplicas.",
    ["namespace", "service"],
)
MAX_REPLICAS = Gauge(
    "cosyvoice_service_max_replicas",
    "The service's spec.autoscaling.maxReplicas.",
    ["namespace", "service"],
)
METRICS_AVAILABLE = Gauge(
    "cosyvoice_service_metrics_available",
    "1 when the autoscaler's last evaluation of the service had usable metrics, else 0.",
    ["namespace", "service"],
)
SCALING_CONFLICT = Gauge(
    "cosyvoice_service_scaling_conflict",
    "Other autoscalers (HPAs) that target the service's Deployments while its autoscaler runs.",
    ["namespace", "service"],
)
UTTERANCES_PER_STREAM = Gauge(
    "cosyvoice_operator_utterances_per_stream",
    "Utterances a service's clients send per gRPC stream over the autoscaler's rate window "
    "(orchestrator requests over the router's streams; mode Router only). Above 1, the "
    "utterances of a stream stay on one pod: open one stream per utterance.",
    ["namespace", "service"],
)
ACTIVE = Gauge(
    "cosyvoice_operator_active",
    "1 when this operator replica acts (it is the active peer), 0 while it stands by.",
)

# ---- the control loop ----------------------------------------------------------------------

# Work queue key kinds (routing.Key.kind) as the metrics name them.
PASS_KINDS = {"service": "service", "scale": "autoscale", "cleanup": "cleanup"}
# success: done; retry: tried again with backoff (a conflict, a refused write); error: raised.
PASS_OUTCOMES = ("success", "retry", "error")

RECONCILES = Counter(
    "cosyvoice_reconciles_total",
    "Passes of the control loop by kind (service, autoscale, cleanup) and outcome "
    "(success, retry: again with backoff after a conflict or a refused write, error).",
    ["kind", "outcome"],
)
RECONCILE_SECONDS = Histogram(
    "cosyvoice_reconcile_duration_seconds",
    "Time one pass of the control loop took, by kind.",
    ["kind"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

# ---- the API server ------------------------------------------------------------------------

API_REQUESTS = Counter(
    "cosyvoice_api_requests_total",
    "Requests to the Kubernetes API server by verb (WATCH for watches), resource and outcome "
    "(the status class 2xx, 3xx, 4xx, 5xx, or error when no answer came).",
    ["verb", "resource", "outcome"],
)
API_SECONDS = Histogram(
    "cosyvoice_api_request_duration_seconds",
    "Time until the API server's answer began (for a watch: until it was accepted), by verb.",
    ["verb"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

# ---- engines -------------------------------------------------------------------------------

# status.engines[].state, with "Failed" told apart: Retrying (another attempt is scheduled),
# GaveUp (no more attempts: someone must act) and Unsupported (a GPU product the operator
# cannot build for: unknown, or the precision cannot run there).
ENGINE_STATES = ("Pending", "Building", "Ready", "Retrying", "GaveUp", "Unsupported")
BUILD_OUTCOMES = ("succeeded", "failed")

BUILDS_STARTED = Counter(
    "cosyvoice_engine_builds_started_total",
    "Engine build Jobs the operator created (each attempt is one).",
)
BUILDS_FINISHED = Counter(
    "cosyvoice_engine_builds_finished_total",
    "Engine build Jobs seen finishing, by outcome (succeeded, failed).",
    ["outcome"],
)
BUILD_SECONDS = Histogram(
    "cosyvoice_engine_build_duration_seconds",
    "Time from a build Job's creation to its end, by outcome (succeeded, failed).",
    ["outcome"],
    buckets=(5, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800),
)
SERVICE_ENGINES = Gauge(
    "cosyvoice_service_engines",
    "A service's engines (one per GPU product of status.engines) by state: Pending, Building, "
    "Ready, Retrying, GaveUp, Unsupported.",
    ["namespace", "service", "state"],
)


# Series that exist from the start at 0, so that "no failure yet" reads 0, not "no data"
# (rates and ratios over them then have a value; alerts on them are not blind).
for _kind in PASS_KINDS.values():
    RECONCILE_SECONDS.labels(kind=_kind)
    for _outcome in PASS_OUTCOMES:
        RECONCILES.labels(kind=_kind, outcome=_outcome)
for _outcome in BUILD_OUTCOMES:
    BUILDS_FINISHED.labels(outcome=_outcome)
    BUILD_SECONDS.labels(outcome=_outcome)


def serve(port: int, address: str = "0.0.0.0") -> None:
    start_http_server(port, addr=address)


# ---- what the shell calls ------------------------------------------------------------------


def record_evaluation(
    namespace: str,
    service: str,
    direction: str,
    mode: str,
    desired: int,
    ready: int,
    queue_latency_ms: float | None,
    unavailable_reason: str,
) -> None:
    DECISIONS.labels(direction=direction, mode=mode).inc()
    DESIRED.labels(namespace=namespace, service=service).set(desired)
    READY.labels(namespace=namespace, service=service).set(ready)
    METRICS_AVAILABLE.labels(namespace=namespace, service=service).set(
        0 if unavailable_reason else 1
    )
    if queue_latency_ms is not None:
        QUEUE_LATENCY.labels(namespace=namespace, service=service).set(queue_latency_ms / 1000)
    if unavailable_reason:
        METRICS_UNAVAILABLE.labels(reason=unavailable_reason).inc()


def record_autoscaling_spec(
    namespace: str,
    service: str,
    target_ms: float,
    min_replicas: int,
    max_replicas: int,
    conflicts: int,
) -> None:
    """What the alerts compare the observations with: the target and the bounds, and how many
    other autoscalers write the same replica count."""
    QUEUE_LATENCY_TARGET.labels(namespace=namespace, service=service).set(target_ms / 1000)
    MIN_REPLICAS.labels(namespace=namespace, service=service).set(min_replicas)
    MAX_REPLICAS.labels(namespace=namespace, service=service).set(max_replicas)
    SCALING_CONFLICT.labels(namespace=namespace, service=service).set(conflicts)


_AUTOSCALER_GAUGES = (
    DESIRED,
    READY,
    QUEUE_LATENCY,
    QUEUE_LATENCY_TARGET,
    MIN_REPLICAS,
    MAX_REPLICAS,
    METRICS_AVAILABLE,
    SCALING_CONFLICT,
    UTTERANCES_PER_STREAM,
)


def record_utterances_per_stream(namespace: str, service: str, value: float | None) -> None:
    """The service's utterances per stream; no figure (no router, no traffic, no data)
    removes the series rather than keep a stale one."""
    if value is None:
        with contextlib.suppress(KeyError):
            UTTERANCES_PER_STREAM.remove(namespace, service)
        return
    UTTERANCES_PER_STREAM.labels(namespace=namespace, service=service).set(value)


def forget(namespace: str, service: str) -> None:
    """A service gone, or its autoscaler off: its autoscaler series go too (no stale gauges
    for deleted services, no alert on a target nobody asks for any more)."""
    for gauge in _AUTOSCALER_GAUGES:
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, service)


def record_pass(key_kind: str, outcome: str, seconds: float) -> None:
    """One pass of the control loop (key_kind: the work queue key's first element)."""
    kind = PASS_KINDS.get(key_kind, "other")
    RECONCILES.labels(kind=kind, outcome=outcome).inc()
    RECONCILE_SECONDS.labels(kind=kind).observe(seconds)


def outcome_of_status(status: int) -> str:
    """The outcome label of an API answer's HTTP status; 0 means no answer came."""
    if status <= 0:
        return "error"
    return f"{status // 100}xx"


def record_request(verb: str, resource: str, status: int, seconds: float) -> None:
    API_REQUESTS.labels(verb=verb, resource=resource, outcome=outcome_of_status(status)).inc()
    API_SECONDS.labels(verb=verb).observe(seconds)


def engine_states(engines: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """status.engines counted by state (every state present, zeros included)."""
    counts = dict.fromkeys(ENGINE_STATES, 0)
    for entry in engines:
        state = str(entry.get("state") or "Pending")
        if state == "Failed":
            if not entry.get("key"):
                state = "Unsupported"
            elif entry.get("nextRetryTime"):
                state = "Retrying"
            else:
                state = "GaveUp"
        if state in counts:
            counts[state] += 1
    return counts


def record_engines(namespace: str, service: str, status: Mapping[str, Any]) -> None:
    """The engines of a service as its status (the one just written, or the cached one) says."""
    for state, n in engine_states(status.get("engines") or []).items():
        SERVICE_ENGINES.labels(namespace=namespace, service=service, state=state).set(n)


def forget_service(namespace: str, service: str) -> None:
    """A service gone: every series of it goes."""
    forget(namespace, service)
    for state in ENGINE_STATES:
        with contextlib.suppress(KeyError):
            SERVICE_ENGINES.remove(namespace, service, state)


def record_build_started() -> None:
    BUILDS_STARTED.inc()


def _time(text: Any) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def _finished(job: Mapping[str, Any]) -> tuple[str, dt.datetime | None] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return "succeeded", _time(cond.get("lastTransitionTime"))
        if cond.get("type") == "Failed":
            return "failed", _time(cond.get("lastTransitionTime"))
    return None


def build_finished(
    old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
) -> tuple[str, float | None] | None:
    """(outcome, seconds from creation to the end, None when unknown) when this change of a
    build Job is its end, seen live: a Job already finished when the operator first lists it
    (a restart) is not counted again."""
    if old is None or new is None or _finished(old) is not None:
        return None
    end = _finished(new)
    if end is None:
        return None
    outcome, at = end
    created = _time((new.get("metadata") or {}).get("creationTimestamp"))
    seconds = (at - created).total_seconds() if at and created else None
    return outcome, seconds if seconds is None or seconds >= 0 else None


def record_build_finished(outcome: str, seconds: float | None) -> None:
    BUILDS_FINISHED.labels(outcome=outcome).inc()
    if seconds is not None:
        BUILD_SECONDS.labels(outcome=outcome).observe(seconds)
