"""The simulated plant (pods, queue, drain) and Prometheus, and the KPA-style decider."""

from __future__ import annotations

import pytest

from cosyvoice_operator.devtools.sim.kpa import Kpa, KpaConfig
from cosyvoice_operator.devtools.sim.plant import Plant, Prometheus, PrometheusModel, ServiceModel

ONE_SECOND = ServiceModel(slots=1, rtf=1.0, overhead_s=0.0, first_chunk_s=0.2)


def test_fifo_with_one_slot_queues_the_second_request() -> None:
    plant = Plant(ONE_SECOND, cold_start_s=60.0, initial_ready=1)
    plant.tick(0.0)
    assert plant.dispatch(0.0, 1.0) == pytest.approx(0.2)  # first chunk only
    assert plant.dispatch(0.5, 1.0) == pytest.approx(0.5 + 0.2)  # waits until 1.0
    assert plant.dispatch(3.0, 1.0) == pytest.approx(0.2)  # idle again


def test_first_chunk_slows_with_busy_streams() -> None:
    model = ServiceModel(
        slots=4, rtf=1.0, overhead_s=0.0, first_chunk_s=0.2, first_chunk_per_stream_s=0.3
    )
    plant = Plant(model, cold_start_s=60.0, initial_ready=1)
    plant.tick(0.0)
    firsts = [plant.dispatch(0.0, 10.0) for _ in range(4)]
    assert firsts == pytest.approx([0.2, 0.5, 0.8, 1.1])


def test_round_robin_over_ready_pods_and_cold_start() -> None:
    plant = Plant(ONE_SECOND, cold_start_s=60.0, initial_ready=1)
    plant.tick(0.0)
    plant.scale_to(2, 0.0)
    plant.tick(0.0)
    assert plant.counts(0.0) == (2, 1, 1)
    # The new pod is not Ready: both requests go to the old one, the second waits.
    assert plant.dispatch(10.0, 1.0) == pytest.approx(0.2)
    assert plant.dispatch(10.0, 1.0) == pytest.approx(1.2)
    plant.tick(60.0)
    assert plant.counts(60.0) == (2, 2, 0)
    assert plant.dispatch(100.0, 1.0) == pytest.approx(0.2)
    assert plant.dispatch(100.0, 1.0) == pytest.approx(0.2)  # the other pod


def test_scale_down_removes_starting_pods_first_then_drains() -> None:
    plant = Plant(ONE_SECOND, cold_start_s=60.0, initial_ready=2)
    plant.tick(0.0)
    plant.dispatch(0.0, 30.0)  # pod 0 busy until 30 s
    plant.scale_to(3, 0.0)
    plant.scale_to(2, 10.0)  # the starting pod goes, at once
    assert plant.counts(10.0) == (2, 2, 0)
    plant.scale_to(1, 10.0)  # the youngest Ready pod (1, idle) goes
    plant.tick(10.0)
    plant.scale_to(0, 10.0)  # pod 0 drains: deleted once its stream ends
    plant.tick(11.0)
    assert plant.counts(11.0) == (0, 0, 0)
    plant.tick(31.0)
    # GPU time: pod 0 0..31 (tick granularity), pod 1 0..10, the starting pod 0..10.
    assert plant.gpu_seconds(100.0) == pytest.approx(31 + 10 + 10)


def test_a_request_that_waits_too_long_is_given_up() -> None:
    plant = Plant(ONE_SECOND, cold_start_s=60.0, initial_ready=1, give_up_s=5.0)
    plant.tick(0.0)
    plant.dispatch(0.0, 100.0)
    assert plant.dispatch(1.0, 1.0) == 5.0
    # It never held the slot: the next one starts when the first ends.
    assert plant.dispatch(99.5, 1.0) == pytest.approx(0.5 + 0.2)


