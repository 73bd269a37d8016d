"""The router as the test world runs it (issue 30 item 6): Debian's real HAProxy on the config
the operator renders (``render.router.haproxy_config``), pods discovered as in a cluster (DNS
SRV of the headless Service from a loopback DNS server, each pod its own 127.a.b.n address with
Triton's ports), every client's streams on ONE gRPC channel.

The pods here are grpcio stand-ins (``router.StandInPod``: Triton's ``ModelStreamInfer``, each
stream held until the test releases it, cosyvoice-serve's ``/ready`` on 8003): the point is
the router, and holding streams makes every state exact instead of timed. The last test runs
real ``tritonserver`` twins through the same router, with the closed loop's load generator and
Prometheus scraping HAProxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from cosyvoice_operator.devtools.closedloop import router
from cosyvoice_operator.devtools.closedloop.router import (
    HAProxy,
    SrvDirectory,
    StandInPod,
    open_stream,
    stream_request,
    wait_for,
)
from cosyvoice_operator.render import router as front_router
from cosyvoice_operator.render.router import HEALTH_PATH, HEALTH_PORT, haproxy_config

NS = "voices"
HEADLESS = "cvs-tts-pods"


class World:
    """A DNS server for the headless Service, stand-in pods, one router (slots per pod:
    ``slots``), on a loopback block of its own."""

    def __init__(self, work: Path, *, slots: int = 2, queue_timeout_ms: int = 20000) -> None:
        self.block = router.loopback_block()
        self.work = work
        self.directory = SrvDirectory(HEADLESS, NS).start()
        self.pods: dict[str, StandInPod] = {}
        self._numbers = itertools.count(2)
        params = router.local_router(
            self.directory,
            work,
            address=f"{self.block}.1",
            slots_per_server=slots,
            server_slots=6,
            queue_timeout_ms=queue_timeout_ms,
        )
        self.haproxy = HAProxy(params, work)
        self.channel: grpc.Channel | None = None
        self._ids = itertools.count()

    def add_pod(self, name: str, *, listed: bool = True) -> StandInPod:
        pod = StandInPod(name, f"{self.block}.{next(self._numbers)}").start()
        self.pods[name] = pod
        if listed:
            self.list(*self.directory.members(), name)
        return pod

    def list(self, *names: str) -> None:
        """The Ready pods, as the headless Service's endpoints say."""
        self.directory.set({name: self.pods[name].address for name in names})

    def wait_up(self, *names: str) -> None:
        self.haproxy.wait_servers({self.pods[name].address for name in names}, timeout=30)

    def start(self) -> World:
        self.haproxy.start()
        self.channel = grpc.insecure_channel(self.haproxy.grpc)
        return self

    def stream(self, timeout: float | None = 60) -> tuple[str, Any]:
        """A new stream on the world's one channel: its request id and the call."""
        assert self.channel is not None
        request_id = f"r{next(self._ids)}"
        return request_id, open_stream(self.channel, stream_request("tts", [], request_id), timeout)

    def hold(self) -> None:
        for pod in self.pods.values():
            pod.release.clear()

    def release(self) -> None:
        for pod in self.pods.values():
            pod.release.set()

    def active(self) -> dict[str, int]:
        return {name: pod.active for name, pod in self.pods.items()}

    def close(self) -> None:
        self.release()
        if self.channel is not None:
            self.channel.close()
        self.haproxy.stop()
        self.directory.stop()
        for pod in self.pods.values():
            pod.stop(0)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made: list[World] = []

    def make(**kwargs: Any) -> World:
        made.append(World(tmp_path / f"w{len(made)}", **kwargs))
        return made[-1]

    yield make  # type: ignore[misc]
    for w in made:
        w.close()


def finish(call: Any) -> tuple[str | None, str]:
    """Read a stream to its end: (the pod named in its answers, "" or the gRPC error)."""
    pods: set[str] = set()
    try:
        for message in call:
            pods.add(message.infer_response.parameters[router.POD_PARAMETER].string_param)
    except grpc.RpcError as err:
        return (pods.pop() if pods else None), f"{err.code().name}: {err.details()}"
    assert len(pods) == 1, pods
    return pods.pop(), ""


