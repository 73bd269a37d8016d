"""What Prometheus says about one service's Triton pods: the autoscaler's only input.

``await PrometheusSource(url).sample(namespace, pods, model)`` reads, over the pods given
(the service's Ready pods) and the orchestrator model only:

- ``queue_latency_ms``: time a request waited in Triton's queue, per completed request over
  the window (``nv_inference_queue_duration_us`` over ``nv_inference_request_success``).
  The divisor is clamped to a tiny epsilon, not to 1: a TTS fleet can complete fewer than
  one request per second, and a clamp at 1 would then under-report the wait;
- ``pending_requests``: queued requests now (``nv_inference_pending_request_count``), the
  only signal that leads, since Triton updates its counters when a request completes;
- ``in_flight``: requests in the system on average, by Little's law (the rate of request
  time, ``nv_inference_request_duration_us``, is the mean number of requests in progress);
- ``completion_rate``: completed requests per second;
- ``first_response_p95_ms``: the 95th percentile of time to first response, when Triton
  exports its first-response histogram (off by default, and absent for Python-backend
  decoupled models on Triton 2.51); else None.

The point of the module is to never turn "Prometheus does not know" into a number. A sample
is ``available`` only when the pods' series are there and fresh; otherwise it says why:

- ``NoData``: no series for these pods (not scraped, not labelled ``namespace``/``pod``,
  the target stopped and its series went stale, or too few samples for a rate yet);
- ``Stale``: series exist, but the newest sample is older than ``stale_seconds``
  (Prometheus stopped scraping without marking them stale, e.g. across its own restart);
- ``NotANumber``: a signal came back NaN or infinite;
- ``QueryFailed``: Prometheus answered with an error (a bad query, a 5xx);
- ``Unreachable``: no connection, or no answer within ``timeout_seconds``.

"No traffic" is different from all of these: fresh series whose rates and gauge are all 0
give an available sample with ``no_traffic`` set and a queue latency of 0.

Freshness is judged first, per pod, from the gauge (an instant selector honours Prometheus'
staleness markers, so a target that stopped answering drops out at once); the rates are then
taken over the fresh pods only, so that a pod that stopped does not keep contributing its
last minute of counters. ``pods_seen`` counts those fresh pods: the number to divide by for
a per-pod figure. (A pod that just started is seen from its first scrape; its rates join the
sums once it has two samples in the window.) What ``stale_seconds`` cannot catch: samples
younger than it that no marker ended, i.e. for up to ``stale_seconds`` after Prometheus
restarts, a target it no longer scrapes still reads as its last samples; keep it to a few
scrape intervals.

The client (prometheus-api-client) blocks: every sample runs in a worker thread
(``asyncio.to_thread``), one client per thread, under an overall timeout.

What a Prometheus says reaches status conditions and Events that anyone who can read the
service sees, so messages carry only what the operator knows: the query, the URL without
credentials, an HTTP status code and its standard reason phrase, never a body (a URL that
answers with a secret must not get it published). An answer that is not the shape of
``/api/v1/query``'s (200 without ``data``, not JSON, elements without values) is no data.
``await source.sample_router(namespace, routers)`` reads the router pods of a service in
mode Router (HAProxy's Prometheus exporter, backend ``triton``), summed over the router
replicas, into a :class:`RouterSample`: streams in flight on the Triton pods
(``haproxy_server_current_sessions``), streams queued in the router
(``haproxy_backend_current_queue``), streams arriving per second
(``haproxy_backend_sessions_total``, counted as a stream reaches the backend) and ending per
second (``haproxy_backend_http_requests_total``, counted when it ends), the per-pod slot
limit (each router's ``haproxy_server_limit_sessions``, summed over routers) and the servers up
(``haproxy_backend_active_servers``). Not ``haproxy_backend_queue_time_average_seconds``:
an average over the last 1024 streams that HAProxy 2.6 divides by 1024 while fewer have
passed, so it reads too low while a router warms up. Freshness, NoData, Stale and the other
reasons are judged as for Triton, per router pod, from the queue gauge.

:class:`PrometheusSources` is what the autoscaler holds: only the URLs the operator is
configured to allow (a service's ``prometheusUrl`` is otherwise a request from the
operator's pod to anywhere), and a bounded set of clients that closes those it drops.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import math
import re
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from cosyvoice_operator.autoscaling.sample import (
    NO_DATA,
    NOT_A_NUMBER,
    NOT_ALLOWED,
    QUERY_FAILED,
    STALE,
    UNREACHABLE,
    RouterSample,
    Sample,
    router_unavailable,
    unavailable,
)


class _NoRetryNotes(logging.Filter):
    """urllib3 logs a warning for each retry of a refused connection ("Retrying (Retry(...))
    after connection broken ..."): with Prometheus down, one per evaluation per service. The
    outcome is the sample's (MetricsAvailable says why, with the URL); the note is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Retrying (")


logging.getLogger("urllib3.connectionpool").addFilter(_NoRetryNotes())

__all__ = [
    "NOT_ALLOWED",
    "NOT_A_NUMBER",
    "NO_DATA",
    "QUERY_FAILED",
    "STALE",
    "UNREACHABLE",
    "PrometheusSource",
    "PrometheusSources",
    "Sample",
    "unavailable",
]

# Triton's metric names (port 8002, /metrics).
PENDING = "nv_inference_pending_request_count"
SUCCESS = "nv_inference_request_success"
QUEUE_US = "nv_inference_queue_duration_us"
REQUEST_US = "nv_inference_request_duration_us"
FIRST_RESPONSE_BUCKET = "nv_inference_first_response_histogram_ms_bucket"
# Completions per second below which the queue-time ratio stops dividing (see the docstring).
EPSILON = 1e-6
FIRST_RESPONSE_QUANTILE = 0.95
# HAProxy's Prometheus exporter (the router pods, port 8404), backend `triton` (gRPC).
ROUTER_BACKEND = "triton"
ROUTER_QUEUE = "haproxy_backend_current_queue"
ROUTER_SESSIONS = "haproxy_server_current_sessions"
ROUTER_ARRIVALS = "haproxy_backend_sessions_total"
ROUTER_REQUESTS = "haproxy_backend_http_requests_total"
ROUTER_LIMIT = "haproxy_server_limit_sessions"
ROUTER_ACTIVE = "haproxy_backend_active_servers"


class QueryClient(Protocol):
    """The one call of ``PrometheusConnect`` used here (a fake stands in for it in tests)."""

    def custom_query(self, query: str) -> Any: ...


# ---- PromQL (pure) -----------------------------------------------------------------------

_REGEX_SPECIAL = set("\\.^$|?*+()[]{}")


def _string(value: str) -> str:
    """A PromQL double-quoted string literal."""
    return json.dumps(value)


def pod_regex(pods: Sequence[str]) -> str:
    """An anchored regular expression matching exactly these pod names."""
    escaped = ("".join("\\" + c if c in _REGEX_SPECIAL else c for c in p) for p in sorted(pods))
    return "^(" + "|".join(escaped) + ")$"


def selector(namespace: str, pods: Sequence[str], model: str) -> str:
    """The label matchers of one service's pods and one model, inside ``{...}``."""
    return f"namespace={_string(namespace)},pod=~{_string(pod_regex(pods))},model={_string(model)}"


def router_selector(namespace: str, routers: Sequence[str]) -> str:
    """The label matchers of one service's router pods and its gRPC backend."""
    return (
        f"namespace={_string(namespace)},pod=~{_string(pod_regex(routers))},"
        f"proxy={_string(ROUTER_BACKEND)}"
    )


@dataclass(frozen=True)
class RouterQueries:
    """The PromQL of one router sample, for a selector and a rate window."""

    freshness: str
    in_flight: str
    queued: str
    stream_rate: str
    completed_stream_rate: str
    slots_per_pod: str
    active_servers: str

    @classmethod
    def build(cls, matchers: str, window_seconds: int) -> RouterQueries:
        return cls(
            freshness=f"max by (pod) (timestamp({ROUTER_QUEUE}{{{matchers}}}))",
            in_flight=f"sum({ROUTER_SESSIONS}{{{matchers}}})",
            queued=f"sum({ROUTER_QUEUE}{{{matchers}}})",
            stream_rate=f"sum(rate({ROUTER_ARRIVALS}{{{matchers}}}[{window_seconds}s]))",
            completed_stream_rate=(
                f"sum(rate({ROUTER_REQUESTS}{{{matchers}}}[{window_seconds}s]))"
            ),
            # Each router lets a pod hold maxconn streams: the pod's slots are their sum.
            slots_per_pod=f"sum(max by (pod) ({ROUTER_LIMIT}{{{matchers}}}))",
            active_servers=f"max({ROUTER_ACTIVE}{{{matchers}}})",
        )


@dataclass(frozen=True)
class Queries:
    """The PromQL of one sample, for a selector and a rate window."""

    freshness: str
    pending: str
    queue_latency_ms: str
    in_flight: str
    completion_rate: str
    first_response_p95_ms: str

    @classmethod
    def build(cls, matchers: str, window_seconds: int) -> Queries:
        w = f"[{window_seconds}s]"

        def rate_sum(metric: str) -> str:
            return f"sum(rate({metric}{{{matchers}}}{w}))"

        completions = rate_sum(SUCCESS)
        return cls(
            freshness=f"max by (pod) (timestamp({PENDING}{{{matchers}}}))",
            pending=f"sum({PENDING}{{{matchers}}})",
            queue_latency_ms=(
                f"1e-3 * {rate_sum(QUEUE_US)} / clamp_min({completions}, {EPSILON:g})"
            ),
            in_flight=f"{rate_sum(REQUEST_US)} / 1e6",
            completion_rate=completions,
            first_response_p95_ms=(
                f"histogram_quantile({FIRST_RESPONSE_QUANTILE}, "
                f"sum by (le) (rate({FIRST_RESPONSE_BUCKET}{{{matchers}}}{w})))"
            ),
        )


# ---- reading answers (pure) --------------------------------------------------------------


class _Unavailable(Exception):
    def __init__(self, reason: str, message: str, pods_seen: int = 0) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.pods_seen = pods_seen


def _points(result: Any, query: str) -> list[tuple[dict[str, str], float, float]]:
    """(labels, evaluation time, value) of each element of an instant-vector answer."""
    try:
        points = []
        for element in result:
            at, raw = element["value"]
            points.append((dict(element.get("metric") or {}), float(at), float(raw)))
        return points
    except (TypeError, KeyError, ValueError, AttributeError):
        # Not what /api/v1/query answers: no data, and nothing of the answer in the message.
        raise _Unavailable(
            NO_DATA, f"the answer to {query} is not an instant vector (not a Prometheus?)"
        ) from None


def _scalar(result: Any, query: str) -> float | None:
    """The one value of an aggregated answer; None when the answer is empty."""
    points = _points(result, query)
    if not points:
        return None
    if len(points) > 1:
        raise _Unavailable(QUERY_FAILED, f"{query} answered {len(points)} series, expected one")
    return points[0][2]


# ---- the source ----------------------------------------------------------------------------


class PrometheusSource:
    """Samples of one Prometheus, for any service (thread-safe; one client per thread)."""

    def __init__(
        self,
        url: str,
        window_seconds: int = 60,
        timeout_seconds: float = 5.0,
        stale_seconds: float = 120.0,
        *,
        client: QueryClient | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        # What messages (status, Events, logs) show: never the URL's user:password@.
        self.shown_url = without_credentials(self.url)
        self.window_seconds = window_seconds
        self.timeout_seconds = timeout_seconds
        self.stale_seconds = stale_seconds
        self._client = client
        self._local = threading.local()
        # Every thread's client, to close them all (close() may run on any thread).
        self._opened: list[PrometheusConnect] = []
        self._lock = threading.Lock()
        self._closed = False

    def _connection(self) -> QueryClient:
        if self._client is not None:
            return self._client
        client: QueryClient | None = getattr(self._local, "client", None)
        if client is None:
            # One quick retry of a refused connection; an HTTP error is an answer, not retried.
            retry = Retry(total=1, connect=1, read=0, status=0, redirect=0, backoff_factor=0.1)
            session = requests.Session()
            # A redirect would take the request to a URL nobody allowed.
            session.max_redirects = 0
            connect = PrometheusConnect(
                self.url,
                retry=retry,
                session=session,
                # requests takes a float; the client's annotation says int.
                timeout=self.timeout_seconds,  # type: ignore[arg-type]
            )
            with self._lock:
                if self._closed:
                    connect.close()
                    raise _Unavailable(UNREACHABLE, f"Prometheus at {self.shown_url}: closed")
                self._opened.append(connect)
            self._local.client = client = connect
        return client

    def close(self) -> None:
        """Close every thread's connection pool; a sample in flight then fails as
        unreachable, and later ones are refused."""
        with self._lock:
            self._closed = True
            opened, self._opened = self._opened, []
        for connect in opened:
            connect.close()

    async def sample(self, namespace: str, pods: Sequence[str], model: str) -> Sample:
        """The signals of ``model`` over ``pods`` of ``namespace``; never raises for
        anything Prometheus does (that is the sample's ``unavailable_reason``)."""
        if not pods:
            return unavailable(NO_DATA, "no pods to read metrics of")
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self._sample, namespace, list(pods), model),
                self.timeout_seconds,
            )
        except TimeoutError:
            return unavailable(
                UNREACHABLE,
                f"Prometheus at {self.shown_url} did not answer within {self.timeout_seconds:g}s",
            )

    async def sample_router(self, namespace: str, routers: Sequence[str]) -> RouterSample:
        """The router's figures over ``routers`` (pod names) of ``namespace``; never raises
        for anything Prometheus does (that is the sample's ``unavailable_reason``)."""
        if not routers:
            return router_unavailable(NO_DATA, "no router pod is Ready to read metrics of")
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self._sample_router, namespace, list(routers)),
                self.timeout_seconds,
            )
        except TimeoutError:
            return router_unavailable(
                UNREACHABLE,
                f"Prometheus at {self.shown_url} did not answer within {self.timeout_seconds:g}s",
            )

    def _sample_router(self, namespace: str, routers: list[str]) -> RouterSample:
        deadline = time.monotonic() + self.timeout_seconds
        try:
            return self._read_router(namespace, routers, deadline)
        except _Unavailable as err:
            return router_unavailable(err.reason, err.message, err.pods_seen)

    def _read_router(self, namespace: str, routers: list[str], deadline: float) -> RouterSample:
        every = RouterQueries.build(router_selector(namespace, routers), self.window_seconds)
        fresh, newest_age = self._fresh_pods(every.freshness, routers, deadline)
        if not fresh:
            raise _Unavailable(
                STALE,
                f"the newest sample of {ROUTER_QUEUE} for {len(routers)} router pod(s) in "
                f"{namespace!r} is {newest_age:.0f}s old (stale after {self.stale_seconds:g}s) "
                f"at {self.shown_url}: is Prometheus still scraping them (port 8404)?",
            )
        seen = len(fresh)
        q = RouterQueries.build(router_selector(namespace, fresh), self.window_seconds)
        values: dict[str, float | None] = {}
        for name, query, required in (
            ("in_flight", q.in_flight, True),
            ("queued", q.queued, True),
            ("stream_rate", q.stream_rate, True),
            ("completed_stream_rate", q.completed_stream_rate, False),
            ("slots_per_pod", q.slots_per_pod, False),
            ("active_servers", q.active_servers, False),
        ):
            value = _scalar(self._query(query, deadline), query)
            if value is None and required:
                raise _Unavailable(
                    NO_DATA,
                    f"{query} is empty at {self.shown_url} although {seen} router pod(s) have "
                    f"fresh series (no server in the backend, or fewer than two samples in the "
                    f"last {self.window_seconds}s)",
                    seen,
                )
            if value is not None and not math.isfinite(value):
                if required:
                    raise _Unavailable(
                        NOT_A_NUMBER, f"{query} is {value} at {self.shown_url}", seen
                    )
                value = None
            values[name] = value
        slots = values["slots_per_pod"]
        return RouterSample(
            available=True,
            unavailable_reason="",
            message=f"{seen} of {len(routers)} router pod(s) reporting",
            in_flight=values["in_flight"],
            queued=values["queued"],
            stream_rate=values["stream_rate"],
            slots_per_pod=slots if slots is not None and slots > 0 else None,
            active_servers=values["active_servers"],
            routers_seen=seen,
            completed_stream_rate=values["completed_stream_rate"],
        )

    # Runs in a worker thread.
    def _sample(self, namespace: str, pods: list[str], model: str) -> Sample:
        deadline = time.monotonic() + self.timeout_seconds
        try:
            return self._read(namespace, pods, model, deadline)
        except _Unavailable as err:
            return unavailable(err.reason, err.message, err.pods_seen)

    def _query(self, query: str, deadline: float) -> Any:
        if time.monotonic() > deadline:
            # The caller has given up already; do not keep Prometheus busy for nobody.
            raise _Unavailable(UNREACHABLE, f"Prometheus at {self.shown_url}: out of time")
        try:
            return self._connection().custom_query(query)
        except (requests.ConnectionError, requests.Timeout) as err:
            raise _Unavailable(
                UNREACHABLE, f"Prometheus at {self.shown_url} unreachable: {_connection_error(err)}"
            ) from None
        except PrometheusApiClientException as err:
            raise _Unavailable(
                QUERY_FAILED, f"Prometheus at {self.shown_url} refused {query}: {_api_error(err)}"
            ) from None
        except requests.exceptions.JSONDecodeError:
            raise _Unavailable(
                NO_DATA,
                f"Prometheus at {self.shown_url} answered {query} without data (not JSON)",
            ) from None
        except requests.RequestException as err:
            # The exception's text may quote the answer or the URL: its kind only.
            raise _Unavailable(
                QUERY_FAILED,
                f"Prometheus at {self.shown_url} failed on {query}: {type(err).__name__}",
            ) from None
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            # 200 with a body that is not JSON, or JSON without data.result: not an error of
            # Prometheus' own, and no data either way.
            raise _Unavailable(
                NO_DATA,
                f"Prometheus at {self.shown_url} answered {query} without data "
                "(not a Prometheus query API?)",
            ) from None

    def _read(self, namespace: str, pods: list[str], model: str, deadline: float) -> Sample:
        every = Queries.build(selector(namespace, pods, model), self.window_seconds)
        fresh, newest_age = self._fresh_pods(every.freshness, pods, deadline)
        if not fresh:
            raise _Unavailable(
                STALE,
                f"the newest sample of {PENDING} of {model!r} for {len(pods)} pod(s) in "
                f"{namespace!r} is {newest_age:.0f}s old (stale after {self.stale_seconds:g}s) "
                f"at {self.shown_url}: is Prometheus still scraping them?",
            )
        seen = len(fresh)
        q = Queries.build(selector(namespace, fresh, model), self.window_seconds)
        values: dict[str, float] = {}
        for name, query in (
            ("pending", q.pending),
            ("queue_latency_ms", q.queue_latency_ms),
            ("in_flight", q.in_flight),
            ("completion_rate", q.completion_rate),
        ):
            value = _scalar(self._query(query, deadline), query)
            if value is None:
                raise _Unavailable(
                    NO_DATA,
                    f"{query} is empty at {self.shown_url} although {seen} pod(s) have fresh "
                    "series: "
                    f"fewer than two samples in the last {self.window_seconds}s (pods that "
                    "just started?)",
                    seen,
                )
            if not math.isfinite(value):
                raise _Unavailable(NOT_A_NUMBER, f"{query} is {value} at {self.shown_url}", seen)
            values[name] = value
        p95 = _scalar(self._query(q.first_response_p95_ms, deadline), q.first_response_p95_ms)
        # No histogram, or no observation in the window (histogram_quantile gives NaN): None.
        first_response = p95 if p95 is not None and math.isfinite(p95) else None
        no_traffic = (
            values["completion_rate"] == 0 and values["pending"] == 0 and values["in_flight"] == 0
        )
        return Sample(
            available=True,
            unavailable_reason="",
            message=(
                f"no traffic on {seen} pod(s)"
                if no_traffic
                else f"{seen} of {len(pods)} pod(s) reporting"
            ),
            queue_latency_ms=0.0 if no_traffic else values["queue_latency_ms"],
            pending_requests=values["pending"],
            in_flight=values["in_flight"],
            completion_rate=values["completion_rate"],
            no_traffic=no_traffic,
            first_response_p95_ms=first_response,
            pods_seen=seen,
        )

    def _fresh_pods(self, query: str, pods: list[str], deadline: float) -> tuple[list[str], float]:
        """The given pods whose newest sample is recent enough, and the age of the newest
        sample of the others (when none is recent)."""
        points = _points(self._query(query, deadline), query)
        if not points:
            raise _Unavailable(
                NO_DATA,
                f"no series for {query} at {self.shown_url}: are the pods' metrics port scraped, "
                "with target labels namespace and pod?",
            )
        wanted = set(pods)
        fresh: list[str] = []
        youngest = math.inf
        for labels, at, sample_time in points:
            pod = labels.get("pod", "")
            if pod not in wanted:
                continue
            age = at - sample_time
            if not math.isfinite(age):
                raise _Unavailable(NOT_A_NUMBER, f"{query}: sample time {sample_time} of {pod}")
            youngest = min(youngest, age)
            if age <= self.stale_seconds:
                fresh.append(pod)
        if math.isinf(youngest):
            raise _Unavailable(
                NO_DATA, f"{query} at {self.shown_url} answered none of the pods asked"
            )
        return sorted(fresh), youngest