def test_prometheus_rates_gauge_outage_and_lag() -> None:
    plant = Plant(ONE_SECOND, cold_start_s=60.0, initial_ready=1)
    plant.tick(0.0)
    prom = Prometheus(PrometheusModel(15.0, 60.0, lag_s=0.0), outages=[(100.0, 160.0)])
    prom.scrape(0.0, plant.pods)
    assert prom.view(5.0, 0) is None  # one sample: no rate yet
    for k in range(4):
        plant.dispatch(15.0 * k + 1, 2.0)  # 2 s streams, no queue
    plant.dispatch(46.0, 20.0)
    plant.dispatch(46.5, 1.0)  # queued behind it until 66
    for t in (15.0, 30.0, 45.0, 60.0):
        prom.scrape(t, plant.pods)
    view = prom.view(60.0, 0)
    assert view is not None
    # Samples 0..60 s: 4 completions over 60 s, 2 s each, no queue; 1 waiting now.
    assert view.completion_rate == pytest.approx(4 / 60)
    assert view.in_system == pytest.approx(8 / 60)
    assert view.queue_ms == 0.0
    assert view.pending == 1.0
    lagged = Prometheus(PrometheusModel(15.0, 60.0, lag_s=20.0), outages=[])
    lagged.series = prom.series
    assert lagged.view(60.0, 0) is not None and lagged.view(60.0, 0) != view
    assert prom.view(120.0, 0) is None  # the outage: empty
    prom.scrape(120.0, plant.pods)  # lost
    prom.scrape(165.0, plant.pods)
    assert prom.view(170.0, 0) is None  # one fresh sample in the window after it
    prom.scrape(180.0, plant.pods)
    after = prom.view(181.0, 0)
    assert after is not None
    # The stream that queued completed at 67, inside the gap: its increase fell between the
    # samples at 60 and 165, outside any 60 s window (as with Prometheus' rate()).
    assert after.completion_rate == 0.0


def test_queue_time_shows_when_the_request_completes() -> None:
    plant = Plant(ONE_SECOND, cold_start_s=60.0, initial_ready=1)
    plant.tick(0.0)
    prom = Prometheus(PrometheusModel(15.0, 60.0), outages=[])
    plant.dispatch(1.0, 20.0)
    plant.dispatch(1.5, 1.0)  # waits 19.5 s, streams 21..22
    for t in (0.0, 15.0):
        prom.scrape(t, plant.pods)
    early = prom.view(16.0, 0)
    assert early is not None and early.queue_ms == 0.0 and early.pending == 1.0
    prom.scrape(30.0, plant.pods)
    late = prom.view(31.0, 0)
    assert late is not None
    assert late.pending == 0.0
    # Two completions in 0..30 s; 19.5 s of queue time between them.
    assert late.queue_ms == pytest.approx(19_500.0 / 2)


def test_kpa_follows_the_stable_window_and_rate_limits_down() -> None:
    kpa = Kpa(KpaConfig(target=2.0))
    for t in range(60):
        kpa.observe(float(t), 10.0)
    assert kpa.decide(60.0, ready=5) == 5
    assert not kpa.panicking
    quiet = Kpa(KpaConfig(target=2.0))
    for t in range(60):
        quiet.observe(float(t), 0.0)
    assert quiet.decide(60.0, ready=10) == 5  # at most halved per decision


def test_kpa_panics_at_200_percent_and_never_scales_down_in_panic() -> None:
    kpa = Kpa(KpaConfig(target=2.0))
    for t in range(54):
        kpa.observe(float(t), 4.0)
    for t in range(54, 60):
        kpa.observe(float(t), 20.0)  # the 6 s panic window: 10 pods wanted, 5x the 2 Ready
    assert kpa.decide(60.0, ready=2) == 10
    assert kpa.panicking
    for t in range(60, 90):
        kpa.observe(float(t), 2.0)
    assert kpa.decide(90.0, ready=10) == 10  # panicking still: no scale-down
    for t in range(90, 125):
        kpa.observe(float(t), 2.0)
    assert kpa.decide(125.0, ready=10) == 5  # 60 s without panic: stable, halved at most
    assert not kpa.panicking