def in_background(calls: list[Any]) -> tuple[list[tuple[str | None, str]], threading.Thread]:
    """Read the calls on a thread (gRPC streams start when read); results in order."""
    results: list[tuple[str | None, str]] = [(None, "not read")] * len(calls)

    def read() -> None:
        threads = [
            threading.Thread(target=lambda i=i: results.__setitem__(i, finish(calls[i])))
            for i in range(len(calls))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return results, reader


def test_the_rendered_config_passes_haproxy_check(world: Any) -> None:
    w = world()
    w.add_pod("a")
    assert "Configuration file is valid" in w.haproxy.check()
    # The test world runs the operator's config as rendered (for loopback addresses).
    rendered = haproxy_config(w.haproxy.params)
    assert rendered == w.haproxy.config_text
    assert f"_grpc._tcp.{HEADLESS}.{NS}.svc.cluster.local" in rendered
    assert f"nameserver dns1 {w.directory.address}" in rendered


def test_a_clusters_rendered_config_runs_here_with_only_the_pods_environment_changed(
    tmp_path: Path,
) -> None:
    """localize: the cluster's config (cluster DNS from resolv.conf, binds on every address,
    /var/run/haproxy) is the loopback one the same renderer writes for this machine."""
    from dataclasses import replace

    from cosyvoice_operator.render.router import RouterConfig, ServerSource

    cluster = RouterConfig(
        servers=ServerSource.dns(HEADLESS, NS),
        slots_per_server=3,
        server_slots=8,
        queue_timeout_ms=4500,
    )
    here = replace(
        cluster,
        servers=ServerSource.dns(HEADLESS, NS, nameserver="127.0.0.1:5353"),
        bind_address="127.9.9.1",
        runtime_dir=str(tmp_path),
    )
    localized = router.localize(
        haproxy_config(cluster),
        address="127.9.9.1",
        nameserver="127.0.0.1:5353",
        runtime_dir=tmp_path,
    )
    assert localized == haproxy_config(here)
    assert "parse-resolv-conf" in haproxy_config(cluster)


def test_the_rendered_health_check_as_is_passes_on_every_dns_pod(tmp_path: Path) -> None:
    w = World(tmp_path)
    try:
        for name in "abc":
            w.add_pod(name)
        w.start()

        def checked() -> dict[str, str]:
            statuses = w.haproxy.checks()
            filled = [s.name for s in w.haproxy.servers().values() if s.address]
            done = {n: statuses.get(n, "") for n in filled}
            # INI: no check finished yet on that server
            return done if len(done) == 3 and not {"", "INI"} & set(done.values()) else {}

        statuses = wait_for(checked, what="a health check done on each pod")
        assert set(statuses.values()) == {"L7OK"}, statuses
    finally:
        w.close()


def test_streams_of_one_channel_spread_over_every_ready_pod(world: Any) -> None:
    w = world(slots=2)
    for name in "abc":
        w.add_pod(name)
    w.start()
    w.wait_up("a", "b", "c")
    w.hold()
    calls = [w.stream()[1] for _ in range(6)]
    results, reader = in_background(calls)
    # leastconn over 3 pods x 2 slots: every pod gets 2 of the channel's 6 streams.
    wait_for(lambda: w.active() == {"a": 2, "b": 2, "c": 2}, what="2 streams per pod")
    view = w.haproxy.view()
    assert view.queue == 0
    assert sorted(view.sessions.values(), reverse=True)[:3] == [2, 2, 2]
    assert w.haproxy.streams_per_pod({n: p.address for n, p in w.pods.items()}) == {
        "a": 2,
        "b": 2,
        "c": 2,
    }
    w.release()
    reader.join(60)
    assert sorted(str(pod) for pod, _ in results) == ["a", "a", "b", "b", "c", "c"]
    assert [error for _, error in results] == [""] * 6


def test_a_pod_added_by_a_scale_up_gets_streams_on_the_same_channel(world: Any) -> None:
    w = world(slots=2)
    w.add_pod("a")
    w.add_pod("b")
    w.start()
    w.wait_up("a", "b")
    assert {finish(w.stream()[1])[0] for _ in range(4)} <= {"a", "b"}  # the channel is open
    w.add_pod("c")  # the scale-up: one more SRV answer, no reload
    w.wait_up("a", "b", "c")
    w.hold()
    results, reader = in_background([w.stream()[1] for _ in range(6)])
    wait_for(lambda: w.active() == {"a": 2, "b": 2, "c": 2}, what="the new pod's 2 streams")
    w.release()
    reader.join(60)
    assert sorted(str(pod) for pod, _ in results).count("c") == 2
    assert [error for _, error in results] == [""] * 6


def test_scale_in_and_a_draining_pod_cut_no_stream(world: Any) -> None:
    w = world(slots=2)
    for name in "abc":
        w.add_pod(name)
    w.start()
    w.wait_up("a", "b", "c")
    w.hold()
    playing, reader = in_background([w.stream()[1] for _ in range(6)])
    wait_for(lambda: w.active() == {"a": 2, "b": 2, "c": 2}, what="2 streams per pod")
    w.pods["a"].health.draining = True  # cosyvoice-serve's /ready answers 503
    w.list("a", "c")  # ... while b leaves the headless Service's endpoints (scale-in)
    wait_for(
        lambda: {s.address for s in w.haproxy.servers().values() if s.up} == {w.pods["c"].address},
        what="only c up in the router",
    )
    # New streams go to c only: its 2 slots are full, so they wait in the router's queue.
    later, later_reader = in_background([w.stream()[1] for _ in range(2)])
    wait_for(lambda: w.haproxy.view().queue == 2, what="2 streams queued")
    assert w.active() == {"a": 2, "b": 2, "c": 2}  # the playing streams go on
    w.release()
    reader.join(60)
    later_reader.join(60)
    assert [error for _, error in playing + later] == [""] * 8
    assert sorted(str(pod) for pod, _ in playing) == ["a", "a", "b", "b", "c", "c"]
    assert [pod for pod, _ in later] == ["c", "c"]
    assert (w.pods["a"].served, w.pods["b"].served) == (2, 2)


def queued(w: World, n: int) -> bool:
    return w.haproxy.view().queue == n


def test_a_full_fleet_queues_in_the_router_in_arrival_order(world: Any) -> None:
    w = world(slots=1)
    w.add_pod("a")
    w.start()
    w.wait_up("a")
    w.hold()
    ids, readers = [], []
    for n in range(5):
        request_id, call = w.stream()
        ids.append(request_id)
        readers.append(in_background([call]))
        if n == 0:
            wait_for(lambda: w.pods["a"].active == 1, what="the stream on the pod")
        else:  # each arrival waits in the backend's queue behind the ones before it
            wait_for(partial(queued, w, n), what=f"{n} queued")
    assert w.haproxy.view().sessions.get("pod1") == 1  # never more than the slot
    w.release()
    wait_for(lambda: len(w.pods["a"].seen) == 5 and w.pods["a"].active == 0, what="all served")
    assert w.pods["a"].seen == ids  # first come, first served
    for results, reader in readers:
        reader.join(60)
        assert results == [("a", "")]


def test_the_queue_timeout_answers_unavailable(world: Any) -> None:
    w = world(slots=1, queue_timeout_ms=1000)
    w.add_pod("a")
    w.start()
    w.wait_up("a")
    w.hold()
    first, first_reader = in_background([w.stream()[1]])
    wait_for(lambda: w.pods["a"].active == 1, what="the slot taken")
    # The second stream waits for the slot longer than `timeout queue`: HAProxy answers 503,
    # which a gRPC client sees as UNAVAILABLE (HTTP 503 without grpc-status).
    pod, error = finish(w.stream()[1])
    assert pod is None
    assert error.startswith("UNAVAILABLE:"), error
    assert "503" in error, error
    assert w.pods["a"].served == 1
    w.release()
    first_reader.join(60)
    assert first == [("a", "")]


def test_a_client_cancel_frees_the_pods_slot(world: Any) -> None:
    """HAProxy issue #172 (cancel not forwarded to the server; fixed version unconfirmed): on
    2.6 a client's cancel reaches the pod (its context ends) and the slot goes to the queue."""
    w = world(slots=1)
    w.add_pod("a")
    w.start()
    w.wait_up("a")
    w.hold()
    _, held = w.stream()
    in_background([held])
    wait_for(lambda: w.pods["a"].active == 1, what="the slot taken")
    queued_id, queued = w.stream()
    waiting, reader = in_background([queued])
    wait_for(lambda: w.haproxy.view().queue == 1, what="one stream queued")
    held.cancel()
    wait_for(lambda: w.pods["a"].cancelled == 1, what="the pod seeing the cancel")
    wait_for(lambda: w.pods["a"].seen[-1:] == [queued_id], what="the queued stream on the slot")
    assert w.haproxy.view().queue == 0
    w.release()
    reader.join(60)
    assert waiting == [("a", "")]
    wait_for(lambda: w.haproxy.view().sessions.get("pod1") == 0, what="the slot free")


def test_a_router_restart_is_survivable(world: Any) -> None:
    """What a client sees: its streams in flight end with UNAVAILABLE (the connection is
    gone; the utterance must be sent again); the same channel reconnects on its own and its
    next streams are served once the new process has found the pods."""
    w = world(slots=2)
    w.add_pod("a")
    w.add_pod("b")
    w.start()
    w.wait_up("a", "b")
    w.hold()
    playing, reader = in_background([w.stream()[1] for _ in range(2)])
    wait_for(lambda: sum(w.active().values()) == 2, what="2 streams playing")
    w.haproxy.restart()
    reader.join(60)
    assert [pod for pod, _ in playing] == [None, None]
    assert all(error.startswith("UNAVAILABLE:") for _, error in playing), playing
    w.release()
    w.wait_up("a", "b")
    after = [finish(w.stream()[1]) for _ in range(4)]
    assert [error for _, error in after] == [""] * 4
    assert {pod for pod, _ in after} == {"a", "b"}


def test_stand_in_pods_answer_as_the_router_health_check_expects(world: Any) -> None:
    w = world()
    pod = w.add_pod("a", listed=False)
    url = f"http://{pod.address}:{HEALTH_PORT}{HEALTH_PATH}"
    import urllib.error
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
    pod.health.draining = True
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5)
    assert refused.value.code == 503
    with contextlib.suppress(Exception):
        refused.value.close()


