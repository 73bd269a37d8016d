"""The metrics source against a fake Prometheus client: every reason a sample can be
unavailable, "no traffic" apart from "no data", and the PromQL it sends."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest
import requests
from prometheus_api_client.exceptions import PrometheusApiClientException

from cosyvoice_operator.devtools.closedloop.cpu_twin import free_ports
from cosyvoice_operator.shell import prometheus_source as ms
from cosyvoice_operator.shell.prometheus_source import PrometheusSource, Sample

URL = "http://prometheus.monitoring:9090"
NOW = 1_700_000_000.0
NS, MODEL = "tts", "cosyvoice2"
BUSY = {
    "pending": "3",
    "queue_latency_ms": "412.5",
    "in_flight": "7.25",
    "completion_rate": "2.5",
    "first_response_p95_ms": None,
}
IDLE = {
    "pending": "0",
    "queue_latency_ms": "0",
    "in_flight": "0",
    "completion_rate": "0",
    "first_response_p95_ms": "NaN",
}


def kind(query: str) -> str:
    """Which of the sample's queries this is."""
    if query.startswith("max by (pod) (timestamp("):
        return "freshness"
    if query.startswith("histogram_quantile("):
        return "first_response_p95_ms"
    if ms.QUEUE_US in query:
        return "queue_latency_ms"
    if ms.REQUEST_US in query:
        return "in_flight"
    if query.startswith(f"sum(rate({ms.SUCCESS}"):
        return "completion_rate"
    if query.startswith(f"sum({ms.PENDING}"):
        return "pending"
    raise AssertionError(f"unexpected query {query}")


class FakePrometheus:
    """Answers as Prometheus' /api/v1/query does (the client returns ``data.result``)."""

    def __init__(
        self,
        values: Mapping[str, str | None] = BUSY,
        sample_times: Mapping[str, float] | None = None,
        fail: Exception | None = None,
        fail_on: str = "freshness",
        delay: float = 0.0,
    ) -> None:
        self.values = dict(values)
        self.sample_times = {"p-0": NOW - 1.0} if sample_times is None else dict(sample_times)
        self.fail = fail
        self.fail_on = fail_on
        self.delay = delay
        self.queries: list[str] = []

    def custom_query(self, query: str) -> Any:
        self.queries.append(query)
        time.sleep(self.delay)
        what = kind(query)
        if self.fail is not None and what == self.fail_on:
            raise self.fail
        if what == "freshness":
            return [
                {"metric": {"pod": pod}, "value": [NOW, repr(at)]}
                for pod, at in self.sample_times.items()
            ]
        value = self.values[what]
        return [] if value is None else [{"metric": {}, "value": [NOW, value]}]


def sample(
    fake: FakePrometheus,
    pods: list[str] | None = None,
    namespace: str = NS,
    **settings: Any,
) -> Sample:
    source = PrometheusSource(URL, client=fake, **settings)
    return asyncio.run(source.sample(namespace, ["p-0"] if pods is None else pods, MODEL))


# ---- PromQL --------------------------------------------------------------------------------


def test_selector_takes_exactly_the_pods_given() -> None:
    pods = ["tts-7d9f-abc.x", "b(1)", "c|d"]
    regex = ms.pod_regex(pods)
    assert regex == r"^(b\(1\)|c\|d|tts-7d9f-abc\.x)$"
    assert all(re.fullmatch(regex, pod) for pod in pods)
    for other in ["tts-7d9f-abcXx", "b1", "c", "d", "xtts-7d9f-abc.x", "b(1)y"]:
        assert not re.fullmatch(regex, other), other
    # Inside a PromQL string the backslashes are escaped once more.
    assert ms.selector('we"ird', ["a.b"], "cosyvoice3") == (
        r'namespace="we\"ird",pod=~"^(a\\.b)$",model="cosyvoice3"'
    )


