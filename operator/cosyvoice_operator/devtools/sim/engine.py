"""One policy on one trace: the simulation loop and what it measures.

Time advances in steps of one second. At each second boundary: pods that became Ready join
the endpoints and drained pods are deleted; Prometheus scrapes when a scrape is due; a
policy that samples pods directly (KPA) gets the concurrency; the policy evaluates when its
interval comes round (5 s after the scrapes, `policies.PHASE_S`) and its count is applied at
once. Then the second's arrivals are sent, each at its exact time, to the Ready pods
round-robin (`plant.Plant.dispatch`).

Every policy starts from the same fleet, ``initial_replicas`` Ready pods (the static policy
from its own count), and first runs a warm-up that is not scored: the trace's first
``warmup_s`` seconds played once before it, so that each policy reaches its own steady state
(its windows filled, its fleet sized) as if the service had been running before the trace
began. For the first half of the warm-up the policies watch and decide, but the fleet is
held at its initial count (their windows fill with what a running service shows); then
they act. Latencies, GPU time and scale events count from the end of the warm-up.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field, replace

from cosyvoice_operator.devtools.sim.plant import (
    ROUND_ROBIN,
    ROUTER,
    Plant,
    Prometheus,
    PrometheusModel,
    RouterModel,
    ServiceModel,
)
from cosyvoice_operator.devtools.sim.policies import PHASE_S, Controller
from cosyvoice_operator.devtools.sim.trace import Trace

DEFAULT_QUEUE_TIMEOUT_S = 30.0  # the operator's timeout queue without an SLO


@dataclass(frozen=True)
class SimConfig:
    service: ServiceModel = field(default_factory=ServiceModel)
    prometheus: PrometheusModel = field(default_factory=PrometheusModel)
    cold_start_s: float = 180.0
    slo_s: float = 1.5  # first audio
    initial_replicas: int = 1
    warmup_s: float = 600.0
    give_up_s: float = 30.0  # a client stops waiting for a request that has not started
    # How streams reach the pods (`plant.ROUTINGS`): round-robin behind a Service (the default
    # and every result recorded before issue 30), least-loaded (a what-if), the operator's
    # router (with `router`), Envoy's P2C.
    routing: str = ROUND_ROBIN
    router: RouterModel = field(default_factory=RouterModel)  # routing "router" only

    def router_model(self) -> RouterModel:
        """The router with its queue timeout resolved. 0: as the operator renders it
        (`render.front.queue_timeout_ms`), the SLO's wait budget, first audio minus the pod's
        first chunk with every slot busy; 30 s when that leaves none."""
        if self.router.queue_timeout_s:
            return self.router
        budget = round(1000 * self.slo_s) - self.service.first_chunk_busy_ms
        timeout = budget / 1000 if budget > 0 else DEFAULT_QUEUE_TIMEOUT_S
        return replace(self.router, queue_timeout_s=timeout)

    def routing_json(self) -> dict[str, object]:
        """The routing as every run's JSON names it."""
        if self.routing != ROUTER:
            return {"mode": self.routing}
        r = self.router_model()
        return {
            "mode": self.routing,
            "router_replicas": r.replicas,
            "spread": r.spread,
            "queue_timeout_s": r.queue_timeout_s,
            "slots_per_pod_per_replica": r.slots_per_pod(self.service.slots),
        }


@dataclass(frozen=True)
class Minute:
    """One minute of the run, for the plot."""

    t: float
    arrivals: int
    p95_s: float  # NaN in a minute of fewer than MIN_PERCENTILE_SAMPLES arrivals
    replicas: int
    ready: int


@dataclass(frozen=True)
class Outcome:
    requests: int
    slo_attainment: float
    gpu_hours: float
    scale_events: int
    reversals: int
    missing_data_scale_downs: int
    p50_first_audio_s: float
    p95_first_audio_s: float
    p99_first_audio_s: float
    minutes_in_violation: int  # minutes in which more than 1 % missed the SLO
    max_replicas: int
    timeline: tuple[Minute, ...]
    refused: int = 0  # streams the router's queue timeout refused (counted as misses)


# The fewest samples a reported percentile (p50, p95, p99 of latencies) is taken from: below
# it a p95 is the largest sample or next to it, and says nothing of the tail (issue 31).
MIN_PERCENTILE_SAMPLES = 20


class TooFewSamples(ValueError):
    """A percentile asked of fewer than MIN_PERCENTILE_SAMPLES values."""


def quantile(ordered: list[float] | array[float], q: float) -> float:
    """The q-quantile of sorted values (nearest rank); 0 for none. For order statistics of a
    handful of values (the median of a few seeds' results); a percentile that is reported
    as a latency is :func:`percentile`'s."""
    if not ordered:
        return 0.0
    return float(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))])


def percentile(ordered: list[float] | array[float], q: float) -> float:
    """The q-quantile of sorted values (nearest rank), refusing (TooFewSamples) fewer than
    MIN_PERCENTILE_SAMPLES of them."""
    if len(ordered) < MIN_PERCENTILE_SAMPLES:
        raise TooFewSamples(
            f"a p{100 * q:g} of {len(ordered)} samples: at least {MIN_PERCENTILE_SAMPLES} are "
            "needed for a percentile to say anything of the tail"
        )
    return quantile(ordered, q)


