"""The router's PromQL (shell/prometheus_source.RouterQueries) and the utterances gauge: the
queries select the service's router pods in its namespace and the gRPC backend only, read the
figures the contract names (never HAProxy's queue-time average), and a service without a
figure has no utterances series (no stale value). The queries run against a real Prometheus
and HAProxy in tests/closed_loop/test_router_prometheus_source.py."""

from __future__ import annotations

from prometheus_client import REGISTRY

from cosyvoice_operator.shell import metrics
from cosyvoice_operator.shell.prometheus_source import RouterQueries, router_selector


def test_router_queries_select_the_router_pods_and_the_grpc_backend() -> None:
    matchers = router_selector("voices", ["tts-router-b", "tts.router-a"])
    assert matchers == (
        'namespace="voices",pod=~"^(tts-router-b|tts\\\\.router-a)$",proxy="triton"'
    )
    q = RouterQueries.build(matchers, 60)
    every = (
        q.freshness,
        q.in_flight,
        q.queued,
        q.stream_rate,
        q.completed_stream_rate,
        q.slots_per_pod,
        q.active_servers,
    )
    assert all(f"{{{matchers}}}" in query for query in every)
    assert q.in_flight == f"sum(haproxy_server_current_sessions{{{matchers}}})"
    assert q.queued == f"sum(haproxy_backend_current_queue{{{matchers}}})"
    assert q.stream_rate == f"sum(rate(haproxy_backend_sessions_total{{{matchers}}}[60s]))"
    assert q.completed_stream_rate == (
        f"sum(rate(haproxy_backend_http_requests_total{{{matchers}}}[60s]))"
    )
    assert q.slots_per_pod == f"sum(max by (pod) (haproxy_server_limit_sessions{{{matchers}}}))"
    assert not any("queue_time_average" in query for query in every)


def gauge(namespace: str, service: str) -> float | None:
    return REGISTRY.get_sample_value(
        "cosyvoice_operator_utterances_per_stream",
        {"namespace": namespace, "service": service},
    )


def test_the_utterances_gauge_is_set_removed_and_forgotten() -> None:
    metrics.record_utterances_per_stream("voices", "tts", 2.5)
    assert gauge("voices", "tts") == 2.5
    metrics.record_utterances_per_stream("voices", "tts", None)
    assert gauge("voices", "tts") is None
    metrics.record_utterances_per_stream("voices", "tts", None)  # nothing to remove: fine
    metrics.record_utterances_per_stream("voices", "tts", 1.0)
    metrics.forget("voices", "tts")
    assert gauge("voices", "tts") is None