def test_queries_divide_by_a_tiny_epsilon_and_use_the_window() -> None:
    q = ms.Queries.build('pod=~"^(a)$"', 45)
    assert q.queue_latency_ms == (
        '1e-3 * sum(rate(nv_inference_queue_duration_us{pod=~"^(a)$"}[45s]))'
        ' / clamp_min(sum(rate(nv_inference_request_success{pod=~"^(a)$"}[45s])), 1e-06)'
    )
    assert q.in_flight == 'sum(rate(nv_inference_request_duration_us{pod=~"^(a)$"}[45s])) / 1e6'
    assert q.completion_rate == 'sum(rate(nv_inference_request_success{pod=~"^(a)$"}[45s]))'
    assert q.pending == 'sum(nv_inference_pending_request_count{pod=~"^(a)$"})'
    assert "histogram_quantile(0.95," in q.first_response_p95_ms
    assert "nv_inference_first_response_histogram_ms_bucket" in q.first_response_p95_ms
    assert ", 1)" not in q.queue_latency_ms


# ---- available -----------------------------------------------------------------------------


def test_busy_pods_give_every_signal() -> None:
    fake = FakePrometheus(sample_times={"p-0": NOW - 2, "p-1": NOW - 30})
    got = sample(fake, ["p-0", "p-1"])
    assert got == Sample(
        available=True,
        unavailable_reason="",
        message="2 of 2 pod(s) reporting",
        queue_latency_ms=412.5,
        pending_requests=3.0,
        in_flight=7.25,
        completion_rate=2.5,
        no_traffic=False,
        first_response_p95_ms=None,
        pods_seen=2,
    )
    # Triton's series of the orchestrator, and nothing else.
    assert all('namespace="tts"' in q and 'model="cosyvoice2"' in q for q in fake.queries)


def test_first_response_p95_when_the_histogram_exists() -> None:
    assert sample(FakePrometheus({**BUSY, "first_response_p95_ms": "850"})).first_response_p95_ms
    assert sample(FakePrometheus({**BUSY, "first_response_p95_ms": "NaN"})).available


def test_fresh_series_without_traffic_is_no_traffic_not_no_data() -> None:
    got = sample(FakePrometheus(IDLE))
    assert got.available and got.no_traffic
    assert got.queue_latency_ms == 0.0 and got.completion_rate == 0.0 and got.pending_requests == 0
    assert got.first_response_p95_ms is None  # no observation: NaN quantile, not a failure
    assert got.pods_seen == 1 and "no traffic" in got.message


def test_pending_requests_alone_are_traffic() -> None:
    """Long streams: nothing completed in the window yet, but requests wait."""
    got = sample(FakePrometheus({**IDLE, "pending": "4"}))
    assert got.available and not got.no_traffic and got.pending_requests == 4


def test_rates_are_read_over_the_fresh_pods_only() -> None:
    fake = FakePrometheus(sample_times={"p-0": NOW - 5, "p-1": NOW - 600})
    got = sample(fake, ["p-0", "p-1"])
    assert got.available and got.pods_seen == 1
    assert "1 of 2" in got.message
    first, *rest = fake.queries
    assert "^(p-0|p-1)$" in first
    assert rest and all("^(p-0)$" in q for q in rest)


# ---- unavailable: every reason -------------------------------------------------------------


def check(got: Sample, reason: str, *words: str) -> None:
    assert not got.available, got
    assert got.unavailable_reason == reason, got
    assert not got.no_traffic
    assert got.queue_latency_ms is None and got.pending_requests is None, got
    assert got.in_flight is None and got.completion_rate is None, got
    for word in words:
        assert word in got.message, (word, got.message)


def test_no_series_is_no_data() -> None:
    fake = FakePrometheus(sample_times={})
    check(sample(fake), ms.NO_DATA, URL, "nv_inference_pending_request_count", 'pod=~"^(p-0)$"')
    assert len(fake.queries) == 1


def test_no_pods_is_no_data_without_asking() -> None:
    fake = FakePrometheus()
    check(sample(fake, []), ms.NO_DATA)
    assert fake.queries == []