@pytest.mark.timeout(240)
def test_the_closed_loop_through_the_router_to_twin_pods(tmp_path: Path) -> None:
    """Real ``tritonserver`` twins (CosyVoice3, the project's orchestrator) on addresses of
    their own, found by DNS; the load generator's ONE channel through the router; Prometheus
    scraping HAProxy beside the pods. A scale-up's pod gets streams on the same channel; a
    pod that goes drains first: not one request fails."""
    from cosyvoice_operator.devtools.closedloop.harness import PodServers
    from cosyvoice_operator.devtools.closedloop.load import LoadGenerator
    from cosyvoice_operator.devtools.closedloop.prometheus import Prometheus, read_targets
    from cosyvoice_operator.devtools.closedloop.router import FleetRouter
    from cosyvoice_operator.shell.prometheus_source import PrometheusSource
    from tests.triton_twin.test_twin import service

    fleet = FleetRouter(
        tmp_path / "router",
        service="tts",
        namespace=NS,
        slots_per_server=2,
        server_slots=4,
        queue_timeout_ms=60000,
    )
    targets = tmp_path / "targets.json"
    pods = {"tts-a", "tts-b"}
    servers = PodServers(
        service("cosyvoice3"),
        tmp_path / "pods",
        targets,
        namespace=NS,
        pods=lambda: set(pods),
        service_seconds=0.4,
        addresses=fleet.block,
        directory=fleet.directory,
        extra_targets=fleet.targets(),
        drained=fleet.drained,
    )
    with fleet, servers, Prometheus(tmp_path, targets) as prometheus:
        servers.wait_live(["tts-a", "tts-b"], timeout=120)
        assert set(read_targets(targets).values()) == {
            (NS, "tts-a"),
            (NS, "tts-b"),
            (NS, fleet.pod),
        }
        fleet.haproxy.wait_servers(set(servers.addresses_of().values()))
        with LoadGenerator(list, servers.model, through=fleet.grpc) as load:
            load.set_concurrency(4)

            def each_served(names: set[str], at_least: int) -> dict[str, int]:
                served = fleet.served_per_pod(servers.addresses_of())
                ok = set(served) == names and min(served.values()) >= at_least
                return served if ok else {}

            wait_for(lambda: each_served({"tts-a", "tts-b"}, 3), 60, "streams on both pods")
            pods.add("tts-c")  # scale-up
            servers.wait_live(["tts-a", "tts-b", "tts-c"], timeout=120)
            wait_for(lambda: each_served({"tts-a", "tts-b", "tts-c"}, 3), 60, "streams on tts-c")
            # The autoscaler's own queries (shell/prometheus_source.py) on this closed loop.
            source = PrometheusSource(prometheus.url, window_seconds=4)

            def read() -> Any:
                found = asyncio.run(source.sample_router(NS, [fleet.pod]))
                busy = found.available and (found.stream_rate or 0) > 0
                busy = busy and (found.in_flight or 0) > 0
                return found if busy and found.active_servers == 3 else None

            reading = wait_for(read, 40, "the router's figures through the autoscaler's source")
            assert reading.slots_per_pod == 2 and reading.routers_seen == 1, reading
            assert (reading.in_flight or 0) + (reading.queued or 0) <= 4, reading  # 4 streams
            # Scale-in under load, tts-a with a stream in flight: it drains (out of the DNS
            # answers, /ready 503) and its Triton stops once the router has nothing on it.
            wait_for(
                lambda: fleet.streams_per_pod(servers.addresses_of()).get("tts-a", 0) > 0,
                30,
                "a stream on tts-a",
            )
            pods.discard("tts-a")
            wait_for(lambda: [p.pod for p in servers.stopped()] == ["tts-a"], 90, "tts-a gone")
            mark = time.monotonic()
            wait_for(lambda: load.summary(since=mark).completed >= 4, 60, "4 more streams")
            load.stop()
            summary = load.summary()
            assert summary.failed == 0 and summary.completed >= 20, summary
            assert {r.server for r in load.records()} == {fleet.grpc}

        def scraped() -> list[Any]:
            query = f'haproxy_backend_current_queue{{proxy="triton", namespace="{NS}"}}'
            return prometheus.query(query)

        rows = wait_for(scraped, 30, "the router's queue in Prometheus")
        assert [r["metric"]["pod"] for r in rows] == [fleet.pod]
    assert not servers.failures


