"""The closed-loop harness on its own: two "pods" given as a list (no cluster), a real
tritonserver each, listed in the file_sd file, scraped by a real Prometheus, loaded by the
generator; a pod that goes takes its process with it. CosyVoice3's pods run the project's own
orchestrator (serving-models/), so the queue latency the autoscaler reads is our code's."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cosyvoice_operator.devtools.closedloop import cpu_twin
from cosyvoice_operator.devtools.closedloop.harness import PodServers, ready_pods, twin_repository
from cosyvoice_operator.devtools.closedloop.load import DEFAULT_TEXT, LoadGenerator
from cosyvoice_operator.devtools.closedloop.prometheus import Prometheus, read_targets
from cosyvoice_operator.render import triton
from tests.triton_twin.test_twin import parse, service

NS = "voices"
SERVICE_SECONDS = 0.4


def wait_until(what: str, condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.1)


def test_twin_repository_caps_instances_and_nothing_else() -> None:
    svc = service("cosyvoice3")
    full, capped = twin_repository(svc, None), twin_repository(svc, 2)
    assert list(full) == list(capped) == list(triton.render_repository(svc, "/e"))
    assert [g.count for g in parse(full["cosyvoice3"]).instance_group] == [10]
    for name in full:
        before, after = parse(full[name]), parse(capped[name])
        assert [g.count for g in after.instance_group] == [
            min(2, g.count) for g in before.instance_group
        ]
        for group in [*before.instance_group, *after.instance_group]:
            group.count = 0
        assert before == after, name


class FakeKubectl:
    def __init__(self, items: list[dict[str, object]], returncode: int = 0) -> None:
        self.items = items
        self.returncode = returncode
        self.calls: list[tuple[str, ...]] = []

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        out = json.dumps({"items": self.items})
        return subprocess.CompletedProcess(args, self.returncode, out, "forbidden")


def pod(name: str, ready: bool, deleting: bool = False) -> dict[str, object]:
    meta: dict[str, object] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return {"metadata": meta, "status": status}


def test_ready_pods_are_the_ready_ones_not_being_deleted() -> None:
    kubectl = FakeKubectl([pod("b", True), pod("a", True), pod("c", False), pod("d", True, True)])
    assert ready_pods(kubectl, NS, "app=x")() == ["a", "b"]
    assert kubectl.calls == [("get", "pods", "-n", NS, "-l", "app=x", "-o", "json")]
    with pytest.raises(RuntimeError, match="forbidden"):
        ready_pods(FakeKubectl([], returncode=1), NS, "app=x")()


@pytest.mark.timeout(180)
def test_two_pods_are_served_scraped_and_loaded_and_one_goes(tmp_path: Path) -> None:
    targets = tmp_path / "targets.json"
    pods = {"tts-a", "tts-b"}
    servers = PodServers(
        service("cosyvoice3"),
        tmp_path / "pods",
        targets,
        namespace=NS,
        pods=lambda: set(pods),
        service_seconds=SERVICE_SECONDS,
    )
    with servers, Prometheus(tmp_path, targets) as prometheus:
        started = time.monotonic()
        servers.wait_live(["tts-a", "tts-b"], timeout=60)
        print(f"\ntwo tritonservers live after {time.monotonic() - started:.1f}s")
        live = servers.live()
        assert read_targets(targets) == {
            f"127.0.0.1:{live[p].metrics_port}": (NS, p) for p in ("tts-a", "tts-b")
        }
        # The orchestrator is the project's own, not the stand-in.
        ours = (cpu_twin.SERVING_MODELS / "models" / "cosyvoice3" / "model.py").read_text()
        for server in live.values():
            assert (server.repository / "cosyvoice3" / "1" / "model.py").read_text() == ours
        prometheus.wait_up(["tts-a", "tts-b"])
        print(f"both scraped after {time.monotonic() - started:.1f}s")
        pending = prometheus.query(f'nv_inference_pending_request_count{{namespace="{NS}"}}')
        assert {(r["metric"]["pod"], r["metric"]["model"]) for r in pending} >= {
            ("tts-a", "cosyvoice3"),
            ("tts-b", "cosyvoice3"),
        }

        with LoadGenerator(servers.grpc_urls, servers.model) as load:
            # Closed loop, 2 in flight: nobody waits, each request takes the service time.
            mark = time.monotonic()
            load.set_concurrency(2)
            wait_until("8 closed-loop requests", lambda: load.summary(since=mark).completed >= 8)
            load.set_concurrency(0)
            # Open loop on top: Poisson arrivals at 5/s.
            opened = time.monotonic()
            load.set_rate(5)
            wait_until("8 open-loop requests", lambda: load.summary(since=opened).completed >= 8)
            load.stop()
            summary = load.summary(since=mark)
            assert summary.completed >= 16 and summary.failed == 0, summary
            done = [r for r in load.records(since=mark) if r.ok]
            assert all(r.total_s is not None and r.total_s >= SERVICE_SECONDS for r in done)
            # Streamed: every request's first audio came before its end (the stand-in sends it
            # a quarter into the service time, however late that is on a busy machine).
            assert all(
                r.first_chunk_s is not None
                and r.total_s is not None
                and r.first_chunk_s < r.total_s
                for r in done
            )
            per_server = load.per_server(since=mark)
            assert sorted(per_server) == sorted(servers.grpc_urls())
            assert min(per_server.values()) >= 5, per_server
            assert servers.llm is not None and sum(servers.llm.requests_per_server()) >= 16
            # Our orchestrator's requests, as trtllm-serve's schema takes them (the stand-in
            # refuses any other with 400, none was): the served model name the operator
            # rendered (the engine directory's basename), upstream's instruction before the
            # reference text, max_tokens 20 per token of the target text (the tiny
            # release's tokenizer: one per byte).
            assert all(server.refused == [] for server in servers.llm.servers)
            bodies = [body for server in servers.llm.servers for body in server.requests]
            assert {body["model"] for body in bodies} == {"llm"}
            assert all(
                body["messages"][0]["content"].startswith(
                    "You are a helpful assistant.<|endofprompt|>"
                )
                and body["messages"][0]["content"].endswith(DEFAULT_TEXT)
                for body in bodies
            )
            assert {body["max_tokens"] for body in bodies} == {20 * len(DEFAULT_TEXT.encode())}

            def both_pods_counted_successes() -> bool:
                success = prometheus.query(
                    f'sum by (pod) (nv_inference_request_success{{namespace="{NS}"}})'
                )
                return len(success) == 2 and all(float(r["value"][1]) > 0 for r in success)

            wait_until("Prometheus to scrape both pods' successes", both_pods_counted_successes)

            # tts-b goes: out of the file, its process stopped; the load follows tts-a alone.
            gone = live["tts-b"]
            pods.discard("tts-b")
            servers.wait_live(["tts-a"], timeout=30)
            assert list(read_targets(targets).values()) == [(NS, "tts-a")]
            deadline = time.monotonic() + 30
            while not servers.stopped():
                assert time.monotonic() < deadline, "tts-b's tritonserver still runs"
                time.sleep(0.2)
            assert [p.pod for p in servers.stopped()] == ["tts-b"]
            assert gone.process is not None and gone.process.poll() is not None
            assert [(p, what) for _, p, what in servers.history if p == "tts-b"] == [
                ("tts-b", "live"),
                ("tts-b", "stopped"),
            ]
            mark = time.monotonic()
            load.set_concurrency(2)
            wait_until("4 requests to tts-a", lambda: load.summary(since=mark).completed >= 4)
            load.stop()
            assert load.summary(since=mark).failed == 0
            assert set(load.per_server(since=mark)) == {live["tts-a"].grpc}

        # A restart keeps the address and scrapes again.
        url = prometheus.url
        prometheus.restart()
        assert prometheus.url == url
        prometheus.wait_up(["tts-a"])
        assert not servers.failures
    assert read_targets(targets) == {}
    assert live["tts-a"].process is not None and live["tts-a"].process.poll() is not None


@pytest.mark.timeout(240)
def test_a_cosyvoice2_pod_is_served_too(tmp_path: Path) -> None:
    """CosyVoice2's twin (an LLM model inside Triton, no stand-in server), on the project's
    own orchestrator, under load beyond its orchestrator instances: 6 streams over 2, 40
    requests, not one failed, each taking at least the service time the stand-in LLM streams
    over. (The stand-in orchestrator's stub used to die under this load: see
    ``let_go_after_cleanup`` there; ours waits for the BLS cleanup the same way.)"""
    servers = PodServers(
        service("cosyvoice2"),
        tmp_path / "pods",
        tmp_path / "targets.json",
        namespace=NS,
        pods=lambda: ["tts-c"],
        service_seconds=0.2,
    )
    with servers, LoadGenerator(servers.grpc_urls, servers.model) as load:
        assert servers.llm is None and servers.model == "cosyvoice2"
        servers.wait_live(["tts-c"], timeout=60)
        ours = (cpu_twin.SERVING_MODELS / "models" / "cosyvoice2" / "model.py").read_text()
        [server] = servers.live().values()
        assert (server.repository / "cosyvoice2" / "1" / "model.py").read_text() == ours
        load.set_concurrency(6)
        wait_until("40 requests", lambda: load.summary().sent >= 40, timeout=180)
        load.stop()
        summary = load.summary()
        assert summary.failed == 0 and summary.completed >= 40, summary
        assert all(r.total_s is not None and r.total_s >= 0.2 for r in load.records() if r.ok)


def queue_seconds_and_successes(metrics: str, model: str) -> tuple[float, float]:
    """Triton's cumulative queue time (s) and successful requests of ``model``."""
    values = {}
    for line in metrics.splitlines():
        for name in ("nv_inference_queue_duration_us", "nv_inference_request_success"):
            if line.startswith(f'{name}{{model="{model}"'):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values["nv_inference_queue_duration_us"] / 1e6, values["nv_inference_request_success"]