def test_series_of_other_pods_only_is_no_data() -> None:
    check(sample(FakePrometheus(sample_times={"p-9": NOW})), ms.NO_DATA, "none of the pods")


def test_too_few_samples_for_a_rate_is_no_data_not_zero() -> None:
    got = sample(FakePrometheus({**BUSY, "completion_rate": None}))
    check(got, ms.NO_DATA, "nv_inference_request_success", "fewer than two samples")
    assert got.pods_seen == 1


def test_old_samples_are_stale() -> None:
    fake = FakePrometheus(sample_times={"p-0": NOW - 300, "p-1": NOW - 200})
    check(sample(fake, ["p-0", "p-1"]), ms.STALE, "200s old", "stale after 120s", URL)
    assert len(fake.queries) == 1


def test_stale_after_is_a_setting() -> None:
    fake = FakePrometheus(sample_times={"p-0": NOW - 30})
    check(sample(fake, stale_seconds=10), ms.STALE, "30s old")
    assert sample(FakePrometheus(sample_times={"p-0": NOW - 30}), stale_seconds=60).available


@pytest.mark.parametrize("signal", ["queue_latency_ms", "pending", "in_flight", "completion_rate"])
@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_nan_or_infinite_is_not_a_number(signal: str, value: str) -> None:
    got = sample(FakePrometheus({**BUSY, signal: value}))
    check(got, ms.NOT_A_NUMBER, URL)
    assert f" is {float(value)} at " in got.message


def test_error_answer_is_query_failed_with_status_code_and_reason_only() -> None:
    # What prometheus-api-client raises for a 400 (checked against a real Prometheus in
    # tests/closed_loop/test_prometheus_source.py). The body is whatever the URL answered:
    # status and Events get the code and its standard phrase only (issue 21 H2).
    body = b'{"status":"error","errorType":"bad_data","error":"db_password=hunter2"}'
    err = PrometheusApiClientException(f"HTTP Status Code 400 ({body!r})")
    got = sample(FakePrometheus(fail=err))
    check(got, ms.QUERY_FAILED, URL, "HTTP 400 Bad Request")
    assert "hunter2" not in got.message and "bad_data" not in got.message


def test_server_error_without_json_is_query_failed() -> None:
    err = PrometheusApiClientException("HTTP Status Code 503 (b'Service Unavailable')")
    check(sample(FakePrometheus(fail=err, fail_on="pending")), ms.QUERY_FAILED, "503")


@pytest.mark.parametrize(
    "answer", [[{"metric": {}}], [{"value": [NOW, "x"]}], "garbage", [{"secret": "s3cr3t"}], 7]
)
def test_malformed_answer_is_no_data_and_not_quoted(answer: Any) -> None:
    class Odd(FakePrometheus):
        def custom_query(self, query: str) -> Any:
            return answer if kind(query) == "pending" else super().custom_query(query)

    got = sample(Odd())
    check(got, ms.NO_DATA, "nv_inference_pending_request_count")
    assert "s3cr3t" not in got.message and "garbage" not in got.message


def test_two_series_where_one_is_expected_is_query_failed() -> None:
    class Odd(FakePrometheus):
        def custom_query(self, query: str) -> Any:
            if kind(query) == "pending":
                return [{"value": [NOW, "1"]}] * 2
            return super().custom_query(query)

    check(sample(Odd()), ms.QUERY_FAILED, "answered 2 series")


@pytest.mark.parametrize("err", [KeyError("data"), TypeError("list indices"), ValueError("json")])
def test_an_answer_without_data_is_no_data_never_an_exception(err: Exception) -> None:
    # What the real client raises on a 200 whose JSON lacks data.result (KeyError), is a
    # list (TypeError) or is not JSON (ValueError): sample() promises never to raise.
    check(sample(FakePrometheus(fail=err)), ms.NO_DATA, "without data")