def played(trace: Trace, warmup_s: float) -> tuple[list[float], list[float], float, int]:
    """The arrivals as played: the trace's first ``warmup_s`` seconds (the unscored warm-up),
    then the whole trace shifted by it; with their audio, the warm-up's length and how many
    arrivals it holds."""
    warm = min(warmup_s, trace.duration_s)
    head = sum(1 for t in trace.arrivals if t < warm)
    arrivals = list(trace.arrivals[:head]) + [t + warm for t in trace.arrivals]
    audio = list(trace.audio[:head]) + list(trace.audio)
    return arrivals, audio, warm, head


def simulate(trace: Trace, controller: Controller, config: SimConfig) -> Outcome:
    static = controller.policy == "static"
    initial = int(controller.params["replicas"]) if static else config.initial_replicas
    # The router's random draws follow the trace (its arrivals are the seed's draws).
    seed = hash((len(trace.arrivals), trace.arrivals[0] if trace.arrivals else 0.0))
    plant = Plant(
        config.service,
        config.cold_start_s,
        initial,
        config.give_up_s,
        config.routing,
        config.router_model(),
        seed,
    )
    routed = config.routing == ROUTER
    arrivals, audio, warm, head = played(trace, config.warmup_s)
    prom = Prometheus(config.prometheus, [(a + warm, b + warm) for a, b in trace.outages])
    scrape_every = config.prometheus.scrape_interval_s
    n = len(arrivals)
    scored_from = head
    latencies = array("d")
    slo = config.slo_s
    minute_lat: list[float] = []
    timeline: list[Minute] = []
    events = reversals = missing_downs = refused_in_warmup = 0
    last_direction = 0
    peak = initial
    i = 0
    seconds = math.ceil(trace.duration_s + warm)
    first_scored = math.floor(warm)
    hold_until = first_scored // 2
    next_scrape = 0.0
    next_eval = PHASE_S
    for second in range(seconds):
        now = float(second)
        plant.tick(now)
        if now >= next_scrape:
            prom.scrape(now, plant.pods)
            if routed:
                prom.scrape_router(
                    now, plant.router_queue(now), plant.router_sessions(now), plant.router_streams
                )
            next_scrape += scrape_every
        if controller.samples_pods:
            controller.observe(now, float(plant.in_system(now)))
        if now >= next_eval and not static:
            next_eval += controller.interval_s
            verdict = controller.evaluate(now, plant, prom)
            current = len(plant.live())
            if second < hold_until:
                pass  # watching a steady fleet
            elif verdict.replicas != current and second < first_scored:
                plant.scale_to(verdict.replicas, now)
                plant.tick(now)
            elif verdict.replicas != current:
                direction = 1 if verdict.replicas > current else -1
                events += 1
                if last_direction and direction != last_direction:
                    reversals += 1
                last_direction = direction
                if direction < 0 and verdict.missing:
                    missing_downs += 1
                plant.scale_to(verdict.replicas, now)
                plant.tick(now)
                peak = max(peak, verdict.replicas)
        end = now + 1.0
        while i < n and arrivals[i] < end:
            latency = plant.dispatch(arrivals[i], audio[i])
            if i >= scored_from:
                latencies.append(latency)
                minute_lat.append(latency)
            i += 1
        if second == first_scored - 1:
            refused_in_warmup = plant.refused
            plant.start_accounting(end)
            peak = len(plant.live())
        minute_done = (second - first_scored) % 60 == 59 or second == seconds - 1
        if second >= first_scored and minute_done:
            minute_lat.sort()
            current, ready, _ = plant.counts(end)
            start = 60.0 * ((second - first_scored) // 60)
            # A minute of fewer arrivals has no p95 (NaN: a gap in the plot's line).
            enough = len(minute_lat) >= MIN_PERCENTILE_SAMPLES
            p95 = percentile(minute_lat, 0.95) if enough else math.nan
            timeline.append(Minute(start, len(minute_lat), p95, current, ready))
            minute_lat = []
    while i < n:  # arrivals at the very end
        latencies.append(plant.dispatch(arrivals[i], audio[i]))
        i += 1
    refused_scored = plant.refused - refused_in_warmup
    ordered = sorted(latencies)
    met = sum(1 for x in latencies if x <= slo)
    violations = _violation_minutes(trace, latencies, slo)
    scored = len(latencies)
    return Outcome(
        requests=scored,
        slo_attainment=met / scored if scored else 1.0,
        gpu_hours=plant.gpu_seconds(trace.duration_s + warm) / 3600.0,
        scale_events=events,
        reversals=reversals,
        missing_data_scale_downs=missing_downs,
        p50_first_audio_s=percentile(ordered, 0.50),
        p95_first_audio_s=percentile(ordered, 0.95),
        p99_first_audio_s=percentile(ordered, 0.99),
        minutes_in_violation=violations,
        max_replicas=peak,
        timeline=tuple(timeline),
        refused=refused_scored,
    )


def _violation_minutes(trace: Trace, latencies: array[float], slo: float) -> int:
    total: dict[int, int] = {}
    missed: dict[int, int] = {}
    for t, x in zip(trace.arrivals, latencies, strict=True):
        m = int(t // 60)
        total[m] = total.get(m, 0) + 1
        if x > slo:
            missed[m] = missed.get(m, 0) + 1
    return sum(1 for m, k in missed.items() if k > 0.01 * total[m])