@pytest.mark.timeout(180)
def test_the_queue_latency_is_triton_queueing_in_front_of_our_orchestrator(
    tmp_path: Path,
) -> None:
    """One pod, 2 orchestrator instances (one stream each), 4 streams at a time: two of them
    wait in Triton's queue about a service time each, and the orchestrator's queue metric
    (what the autoscaler reads through Prometheus) shows it. An ``async`` orchestrator, as
    upstream's CosyVoice3 one, would show about 0 (../shared/docs/test-audit.md, P2)."""
    service_seconds = 0.4
    servers = PodServers(
        service("cosyvoice3"),
        tmp_path / "pods",
        tmp_path / "targets.json",
        namespace=NS,
        pods=lambda: ["tts-q"],
        service_seconds=service_seconds,
    )
    with servers, LoadGenerator(servers.grpc_urls, servers.model) as load:
        assert servers.ours is not None
        servers.wait_live(["tts-q"])
        [server] = servers.live().values()
        load.set_concurrency(4)
        wait_until("12 requests", lambda: load.summary().completed >= 12, timeout=120)
        load.stop()
        assert load.summary().failed == 0
        waited, served = queue_seconds_and_successes(server.metrics(), "cosyvoice3")
    print(f"\nqueue: {waited:.2f} s over {served:.0f} requests")
    assert served >= 12
    # Past the first two, each request waits for one to finish: ~service_seconds each.
    assert waited / served > 0.5 * service_seconds, (waited, served)
