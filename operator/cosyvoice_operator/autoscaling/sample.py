"""One reading of a service's serving metrics, as the autoscaler sees it: the numbers, or the
reason there are none. Made by the shell's Prometheus source (``shell.prometheus_source``,
which documents each field and reason); kept here, with no I/O stack, so that the pure
evaluation and the simulator can take it.
"""

from __future__ import annotations

from dataclasses import dataclass

NO_DATA = "NoData"
STALE = "Stale"
NOT_A_NUMBER = "NotANumber"
QUERY_FAILED = "QueryFailed"
UNREACHABLE = "Unreachable"
# The URL is not one the operator is configured to query (no request was made).
NOT_ALLOWED = "PrometheusNotAllowed"


@dataclass(frozen=True)
class Sample:
    available: bool
    # "" | NoData | Stale | NotANumber | QueryFailed | Unreachable | PrometheusNotAllowed
    unavailable_reason: str
    message: str
    queue_latency_ms: float | None
    pending_requests: float | None
    in_flight: float | None
    completion_rate: float | None
    no_traffic: bool
    first_response_p95_ms: float | None
    pods_seen: int  # how many of the given pods had fresh series


def unavailable(reason: str, message: str, pods_seen: int = 0) -> Sample:
    return Sample(
        available=False,
        unavailable_reason=reason,
        message=message,
        queue_latency_ms=None,
        pending_requests=None,
        in_flight=None,
        completion_rate=None,
        no_traffic=False,
        first_response_p95_ms=None,
        pods_seen=pods_seen,
    )


@dataclass(frozen=True)
class RouterSample:
    """One reading of a service's router pods (HAProxy's Prometheus exporter, backend
    ``triton``), summed over the router replicas; or the reason there is none.

    ``in_flight``: streams on the Triton pods now (``haproxy_server_current_sessions``);
    ``queued``: streams waiting in the router's backend queue now
    (``haproxy_backend_current_queue``); ``stream_rate``: streams arriving per second over the
    window (``haproxy_backend_sessions_total``: HAProxy 2.6 counts a stream when it reaches the
    backend, before it queues, so the rate is the demand and does not flatten at the fleet's
    capacity); ``completed_stream_rate``: streams ended per second
    (``haproxy_backend_http_requests_total``, counted when a stream ends: measured on
    2.6.12, 3 streams open read 0 until they closed); ``slots_per_pod``: the streams the
    routers let one Triton pod hold (each router's per-server ``maxconn``,
    ``haproxy_server_limit_sessions``, summed over the routers), None when no limit is
    set; ``active_servers``: Triton pods a router sees up (the most any router does)."""

    available: bool
    unavailable_reason: str
    message: str
    in_flight: float | None
    queued: float | None
    stream_rate: float | None
    slots_per_pod: float | None
    active_servers: float | None
    routers_seen: int
    completed_stream_rate: float | None = None


def router_unavailable(reason: str, message: str, routers_seen: int = 0) -> RouterSample:
    return RouterSample(
        available=False,
        unavailable_reason=reason,
        message=message,
        in_flight=None,
        queued=None,
        stream_rate=None,
        slots_per_pod=None,
        active_servers=None,
        routers_seen=routers_seen,
    )
