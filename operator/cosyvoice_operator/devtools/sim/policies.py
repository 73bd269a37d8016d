"""The policies compared, each as a controller the simulator calls on its own schedule.

- ``cosyvoice``: the operator's own policy, `cosyvoice_operator.autoscaling.policy.decide`, run
  unchanged, fed every 15 s the way the operator feeds it (`metrics_source`'s queries over
  the Ready pods: queue latency per completed request, pending requests, requests in the
  system by Little's law, completions per second; no series for any Ready pod is
  ``NoData``); behind the router (routing ``router``) with the router's reading too
  (`Observation.router`: streams in flight and queued, streams per second, slots per pod).
- ``hpa``: Kubernetes' HPA (`hpa`) on a ``Pods`` metric, each pod's queue time per request
  in milliseconds (``rate(queue_us) / clamp_min(rate(success), 1e-6)`` through
  prometheus-adapter), 15 s sync.
- ``hpa-concurrency``: the same HPA on each pod's requests in the system (Little's law:
  ``rate(nv_inference_request_duration_us) / 1e6``).
- ``keda``: a KEDA ScaledObject with a Prometheus trigger: the service's summed
  ``rate(nv_inference_request_duration_us) / 1e6`` polled every 30 s, an ``AverageValue``
  threshold per pod, an empty result read as 0 (``ignoreNullValues`` true), consumed by
  the HPA KEDA makes (External metric, 15 s sync, HPA's behaviour).
- ``keda-fallback``: the same KEDA ScaledObject as its users are told to deploy it against
  empty results: ``ignoreNullValues: false`` (an empty result is an error) and
  ``fallback: {failureThreshold: 3, replicas: F}``: after 3 failed polls in a row the HPA is
  fed ``F x threshold``, i.e. sized to ``F`` replicas, until a poll succeeds.
- ``llmd``: llm-d's SLO-aware KEDA rule (llm-d/llm-d PR #2011, llm-d-autoscaling PR #1376):
  a recording rule every 15 s of the P90 first audio over the last minute divided by the
  SLO, each sample clamped at ``CLAMP`` before a 45 s ``avg_over_time``, no traffic read as
  0 (``or vector(0)``), consumed as an ``External`` metric with a ``Value`` target (the
  threshold, swept), HPA behaviour. The P90 is exact here (every request's first audio), as
  from a histogram with fine buckets; an empty result (an outage) is 0, KEDA's default.
- ``kpa``: a Knative KPA style decider (`kpa`) on the concurrency of the pods, which
  Knative samples from the pods itself (not through Prometheus) every second.
- ``static``: a fixed count.

A controller returns a `Verdict`: the count to set, and whether the data it decided on
was missing (for counting scale-downs caused by missing data).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from cosyvoice_operator.api.spec import AutoscalingSpec, ScaleRule, SloSpec
from cosyvoice_operator.autoscaling import policy as scaling
from cosyvoice_operator.autoscaling.sample import RouterSample, router_unavailable
from cosyvoice_operator.devtools.sim import hpa as hpa_model
from cosyvoice_operator.devtools.sim import kpa as kpa_model
from cosyvoice_operator.devtools.sim.plant import ROUTER, Plant, Prometheus, RouterView

EPOCH = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # a Monday; the policy needs aware times
PHASE_S = 5.0  # controllers evaluate 5 s after the scrapes they read (they are not aligned)

Params = dict[str, float | int]


@dataclass(frozen=True)
class Verdict:
    replicas: int
    missing: bool = False


class Controller(Protocol):
    policy: str
    params: Params
    interval_s: float
    samples_pods: bool  # observe() is called every second with the pods' concurrency

    def observe(self, now: float, concurrency: float) -> None: ...

    def evaluate(self, now: float, plant: Plant, prom: Prometheus) -> Verdict: ...


@dataclass
class _Base:
    params: Params
    interval_s: float = hpa_model.SYNC_PERIOD_S
    samples_pods: bool = False
    policy: str = ""

    def observe(self, now: float, concurrency: float) -> None:
        return None


@dataclass
class Ours(_Base):
    policy: str = "cosyvoice"

    def __post_init__(self) -> None:
        p = self.params
        self.spec = AutoscalingSpec(
            enabled=True,
            min_replicas=int(p["min_replicas"]),
            max_replicas=int(p.get("max_replicas", 1000)),
            target_queue_latency_milliseconds=float(p["target_ms"]),
            evaluation_interval_seconds=int(self.interval_s),
            scale_up=ScaleRule(int(p.get("up_window_s", 0)), int(p.get("up_step", 4))),
            scale_down=ScaleRule(int(p["down_window_s"]), int(p.get("down_step", 1))),
            slo=SloSpec(
                first_audio_milliseconds=int(p.get("slo_ms", 0)),
                attainment_percent=float(p.get("attainment", 99.0)),
                first_chunk_milliseconds=int(p.get("first_chunk_ms", 1107)),
                cold_start_seconds=int(p.get("cold_start_s", 180)),
                forecast_std_devs=float(p.get("z", 1.0)),
                variability=float(p.get("variability", 1.0)),
                slots_per_pod=int(p.get("slots", 0)),
                seasonal_period_hours=int(p.get("seasonal_h", 0)),
                seasonal_bucket_minutes=int(p.get("bucket_min", 15)),
                seasonal_floor_percent=float(p.get("floor_pct", 100.0)),
                scale_down_hysteresis_percent=float(p.get("hyst_pct", 10.0)),
            ),
        )
        self.history: tuple[scaling.Recommendation, ...] = ()

    def observation(self, now: float, plant: Plant, prom: Prometheus) -> scaling.Observation:
        triton = self._triton(now, plant, prom)
        if plant.routing != ROUTER:
            return triton
        # Behind the router, as the operator combines them (`evaluation.observation`): the
        # router's reading decides whether the sample is usable; Triton's numbers ride along
        # when Triton's sample has them.
        view = prom.router_view(now)
        reading = (
            _router_reading(view, plant)
            if view is not None
            else router_unavailable(scaling.NO_DATA, "no series for the router pods")
        )
        ok = triton.available
        return scaling.Observation(
            time=triton.time,
            available=reading.available,
            unavailable_reason=reading.unavailable_reason,
            message=reading.message,
            queue_latency_ms=triton.queue_latency_ms if ok else None,
            pending_requests=triton.pending_requests if ok else None,
            in_flight=triton.in_flight if ok else None,
            completion_rate=triton.completion_rate if ok else None,
            no_traffic=False,
            router=reading,
        )

    def _triton(self, now: float, plant: Plant, prom: Prometheus) -> scaling.Observation:
        moment = EPOCH + dt.timedelta(seconds=now)
        views = [prom.view(now, p.name) for p in plant.live() if p.ready_at <= now]
        fresh = [v for v in views if v is not None]
        if not fresh:
            return scaling.Observation(
                moment,
                False,
                scaling.NO_DATA,
                "no series for the Ready pods",
                None,
                None,
                None,
                None,
                False,
            )
        completions = sum(v.completion_rate for v in fresh)
        queue_us = sum(v.queue_us_rate for v in fresh)
        request_us = sum(v.request_us_rate for v in fresh)
        pending = sum(v.pending for v in fresh)
        return scaling.Observation(
            time=moment,
            available=True,
            unavailable_reason="",
            message="",
            queue_latency_ms=1e-3 * queue_us / max(completions, 1e-6),
            pending_requests=pending,
            in_flight=request_us / 1e6,
            completion_rate=completions,
            no_traffic=completions == 0 and queue_us == 0 and request_us == 0 and pending == 0,
        )

    def evaluate(self, now: float, plant: Plant, prom: Prometheus) -> Verdict:
        current, ready, starting = plant.counts(now)
        obs = self.observation(now, plant, prom)
        decision = scaling.decide(
            self.spec,
            obs,
            scaling.Fleet(current=current, ready=ready, starting=starting),
            self.history,
            obs.time,
        )
        self.history = decision.history
        return Verdict(decision.replicas, missing=not decision.metrics_available)


def _router_reading(view: RouterView, plant: Plant) -> RouterSample:
    """The router's figures as the operator's source reads them (`sample.RouterSample`):
    streams on the pods and queued now (the gauges' last samples), streams arriving per
    second over the window, each pod's slots summed over the routers (their maxconn), the
    Ready pods a router sees."""
    model = plant.router
    return RouterSample(
        available=True,
        unavailable_reason="",
        message="",
        in_flight=view.sessions,
        queued=view.queue,
        stream_rate=view.stream_rate,
        slots_per_pod=float(model.replicas * model.slots_per_pod(plant.model.slots)),
        active_servers=float(len(plant.routable)),
        routers_seen=model.replicas,
    )


@dataclass
class Hpa(_Base):
    """``params``: target (ms of queue time, or requests per pod), min_replicas,
    down_window_s; ``metric`` "queue" or "concurrency"."""

    metric: str = "queue"
    policy: str = "hpa"

    def __post_init__(self) -> None:
        self.policy = "hpa" if self.metric == "queue" else "hpa-concurrency"
        self.hpa = _hpa(self.params)

    def evaluate(self, now: float, plant: Plant, prom: Prometheus) -> Verdict:
        current = len(plant.live())
        pods: list[hpa_model.PodMetric] = []
        for pod in plant.live():
            if pod.ready_at > now:
                pods.append(hpa_model.PodMetric(None, running=False))
                continue
            view = prom.view(now, pod.name)
            if view is None:
                pods.append(hpa_model.PodMetric(None))
            else:
                value = view.queue_ms if self.metric == "queue" else view.in_system
                pods.append(hpa_model.PodMetric(value))
        raw = hpa_model.pods_metric_replicas(current, pods, float(self.params["target"]))
        missing = all(p.value is None for p in pods)
        return Verdict(self.hpa.sync(now, current, raw), missing=missing)


def _hpa(params: Params) -> hpa_model.Hpa:
    down = hpa_model.ScalingRules(
        float(params["down_window_s"]), hpa_model.DEFAULT_SCALE_DOWN.policies
    )
    return hpa_model.Hpa(
        min_replicas=int(params["min_replicas"]),
        max_replicas=int(params.get("max_replicas", 1000)),
        down=down,
    )


@dataclass
class Keda(_Base):
    """``params``: target (requests in the system per pod), min_replicas, down_window_s."""

    policy: str = "keda"
    polling_s: float = 30.0
    value: float = 0.0
    empty: bool = False
    polled: float = field(default=-1e18)

    def __post_init__(self) -> None:
        self.hpa = _hpa(self.params)

    def poll(self, now: float, plant: Plant, prom: Prometheus) -> bool:
        """Query Prometheus when a poll is due (True then): ``sum(...)`` over every pod with
        a series, an empty vector when none has one (``empty``; its value read as 0)."""
        if now - self.polled < self.polling_s:
            return False
        self.polled = now
        recent = [p for p in plant.retired if (p.deleted or 0.0) > now - 120.0]
        views = [prom.view(now, p.name) for p in [*plant.pods, *recent]]
        found = [v for v in views if v is not None]
        self.empty = not found
        self.value = sum(v.in_system for v in found)
        return True

    def evaluate(self, now: float, plant: Plant, prom: Prometheus) -> Verdict:
        self.poll(now, plant, prom)  # ignoreNullValues: an empty result is 0
        current = len(plant.live())
        raw = hpa_model.external_average_replicas(current, self.value, float(self.params["target"]))
        return Verdict(self.hpa.sync(now, current, raw), missing=self.empty)


@dataclass
class KedaFallback(Keda):
    """``params``: as `Keda`, and ``fallback`` (replicas while the query keeps failing)."""

    policy: str = "keda-fallback"
    failures: int = 0
    failure_threshold: int = 3

    def evaluate(self, now: float, plant: Plant, prom: Prometheus) -> Verdict:
        if self.poll(now, plant, prom):
            self.failures = self.failures + 1 if self.empty else 0
        current = len(plant.live())
        target = float(self.params["target"])
        if self.failures >= self.failure_threshold:
            raw = hpa_model.external_average_replicas(
                current, float(self.params["fallback"]) * target, target
            )
        elif self.empty:
            return Verdict(current, missing=True)  # an error: the HPA does not scale
        else:
            raw = hpa_model.external_average_replicas(current, self.value, target)
        return Verdict(self.hpa.sync(now, current, raw), missing=self.empty)


# llm-d's rule clamps each latency/SLO sample before smoothing; its value is not in what we
# found (PR #2011 names a clamp C without its value here): 2, i.e. twice the SLO.
CLAMP = 2.0


@dataclass
class Llmd(_Base):
    """``params``: target (the saturation threshold, P90 first audio / SLO), min_replicas,
    down_window_s; ``slo_s``: the SLO (the simulation's, given by `make`)."""

    policy: str = "llmd"
    slo_s: float = 1.5
    samples: list[float] = field(default_factory=list)
    recorded: float = field(default=-1e18)

    def __post_init__(self) -> None:
        self.hpa = _hpa(self.params)

    def _p90(self, now: float, plant: Plant) -> float | None:
        log = plant.first_audio_log
        if log is None:
            plant.first_audio_log = deque()
            return None
        while log and log[0][0] < now - 120.0:
            log.popleft()
        seen = sorted(lat for t, lat in log if now - 60.0 < t + lat <= now)
        if not seen:
            return None
        return seen[min(len(seen) - 1, math.ceil(0.9 * len(seen)) - 1)]

    def evaluate(self, now: float, plant: Plant, prom: Prometheus) -> Verdict:
        slo = self.slo_s
        outage = prom.in_outage(now)
        if now - self.recorded >= 15.0:
            self.recorded = now
            p90 = None if outage else self._p90(now, plant)
            self.samples = [*self.samples[-2:], min(CLAMP, (p90 or 0.0) / slo)]
        value = 0.0 if outage else sum(self.samples) / len(self.samples)
        current, ready, _ = plant.counts(now)
        raw = hpa_model.external_value_replicas(current, ready, value, float(self.params["target"]))
        return Verdict(self.hpa.sync(now, current, raw), missing=outage)


@dataclass
class Kpa(_Base):
    """``params``: target (concurrency per pod), min_replicas, down_window_s (the
    scale-down delay)."""

    policy: str = "kpa"
    interval_s: float = kpa_model.TICK_S
    samples_pods: bool = True

    def __post_init__(self) -> None:
        p = self.params
        self.kpa = kpa_model.Kpa(
            kpa_model.KpaConfig(
                target=float(p["target"]),
                min_scale=int(p["min_replicas"]),
                max_scale=int(p.get("max_replicas", 1000)),
                scale_down_delay_s=float(p["down_window_s"]),
            )
        )

    def observe(self, now: float, concurrency: float) -> None:
        self.kpa.observe(now, concurrency)

    def evaluate(self, now: float, plant: Plant, prom: Prometheus) -> Verdict:
        current, ready, _ = plant.counts(now)
        desired = self.kpa.decide(now, ready)
        return Verdict(current if desired is None else desired)


@dataclass
class Static(_Base):
    policy: str = "static"
    interval_s: float = 1e12

    def evaluate(self, now: float, plant: Plant, prom: Prometheus) -> Verdict:
        return Verdict(int(self.params["replicas"]))


def make(policy: str, params: Params, slo_s: float = 1.5) -> Controller:
    """A fresh controller of ``policy`` with ``params``; ``slo_s``, the first-audio SLO, is
    what llm-d's rule divides by (the others do not read it)."""
    if policy == "cosyvoice":
        return Ours(dict(params))
    if policy == "hpa":
        return Hpa(dict(params), metric="queue")
    if policy == "hpa-concurrency":
        return Hpa(dict(params), metric="concurrency")
    if policy == "keda":
        return Keda(dict(params))
    if policy == "keda-fallback":
        return KedaFallback(dict(params))
    if policy == "llmd":
        return Llmd(dict(params), slo_s=slo_s)
    if policy == "kpa":
        return Kpa(dict(params))
    if policy == "static":
        return Static(dict(params))
    raise ValueError(f"unknown policy {policy!r}")


POLICIES = (
    "cosyvoice",
    "hpa",
    "hpa-concurrency",
    "keda",
    "keda-fallback",
    "llmd",
    "kpa",
    "static",
)