REQUEST_BYTES = 2 * 16000 * 4  # a 2-s 16 kHz FP32 reference, as the closed loop's requests carry
BUFSIZE_DEFAULT = "    tune.bufsize 16384\n"


@pytest.mark.parametrize(
    "global_lines",
    [
        pytest.param("", id="as-rendered"),
        # HAProxy's default buffer (16 KB) stalls the channel: the renderer's tune.bufsize
        # (256 KB) is what the rendered case passes on; this one shows the default failing.
        pytest.param(
            BUFSIZE_DEFAULT,
            marks=pytest.mark.xfail(
                strict=True,
                reason="HAProxy 2.6.12 with tune.bufsize 16384 (its default): a stream with a "
                "real-size request (128 KB) queued in the router stalls every stream of its "
                "client connection (the h2 demux blocks on the full stream buffer)",
            ),
            id="with-the-default-tune.bufsize",
        ),
    ],
)
def test_a_stream_queued_with_a_real_size_request_stalls_no_other_stream(
    world: Any, global_lines: str
) -> None:
    """One channel, one pod with 1 slot: 3 streams, each sending a 2-s reference (128 KB) and
    getting 8 answers of 64 KB of audio; 2 of them wait in the router's queue while one plays.
    Every stream must end well within its deadline."""
    w = world(slots=1)
    rendered = f"    tune.bufsize {front_router.BUFSIZE_BYTES}\n"
    assert rendered in w.haproxy.config_text
    if global_lines:
        w.haproxy.config_text = w.haproxy.config_text.replace(rendered, global_lines, 1)
    pod = w.add_pod("a")
    pod.chunks, pod.chunk_bytes = 8, 65536
    w.start()
    w.wait_up("a")
    assert w.channel is not None
    results: dict[int, str] = {}

    def one(i: int) -> None:
        request = stream_request("tts", [], f"r{i}")
        request.raw_input_contents.append(bytes(REQUEST_BYTES))
        try:
            answers = sum(1 for _ in open_stream(w.channel, request, timeout=6))
            results[i] = f"{answers} answers"
        except grpc.RpcError as err:
            results[i] = err.code().name

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {0: "8 answers", 1: "8 answers", 2: "8 answers"}
    assert pod.served == 3