def test_kpa_scale_down_delay_keeps_the_highest_recent_desire() -> None:
    kpa = Kpa(KpaConfig(target=1.0, scale_down_delay_s=30.0))
    for t in range(60):
        kpa.observe(float(t), 8.0)
    assert kpa.decide(60.0, ready=8) == 8
    for t in range(60, 130):
        kpa.observe(float(t), 1.0)
    assert kpa.decide(80.0, ready=8) == 8  # within the delay
    assert kpa.decide(125.0, ready=8) == 4  # past it: the stable desire, at most halved


def test_the_default_pod_is_upstreams_l20_and_our_slo_sizing_keeps_its_figures() -> None:
    from cosyvoice_operator.devtools.sim.experiment import OURS_SLO

    pod = ServiceModel()
    assert (pod.pod, pod.slots, pod.first_chunk_busy_ms) == ("L20", 4, 1107)
    # the figures OURS_SLO has always had, so earlier runs' keys (and sim.json reuse) hold
    sizing = pod.slo_sizing(1.5)
    assert sizing == {k: OURS_SLO[k] for k in sizing}
    assert sizing["target_ms"] == 1500 - 1107
    assert pod.slo_sizing(2.0)["target_ms"] == 2000 - 1107
    assert "L20" in pod.describe() and "not measured here" in pod.describe()


def test_a_measured_pod_profile_drives_the_plant_and_the_sizing() -> None:
    from cosyvoice_operator.api.pod_profiles import PodProfile

    profile = PodProfile(
        gpu="X1",
        slots=16,
        rtf=0.9,
        overhead_s=0.0,
        first_chunk_s=0.4,
        first_chunk_per_stream_s=0.1,
        first_chunk_busy_ms=1900,
        source="a sweep",
    )
    pod = ServiceModel.for_pod(profile)
    assert (pod.slots, pod.rtf, pod.first_chunk_busy_ms, pod.pod) == (16, 0.9, 1900, "X1")
    assert pod.slo_sizing(2.5) == {
        "slo_ms": 2500,
        "first_chunk_ms": 1900,
        "target_ms": 600,
        "slots": 16,
    }
    with pytest.raises(ValueError, match="1900 ms, not below the SLO's 1500 ms"):
        pod.slo_sizing(1.5)
    plant = Plant(pod, cold_start_s=60.0, initial_ready=1)
    plant.tick(0.0)
    assert [plant.dispatch(0.0, 10.0) for _ in range(3)] == pytest.approx([0.4, 0.5, 0.6])


def test_least_loaded_routing_sends_to_the_pod_that_frees_first() -> None:
    # Two one-slot pods; a long request holds pod 0, a short one pod 1. The third request
    # goes to pod 0 by round robin (and waits for it), to pod 1 when routed by load.
    waits = {}
    for routing in ("round-robin", "least-loaded"):
        plant = Plant(ONE_SECOND, cold_start_s=60.0, initial_ready=2, routing=routing)
        plant.tick(0.0)
        assert plant.dispatch(0.0, 20.0) == pytest.approx(0.2)
        assert plant.dispatch(0.0, 1.0) == pytest.approx(0.2)
        waits[routing] = plant.dispatch(5.0, 1.0)
    assert waits == pytest.approx({"round-robin": 15.2, "least-loaded": 0.2})


def test_least_loaded_routing_breaks_ties_by_busy_streams() -> None:
    model = ServiceModel(
        slots=2, rtf=1.0, overhead_s=0.0, first_chunk_s=0.2, first_chunk_per_stream_s=0.3
    )
    plant = Plant(model, cold_start_s=60.0, initial_ready=2, routing="least-loaded")
    plant.tick(0.0)
    # every request finds a free slot; each goes where fewer streams are busy
    assert [plant.dispatch(0.0, 10.0) for _ in range(4)] == pytest.approx([0.2, 0.2, 0.5, 0.5])


def test_an_unknown_routing_is_refused() -> None:
    with pytest.raises(ValueError, match="round-robin, least-loaded"):
        Plant(ONE_SECOND, cold_start_s=60.0, initial_ready=1, routing="random")