def without_credentials(url: str) -> str:
    """The URL without its ``user:password@`` part, for messages."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def _connection_error(err: requests.RequestException) -> str:
    """The operating system's words (``[Errno 111] Connection refused``, ``timed out``),
    without the URL-encoded query that requests puts around them."""
    text = str(err)
    found = re.search(r"\[Errno -?\d+\][^'\")]*|[Rr]ead timed out|timed out", text)
    return found.group(0).strip() if found else type(err).__name__


def _api_error(err: PrometheusApiClientException) -> str:
    """The status code and its standard reason phrase, from the client's exception.

    The client's message is ``HTTP Status Code 400 (b'...')``: the status, then the repr of
    the body. The body is whatever the URL answered, which status and Events must not
    publish (a planted ``db_password=...`` would be), so only the code is read from it.
    """
    found = re.match(r"HTTP Status Code (\d{3})\b", str(err))
    if not found:
        return "an error answer"
    code = int(found.group(1))
    try:
        phrase = http.HTTPStatus(code).phrase
    except ValueError:
        phrase = "non-standard status"
    return f"HTTP {code} {phrase}"


def normalized_url(url: str) -> str:
    """A URL as compared with the allowed ones: scheme and host in lower case, no trailing
    slash (``PrometheusSource`` strips it too)."""
    parts = urllib.parse.urlsplit(url.strip())
    return urllib.parse.urlunsplit(
        parts._replace(scheme=parts.scheme.lower(), netloc=parts.netloc.lower())
    ).rstrip("/")


class PrometheusSources:
    """The Prometheus sources of every service: the allowed URLs only, at most ``size``
    clients (the least recently used one is closed when another is needed).

    ``allowed`` are the URLs the operator may query (its own ``COSYVOICE_PROMETHEUS_URL`` and
    ``COSYVOICE_ALLOWED_PROMETHEUS_URLS``), compared exactly after :func:`normalized_url`: a
    service's ``prometheusUrl`` chooses among them, it never adds one.
    """

    def __init__(
        self,
        allowed: Iterable[str],
        window_seconds: int = 60,
        size: int = 8,
        *,
        factory: Any = None,
    ) -> None:
        self.allowed = frozenset(normalized_url(u) for u in allowed if u.strip())
        self.window_seconds = window_seconds
        self.size = max(1, size)
        self._factory = factory or (lambda url: PrometheusSource(url, window_seconds))
        self._sources: OrderedDict[str, PrometheusSource] = OrderedDict()

    def is_allowed(self, url: str) -> bool:
        return normalized_url(url) in self.allowed

    def __len__(self) -> int:
        return len(self._sources)

    def get(self, url: str) -> PrometheusSource | None:
        """The source of an allowed URL (made, or the cached one); None for any other."""
        key = normalized_url(url)
        if key not in self.allowed:
            return None
        source = self._sources.get(key)
        if source is None:
            source = self._sources[key] = self._factory(key)
            while len(self._sources) > self.size:
                _, evicted = self._sources.popitem(last=False)
                evicted.close()
        self._sources.move_to_end(key)
        return source

    async def sample(self, url: str, namespace: str, pods: Sequence[str], model: str) -> Sample:
        """``PrometheusSource.sample`` of the URL, or ``PrometheusNotAllowed`` without a
        request when the operator does not allow it."""
        source = self.get(url)
        if source is None:
            return unavailable(
                NOT_ALLOWED,
                f"Prometheus at {without_credentials(url)} is not one the operator may query: "
                "leave spec.autoscaling.prometheusUrl empty for the operator's own, or ask for "
                "it to be added to COSYVOICE_ALLOWED_PROMETHEUS_URLS (chart value "
                "config.allowedPrometheusUrls)",
            )
        return await source.sample(namespace, pods, model)

    async def sample_router(self, url: str, namespace: str, routers: Sequence[str]) -> RouterSample:
        """``PrometheusSource.sample_router`` of the URL, or ``PrometheusNotAllowed``."""
        source = self.get(url)
        if source is None:
            refused = await self.sample(url, namespace, routers, "")
            return router_unavailable(refused.unavailable_reason, refused.message)
        return await source.sample_router(namespace, routers)

    def close(self) -> None:
        while self._sources:
            _, source = self._sources.popitem()
            source.close()