def test_other_request_failure_is_query_failed_by_kind_only() -> None:
    got = sample(FakePrometheus(fail=requests.exceptions.InvalidURL("bad s3cr3t")))
    check(got, ms.QUERY_FAILED, "InvalidURL")
    assert "s3cr3t" not in got.message


@pytest.mark.parametrize(
    "err",
    [
        requests.ConnectionError("... [Errno 111] Connection refused')"),
        requests.exceptions.ConnectTimeout("connect timed out"),
        requests.exceptions.ReadTimeout("Read timed out. (read timeout=5.0)"),
    ],
)
def test_connection_failure_is_unreachable(err: Exception) -> None:
    check(sample(FakePrometheus(fail=err, fail_on="in_flight")), ms.UNREACHABLE, URL)


def test_no_answer_in_time_is_unreachable() -> None:
    source = PrometheusSource(URL, timeout_seconds=0.2, client=FakePrometheus(delay=1.0))

    async def timed() -> tuple[Sample, float]:
        started = time.monotonic()
        got = await source.sample(NS, ["p-0"], MODEL)
        return got, time.monotonic() - started

    got, took = asyncio.run(timed())  # (asyncio.run then waits for the worker thread)
    check(got, ms.UNREACHABLE, "did not answer within 0.2s")
    assert took < 0.9


def test_real_client_on_a_closed_port_is_unreachable_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    (port,) = free_ports(1)
    source = PrometheusSource(f"http://127.0.0.1:{port}", timeout_seconds=5)
    started = time.monotonic()
    with caplog.at_level("DEBUG"):
        got = asyncio.run(source.sample(NS, ["p-0"], MODEL))
    check(got, ms.UNREACHABLE, f"127.0.0.1:{port}", "Connection refused")
    assert time.monotonic() - started < 2
    assert "%7B" not in got.message  # not the URL-encoded query
    # Issue 23: no library warning per evaluation (urllib3's "Retrying ..."): the sample says it.
    assert not [r for r in caplog.records if r.levelno >= 30], caplog.records


def test_samples_of_many_services_at_once() -> None:
    """One source serves every service of a Prometheus concurrently (the controller's)."""
    fake = FakePrometheus(delay=0.05)
    source = PrometheusSource(URL, client=fake)

    async def many() -> list[Sample]:
        return await asyncio.gather(*(source.sample(f"ns{i}", ["p-0"], MODEL) for i in range(4)))

    started = time.monotonic()
    got = asyncio.run(many())
    assert all(s.available for s in got)
    assert time.monotonic() - started < 6 * 0.05 * 4  # in parallel threads, not one by one


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://prometheus:9090", "http://prometheus:9090"),
        ("https://sre:s3cret@prom.example:443/api", "https://***@prom.example:443/api"),
        ("http://token@prom:9090", "http://***@prom:9090"),
    ],
)
def test_messages_never_show_the_urls_credentials(url: str, shown: str) -> None:
    assert ms.without_credentials(url) == shown
    source = ms.PrometheusSource(url)
    assert source.shown_url == shown
    assert "s3cret" not in source.shown_url


# ---- a real HTTP server: bodies, redirects, and the allowed URLs (issue 21 H2) --------------


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the server's ``answer`` (status, headers, body)."""

    def do_GET(self) -> None:
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        status, headers, body = self.server.answer  # type: ignore[attr-defined]
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def answering(status: int, body: bytes, headers: Mapping[str, str] | None = None) -> Any:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    server.answer = (status, dict(headers or {}), body)  # type: ignore[attr-defined]
    server.paths = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def real_sample(url: str) -> Sample:
    source = PrometheusSource(url, timeout_seconds=5)
    try:
        return asyncio.run(source.sample(NS, ["p-0"], MODEL))
    finally:
        source.close()


def test_an_error_body_never_reaches_the_message() -> None:
    with answering(403, b"internal-only: db_password=hunter2 api_token=abc123") as server:
        got = real_sample(f"http://127.0.0.1:{server.server_port}")
    check(got, ms.QUERY_FAILED, "HTTP 403 Forbidden")
    assert "hunter2" not in got.message and "abc123" not in got.message


