"""The operator's own metrics, on `/metrics` with `cosyvoice-operator run --metrics-port PORT`
(the official prometheus_client; every name prefixed `cosyvoice_`, units in the names, labels
bounded: directions and reasons are fixed sets, services are as many as there are services).

This is the part the autoscaler needs (decisions, desired and ready replicas, observed queue
latency, metrics-source errors, whether this replica is the active one); the rest of the
operator's metrics (reconciles, API calls, builds) belong to the observability work.
"""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, start_http_server

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
ACTIVE = Gauge(
    "cosyvoice_operator_active",
    "1 when this operator replica acts (it is the active peer), 0 while it stands by.",
)


def serve(port: int, address: str = "0.0.0.0") -> None:
    start_http_server(port, addr=address)


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
    if queue_latency_ms is not None:
        QUEUE_LATENCY.labels(namespace=namespace, service=service).set(queue_latency_ms / 1000)
    if unavailable_reason:
        METRICS_UNAVAILABLE.labels(reason=unavailable_reason).inc()


def forget(namespace: str, service: str) -> None:
    """A service gone: its series go too (no stale gauges for deleted services)."""
    for gauge in (DESIRED, READY, QUEUE_LATENCY):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, service)
