"""The simulated plant's router (issue 30): one FIFO over the fleet's slots, R replicas
splitting each pod's slots, the queue timeout, and Envoy's P2C."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cosyvoice_operator.autoscaling.queueing import pooled_replicas_for_miss
from cosyvoice_operator.devtools.sim import oracle
from cosyvoice_operator.devtools.sim.engine import SimConfig, simulate
from cosyvoice_operator.devtools.sim.plant import (
    P2C,
    ROUTER,
    SPREAD_ROUND_ROBIN,
    Plant,
    Prometheus,
    PrometheusModel,
    RouterModel,
    ServiceModel,
)
from cosyvoice_operator.devtools.sim.policies import Ours, Params, make
from cosyvoice_operator.devtools.sim.trace import Trace

# One slot, a stream of a seconds of audio holds it a seconds, first audio after 0.2 s.
ONE_SLOT = ServiceModel(slots=1, rtf=1.0, overhead_s=0.0, first_chunk_s=0.2)
TWO_SLOTS = ServiceModel(
    slots=2, rtf=1.0, overhead_s=0.0, first_chunk_s=0.2, first_chunk_per_stream_s=0.0
)


def routed(model: ServiceModel, pods: int, router: RouterModel) -> Plant:
    plant = Plant(model, 60.0, pods, give_up_s=30.0, routing=ROUTER, router=router)
    plant.tick(0.0)
    return plant


def test_a_queued_stream_takes_the_first_freed_slot_of_any_pod_in_arrival_order() -> None:
    plant = routed(ONE_SLOT, 2, RouterModel(1, queue_timeout_s=10.0))
    assert plant.dispatch(0.0, 5.0) == pytest.approx(0.2)  # pod 0 until 5
    assert plant.dispatch(0.0, 2.0) == pytest.approx(0.2)  # pod 1 until 2
    # Both busy: the next ones wait in the router's queue and take, in arrival order, the
    # slot that frees first, whichever pod's: pod 1's three times (it frees at 2, 3, 4), then
    # pod 0's at 5 (round-robin would have put the first behind pod 0's 5-second stream).
    assert plant.dispatch(0.5, 1.0) == pytest.approx(1.5 + 0.2)  # starts at 2 on pod 1
    assert plant.dispatch(0.6, 1.0) == pytest.approx(2.4 + 0.2)  # at 3 on pod 1
    assert plant.dispatch(0.7, 1.0) == pytest.approx(3.3 + 0.2)  # at 4 on pod 1
    assert plant.dispatch(0.8, 1.0) == pytest.approx(4.2 + 0.2)  # at 5 on pod 0
    # While they wait, the router's queue holds them and the pods' Triton queues are empty.
    assert plant.router_queue(1.0) == 4
    assert plant.router_queue(3.5) == 2
    assert all(not p.waiting for p in plant.pods)
    assert plant.router_sessions(1.0) == 2


def test_with_free_slots_the_pod_with_fewest_active_streams_gets_the_stream() -> None:
    plant = routed(TWO_SLOTS, 2, RouterModel(1))
    plant.dispatch(0.0, 10.0)
    plant.dispatch(0.0, 10.0)
    plant.dispatch(0.0, 10.0)
    busy = sorted(sum(1 for f in p.free if f > 0.0) for p in plant.pods)
    assert busy == [1, 2]  # leastconn: 1 + 1, then the third on either
    plant.dispatch(0.0, 10.0)
    assert sorted(sum(1 for f in p.free if f > 0.0) for p in plant.pods) == [2, 2]


def test_r_replicas_split_each_pods_slots_and_never_overcommit_a_pod() -> None:
    model = replace(TWO_SLOTS, slots=4)
    assert RouterModel(2).slots_per_pod(4) == 2
    assert RouterModel(3).slots_per_pod(4) == 1  # floor: one slot of four left unused
    assert RouterModel(8).slots_per_pod(4) == 1  # at least one
    plant = routed(model, 1, RouterModel(2, spread=SPREAD_ROUND_ROBIN, queue_timeout_s=10.0))
    # Replicas alternate: each has 2 of the pod's 4 slots.
    assert [plant.dispatch(0.0, 4.0) for _ in range(4)] == pytest.approx([0.2] * 4)
    assert plant.router_sessions(0.5) == 4
    # The fifth waits in replica 0's queue for replica 0's slot (4 s), though nothing else
    # is free either; Triton's own queue never holds a stream.
    assert plant.dispatch(1.0, 1.0) == pytest.approx(3.0 + 0.2)
    assert all(not p.waiting for p in plant.pods)
    # With 3 replicas of 1 slot each, a pod of 4 slots serves at most 3 streams.
    three = routed(model, 1, RouterModel(3, spread=SPREAD_ROUND_ROBIN, queue_timeout_s=10.0))
    assert [three.dispatch(0.0, 4.0) for _ in range(3)] == pytest.approx([0.2] * 3)
    assert three.dispatch(0.0, 4.0) == pytest.approx(4.2)  # replica 0 again: waits 4 s
    assert three.router_sessions(1.0) == 3


def test_a_stream_that_would_wait_past_the_queue_timeout_is_refused() -> None:
    plant = routed(ONE_SLOT, 1, RouterModel(1, queue_timeout_s=1.5))
    plant.dispatch(0.0, 3.0)  # busy until 3
    assert plant.dispatch(1.0, 1.0) == plant.give_up_s  # would wait 2 s > 1.5: refused
    assert plant.refused == 1
    assert plant.dispatch(1.6, 1.0) == pytest.approx(1.4 + 0.2)  # waits 1.4: served at 3
    assert plant.refused == 1
    # A refused stream holds no slot: the next one is not delayed by it.
    assert plant.dispatch(10.0, 1.0) == pytest.approx(0.2)


def test_a_refused_stream_is_a_miss_and_leaves_the_queue_at_the_timeout() -> None:
    plant = routed(ONE_SLOT, 1, RouterModel(1, queue_timeout_s=0.5))
    plant.dispatch(0.0, 3.0)
    assert plant.dispatch(1.0, 1.0) == plant.give_up_s  # refused: recorded as a miss
    assert plant.refused == 1
    assert plant.router_queue(1.2) == 1  # waiting until 1.5
    assert plant.router_queue(1.5) == 0


def test_the_queue_timeout_defaults_to_the_slos_wait_budget_and_runs_name_their_routing() -> None:
    # As the operator renders it: first audio 1500 ms minus L20's busy first chunk 1107 ms.
    config = SimConfig(routing=ROUTER, router=RouterModel(2), slo_s=1.5)
    assert config.router_model().queue_timeout_s == pytest.approx(0.393)
    assert config.routing_json() == {
        "mode": "router",
        "router_replicas": 2,
        "spread": "random",
        "queue_timeout_s": pytest.approx(0.393),
        "slots_per_pod_per_replica": 2,
    }
    given = SimConfig(routing=ROUTER, router=RouterModel(1, queue_timeout_s=2.0))
    assert given.router_model().queue_timeout_s == 2.0
    assert SimConfig(slo_s=1.0).router_model().queue_timeout_s == 30.0  # no budget left
    assert SimConfig().routing_json() == {"mode": "round-robin"}
    with pytest.raises(ValueError, match="router replicas"):
        RouterModel(0)
    with pytest.raises(ValueError, match="spread"):
        RouterModel(1, spread="hash")


def test_p2c_sends_to_the_less_active_of_two_pods_and_queues_there() -> None:
    plant = Plant(ONE_SLOT, 60.0, 2, routing=P2C)
    plant.tick(0.0)
    plant.dispatch(0.0, 5.0)
    assert plant.dispatch(0.0, 5.0) == pytest.approx(0.2)  # the idle pod, either draw order
    # Both pods hold one: the next waits in the queue of the pod drawn, for 5 s, though a
    # fleet queue would not do better here; then the other pod has fewer active requests.
    assert plant.dispatch(0.1, 1.0) == pytest.approx(4.9 + 0.2)
    assert plant.dispatch(0.2, 1.0) == pytest.approx(4.8 + 0.2)  # the other pod's slot
    assert sorted(len(p.waiting) for p in plant.pods) == [1, 1]


def test_prometheus_scrapes_the_routers_gauges_and_stream_counter() -> None:
    prom = Prometheus(PrometheusModel(scrape_interval_s=15.0, rate_window_s=60.0), [(100, 130)])
    assert prom.router_view(0.0) is None
    prom.scrape_router(0.0, 0, 4, 0)
    assert prom.router_view(0.0) is None  # one sample: no rate yet
    prom.scrape_router(15.0, 2, 8, 30)
    prom.scrape_router(30.0, 4, 8, 90)
    view = prom.router_view(30.0)
    assert view is not None
    assert (view.queue, view.sessions, view.mean_queue) == (4.0, 8.0, 2.0)
    assert view.mean_sessions == pytest.approx(20 / 3)
    assert view.stream_rate == pytest.approx(3.0)
    assert prom.router_view(110.0) is None  # outage


def test_ours_behind_the_router_reads_the_routers_queue() -> None:
    # One pod of one slot, a stream of 2 s every second: the router's queue grows, Triton's
    # stays empty; our policy sees the router's line and scales up.
    arrivals = tuple(float(t) for t in range(600))
    trace = Trace("steady", arrivals, tuple(2.0 for _ in arrivals), 600.0)
    config = SimConfig(
        service=ONE_SLOT, routing=ROUTER, router=RouterModel(1), warmup_s=0.0, cold_start_s=30.0
    )
    params: Params = {"min_replicas": 1, "target_ms": 100, "up_step": 4, "down_window_s": 300}
    outcome = simulate(trace, make("cosyvoice", params), config)
    assert outcome.max_replicas >= 2
    assert outcome.refused > 0  # before the new pods came


def test_ours_behind_the_router_holds_without_the_routers_series() -> None:
    plant = routed(ONE_SLOT, 1, RouterModel(1))
    prom = Prometheus(PrometheusModel(), [])
    for t in (0.0, 15.0):
        prom.scrape(t, plant.pods)  # Triton's series, none of the router's
    params: Params = {"min_replicas": 1, "target_ms": 100, "down_window_s": 300}
    obs = Ours(params).observation(20.0, plant, prom)
    assert obs.router is not None and not obs.available
    assert obs.unavailable_reason == "NoData"
    prom.scrape_router(0.0, 0, 0, 0)
    prom.scrape_router(15.0, 0, 0, 0)
    assert Ours(params).observation(20.0, plant, prom).available


def test_the_clairvoyant_schedule_behind_the_router_sizes_one_pooled_queue() -> None:
    model = ServiceModel()  # L20: 4 slots
    arrivals = [i * 0.25 for i in range(240)]  # 4 per second for a minute
    budget = 0.39
    per_pod = oracle.bucket_needs(arrivals, [8.0] * 240, model, 60.0, budget, 0.01)
    pooled = oracle.bucket_needs(arrivals, [8.0] * 240, model, 60.0, budget, 0.01, 4)
    load = 240 * model.service_seconds(8.0) / 60.0
    service = model.service_seconds(8.0)
    assert pooled == [pooled_replicas_for_miss(load, 4, service, budget, 0.01)]
    assert pooled[0] < per_pod[0]  # one queue over the fleet needs fewer pods
    assert oracle.pooled_slots(SimConfig(routing=ROUTER, router=RouterModel(3))) == 3
    assert oracle.pooled_slots(SimConfig()) == 0