@pytest.mark.parametrize("body", [b"{}", b'{"status":"success"}', b"[1]", b"<html>hi</html>"])
def test_a_200_without_data_from_a_real_server_is_no_data(body: bytes) -> None:
    with answering(200, body) as server:
        got = real_sample(f"http://127.0.0.1:{server.server_port}")
    check(got, ms.NO_DATA)
    assert "html" not in got.message


def test_a_redirect_is_not_followed() -> None:
    with answering(200, b"{}") as elsewhere:
        target = f"http://127.0.0.1:{elsewhere.server_port}/stolen"
        with answering(302, b"", {"Location": target}) as server:
            got = real_sample(f"http://127.0.0.1:{server.server_port}")
        assert elsewhere.paths == []  # type: ignore[attr-defined]
    check(got, ms.QUERY_FAILED, "TooManyRedirects")


class _Closing:
    def __init__(self, url: str) -> None:
        self.url = url
        self.closed = False
        self.sampled: list[str] = []

    async def sample(self, namespace: str, pods: Any, model: str) -> Sample:
        self.sampled.append(namespace)
        return ms.unavailable(ms.NO_DATA, "fake")

    def close(self) -> None:
        self.closed = True


def test_a_url_the_operator_does_not_allow_is_never_asked() -> None:
    made: list[_Closing] = []

    def factory(url: str) -> _Closing:
        made.append(_Closing(url))
        return made[-1]

    sources = ms.PrometheusSources([URL], factory=factory)
    for url in ("http://attacker.example/any/path?x=", "http://prometheus.monitoring:9091"):
        got = asyncio.run(sources.sample(url, NS, ["p-0"], MODEL))
        assert got.unavailable_reason == ms.NOT_ALLOWED == "PrometheusNotAllowed"
        assert "COSYVOICE_ALLOWED_PROMETHEUS_URLS" in got.message
    assert made == []
    secret = "http://sre:s3cret@other:9090"
    assert "s3cret" not in asyncio.run(sources.sample(secret, NS, ["p-0"], MODEL)).message
    # The allowed one, spelled with a trailing slash or an upper-case host, is the same.
    for url in (URL, URL + "/", URL.replace("prometheus", "PROMETHEUS")):
        asyncio.run(sources.sample(url, NS, ["p-0"], MODEL))
    assert len(made) == 1 and made[0].sampled == [NS] * 3


def test_the_client_cache_is_bounded_and_closes_what_it_evicts() -> None:
    urls = [f"http://prom-{i}:9090" for i in range(300)]
    made: dict[str, _Closing] = {}

    def factory(url: str) -> _Closing:
        made[url] = _Closing(url)
        return made[url]

    sources = ms.PrometheusSources(urls, size=4, factory=factory)
    for url in urls:
        got: object = sources.get(url)
        assert got is made[url]
    assert len(sources) == 4
    assert [u for u, s in made.items() if not s.closed] == urls[-4:]
    # Used recently, kept: the least recently used one goes.
    sources.get(urls[-4])
    sources.get(urls[0])
    assert made[urls[-4]].closed is False and made[urls[-3]].closed is True
    sources.close()
    assert all(s.closed for s in made.values())


def test_closing_a_real_source_releases_its_sockets() -> None:
    with answering(200, b'{"status":"success","data":{"resultType":"vector","result":[]}}') as srv:
        url = f"http://127.0.0.1:{srv.server_port}"
        sources = ms.PrometheusSources([url], size=1)
        got = asyncio.run(sources.sample(url, NS, ["p-0"], MODEL))
        assert got.unavailable_reason == ms.NO_DATA
        source = sources.get(url)
        assert source is not None and source._opened
        sources.close()
        assert source._opened == []
        # A closed source refuses rather than reopening connections.
        again = asyncio.run(source.sample(NS, ["p-0"], MODEL))
        assert again.unavailable_reason == ms.UNREACHABLE and "closed" in again.message
