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
