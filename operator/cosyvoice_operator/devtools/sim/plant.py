"""The simulated plant: Triton pods with their slots, and the Prometheus that scrapes them.

A pod is ``slots`` concurrent streams (CosyVoice2's orchestrator instances of one GPU: a
stream holds one for its whole synthesis) in front of one FIFO queue (Triton's). A request
of ``a`` seconds of audio holds its slot ``overhead_s + rtf * a`` seconds; its first audio
comes ``first_chunk_s + first_chunk_per_stream_s * (k - 1)`` seconds after it starts, ``k``
being the streams busy on the pod at that moment, itself included (the first chunk slows
down as streams share the GPU). Requests go round-robin over the Ready pods that are not
draining (a Service's endpoints). First-come first-served with ``c`` slots is computed
exactly by keeping each pod's slot release times in a heap: a request starts at
``max(arrival, earliest release)``.

A client gives up on a request that has waited ``give_up_s`` in the queue without starting
(it then never holds a slot; Triton counts no success for it). Without that, a backlog
trapped on a few pods would be served for hours, which no caller waits for.

A pod is created, Ready ``cold_start_s`` later (image pull, engine load), and on removal
stops receiving requests and drains: it is deleted once its last request has finished.
GPU time counts from creation to deletion. Kubernetes' ReplicaSet removes pods that are not
Ready first, then the youngest Ready ones; so does `Plant.scale_to`.

Prometheus (`Prometheus`) scrapes every Ready pod every ``scrape_interval_s``: Triton's
counters (completions, queue time, request time; updated when a request completes, so a
stream's queue time shows a whole stream later) and the pending gauge (requests waiting
now). Queries see the samples up to ``now - lag_s`` and compute rates as Prometheus does
over ``[t - window, t]`` from the first and last sample in it (at least two are needed;
without extrapolation to the window's edges, which cancels in every ratio used here). An
outage is an interval in which scrapes are lost and every query answers an empty result.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from cosyvoice_operator.api.pod_profiles import UPSTREAM_L20, PodProfile


@dataclass(frozen=True)
class ServiceModel:
    """One replica (pod) of CosyVoice2 on one GPU; defaults from upstream's L20 streaming
    benchmark (first chunk 220 ms at 1 stream, 1107 ms at 4; RTF 0.0922 at 4 streams, i.e.
    0.37 s of one stream's synthesis per second of audio). `for_pod` takes another pod
    profile (``cosyvoice_operator.api.pod_profiles``: the GPU sweep's measured pods)."""

    slots: int = UPSTREAM_L20.slots
    rtf: float = UPSTREAM_L20.rtf
    overhead_s: float = UPSTREAM_L20.overhead_s
    first_chunk_s: float = UPSTREAM_L20.first_chunk_s
    first_chunk_per_stream_s: float = UPSTREAM_L20.first_chunk_per_stream_s
    # The figures our SLO sizing is given (as the operator takes them from the profile):
    first_chunk_busy_ms: int = UPSTREAM_L20.first_chunk_busy_ms
    pod: str = UPSTREAM_L20.gpu
    source: str = UPSTREAM_L20.source

    def service_seconds(self, audio_s: float) -> float:
        return self.overhead_s + self.rtf * audio_s

    @staticmethod
    def for_pod(profile: PodProfile) -> ServiceModel:
        return ServiceModel(
            slots=profile.slots,
            rtf=profile.rtf,
            overhead_s=profile.overhead_s,
            first_chunk_s=profile.first_chunk_s,
            first_chunk_per_stream_s=profile.first_chunk_per_stream_s,
            first_chunk_busy_ms=profile.first_chunk_busy_ms,
            pod=profile.gpu,
            source=profile.source,
        )

    def describe(self) -> str:
        """One line for the reports: which pod, its figures, and where they come from."""
        return (
            f"pod: {self.pod}, {self.slots} slots, first chunk {1000 * self.first_chunk_s:.0f} ms "
            f"+ {1000 * self.first_chunk_per_stream_s:.0f} ms per other stream "
            f"({self.first_chunk_busy_ms} ms with every slot busy), RTF {self.rtf:g} per "
            f"stream; from {self.source}"
        )

    def slo_sizing(self, slo_s: float) -> dict[str, int]:
        """Our SLO sizing's pod figures for an SLO of first audio within ``slo_s``: what the
        operator resolves from the pod profile (`api.spec._slo`), with its error when the
        pod's busy first chunk leaves no wait."""
        slo_ms = round(1000 * slo_s)
        if self.first_chunk_busy_ms >= slo_ms:
            raise ValueError(
                f"the {self.pod} pod's first chunk with all {self.slots} slots busy is "
                f"{self.first_chunk_busy_ms} ms, not below the SLO's {slo_ms} ms: no wait "
                "would leave the SLO reachable (raise --slo)"
            )
        return {
            "slo_ms": slo_ms,
            "first_chunk_ms": self.first_chunk_busy_ms,
            "target_ms": slo_ms - self.first_chunk_busy_ms,
            "slots": self.slots,
        }


@dataclass(frozen=True)
class PrometheusModel:
    scrape_interval_s: float = 15.0
    rate_window_s: float = 60.0
    lag_s: float = 0.0  # extra delay before a scrape is visible to queries (remote write, etc.)


@dataclass
class Pod:
    name: int
    created: float
    ready_at: float
    slots: int
    draining: bool = False
    deleted: float | None = None
    free: list[float] = field(default_factory=list)  # slot release times (heap)
    ends: list[tuple[float, float, float]] = field(default_factory=list)  # (end, queue, total)
    waiting: list[float] = field(default_factory=list)  # start times of queued requests
    success: int = 0
    queue_us: float = 0.0
    request_us: float = 0.0
    last_end: float = 0.0

    def __post_init__(self) -> None:
        self.free = [self.ready_at] * self.slots

    def ready(self, now: float) -> bool:
        return now >= self.ready_at and self.deleted is None


@dataclass
class Series:
    """One pod's scraped samples: time, counters, gauge."""

    times: list[float] = field(default_factory=list)
    success: list[int] = field(default_factory=list)
    queue_us: list[float] = field(default_factory=list)
    request_us: list[float] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class PodView:
    """What a query over one pod gives: rates over the window, and the gauge."""

    completion_rate: float  # per second
    queue_us_rate: float  # microseconds of queue time per second
    request_us_rate: float  # microseconds of request time per second
    pending: float

    @property
    def queue_ms(self) -> float:
        """Per completed request; the divisor clamped to 1e-6 as the operator does."""
        return 1e-3 * self.queue_us_rate / max(self.completion_rate, 1e-6)

    @property
    def in_system(self) -> float:
        """Requests in the pod on average (Little's law on the request-time counter)."""
        return self.request_us_rate / 1e6


class Prometheus:
    def __init__(self, model: PrometheusModel, outages: Sequence[tuple[float, float]]) -> None:
        self.model = model
        self.outages = tuple(outages)
        self.series: dict[int, Series] = {}

    def in_outage(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.outages)

    def scrape(self, now: float, pods: Sequence[Pod]) -> None:
        if self.in_outage(now):
            return
        for pod in pods:
            if not pod.ready(now):
                continue
            ends = pod.ends
            while ends and ends[0][0] <= now:
                _, queue, total = heapq.heappop(ends)
                pod.success += 1
                pod.queue_us += queue * 1e6
                pod.request_us += total * 1e6
            waiting = pod.waiting
            while waiting and waiting[0] <= now:
                heapq.heappop(waiting)
            s = self.series.setdefault(pod.name, Series())
            s.times.append(now)
            s.success.append(pod.success)
            s.queue_us.append(pod.queue_us)
            s.request_us.append(pod.request_us)
            s.pending.append(len(waiting))

    def view(self, now: float, pod: int) -> PodView | None:
        """The pod's rates and gauge as a query at ``now`` sees them; None when the result
        is empty (no series, fewer than two samples in the window, the last sample more than
        two scrapes old, or an outage)."""
        if self.in_outage(now):
            return None
        s = self.series.get(pod)
        if s is None:
            return None
        seen = now - self.model.lag_s
        hi = bisect.bisect_right(s.times, seen) - 1
        if hi < 0 or seen - s.times[hi] > 2 * self.model.scrape_interval_s:
            return None
        lo = bisect.bisect_left(s.times, seen - self.model.rate_window_s)
        if hi - lo < 1:
            return None
        span = s.times[hi] - s.times[lo]
        return PodView(
            completion_rate=(s.success[hi] - s.success[lo]) / span,
            queue_us_rate=(s.queue_us[hi] - s.queue_us[lo]) / span,
            request_us_rate=(s.request_us[hi] - s.request_us[lo]) / span,
            pending=float(s.pending[hi]),
        )


# How requests are spread over the Ready pods. ROUND_ROBIN is what a Kubernetes Service in
# front of Triton gives (kube-proxy spreads connections, not load); LEAST_LOADED is a router
# that sends each request to the pod whose first slot frees soonest, the fewest busy streams
# breaking ties (Envoy's least-request balancing or an inference gateway's endpoint picker
# would come close). Not a product feature: a what-if for the benchmark (issue 22).
ROUND_ROBIN = "round-robin"
LEAST_LOADED = "least-loaded"
ROUTINGS = (ROUND_ROBIN, LEAST_LOADED)


def _load_seen(pod: Pod, now: float) -> tuple[float, int]:
    """(how long a request sent now would wait for a slot, the streams busy now)."""
    return (max(0.0, pod.free[0] - now), sum(1 for f in pod.free if f > now))


class Plant:
    """The pods of one service and their traffic."""

    def __init__(
        self,
        model: ServiceModel,
        cold_start_s: float,
        initial_ready: int,
        give_up_s: float = 30.0,
        routing: str = ROUND_ROBIN,
    ) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing {routing!r}: one of {', '.join(ROUTINGS)}")
        self.routing = routing
        self.model = model
        self.give_up_s = give_up_s
        self.cold_start_s = cold_start_s
        self.pods: list[Pod] = []
        self.serial = 0
        self.rr = 0
        self.routable: list[Pod] = []
        self.routable_dirty = True
        self.next_change = 0.0
        self.retired: list[Pod] = []
        self.accounting_from = 0.0
        # (arrival, first audio latency) of recent requests, kept only when a policy reads
        # them (the llm-d rule's latency histogram): None until one asks.
        self.first_audio_log: deque[tuple[float, float]] | None = None
        for _ in range(initial_ready):
            self._create(0.0, ready_at=0.0)

    def _create(self, now: float, ready_at: float) -> None:
        self.pods.append(Pod(self.serial, now, ready_at, self.model.slots))
        self.serial += 1
        self.routable_dirty = True

    # -- the fleet --

    def live(self) -> list[Pod]:
        """Pods not draining (the Deployment's replicas)."""
        return [p for p in self.pods if not p.draining and p.deleted is None]

    def counts(self, now: float) -> tuple[int, int, int]:
        """(replicas in force, Ready, starting)."""
        live = self.live()
        ready = sum(1 for p in live if p.ready_at <= now)
        return len(live), ready, len(live) - ready

    def scale_to(self, n: int, now: float) -> None:
        live = self.live()
        if n > len(live):
            for _ in range(n - len(live)):
                self._create(now, now + self.cold_start_s)
        elif n < len(live):
            # Not Ready first, then the youngest.
            order = sorted(live, key=lambda p: (p.ready_at <= now, -p.created, -p.name))
            for pod in order[: len(live) - n]:
                pod.draining = True
                if pod.ready_at > now:
                    pod.deleted = now
            self.routable_dirty = True

    def tick(self, now: float) -> None:
        """Pods that became Ready join the endpoints; drained pods are deleted."""
        if now < self.next_change and not self.routable_dirty:
            return
        upcoming = float("inf")
        for pod in self.pods:
            if pod.deleted is not None:
                continue
            if pod.draining:
                if pod.last_end <= now:
                    pod.deleted = now
                else:
                    upcoming = min(upcoming, pod.last_end)
            elif pod.ready_at > now:
                upcoming = min(upcoming, pod.ready_at)
        self.next_change = upcoming
        self.routable = [
            p for p in self.pods if p.ready_at <= now and not p.draining and p.deleted is None
        ]
        self.routable_dirty = False
        if sum(1 for p in self.pods if p.deleted is not None) > 32:
            self.retired.extend(p for p in self.pods if p.deleted is not None)
            self.pods = [p for p in self.pods if p.deleted is None]

    def start_accounting(self, now: float) -> None:
        """GPU time counts from ``now`` on (the end of the warm-up)."""
        self.accounting_from = now

    def gpu_seconds(self, end: float) -> float:
        """Pod time from creation (or the start of accounting) to deletion (or ``end``)."""
        total = 0.0
        for pod in [*self.retired, *self.pods]:
            stop = pod.deleted if pod.deleted is not None else end
            total += max(0.0, stop - max(pod.created, self.accounting_from))
        return total

    def dispatch(self, arrival: float, audio_s: float) -> float:
        """Send one request; its first-audio latency (``give_up_s`` for one given up on)."""
        pods = self.routable
        if not pods:
            # Nothing Ready: the request waits for the pod that will be Ready first.
            candidates = [p for p in self.pods if not p.draining and p.deleted is None]
            if not candidates:
                self._create(arrival, arrival + self.cold_start_s)
                candidates = [self.pods[-1]]
            pod = min(candidates, key=lambda p: p.ready_at)
        elif self.routing == LEAST_LOADED:
            pod = min(pods, key=lambda p: _load_seen(p, arrival))
        else:
            pod = pods[self.rr % len(pods)]
            self.rr += 1
        m = self.model
        free = pod.free
        earliest = free[0]
        start = arrival if arrival >= earliest else earliest
        if start - arrival > self.give_up_s:
            heapq.heappush(pod.waiting, arrival + self.give_up_s)  # waits, then leaves
            if self.first_audio_log is not None:
                self.first_audio_log.append((arrival, self.give_up_s))
            return self.give_up_s
        busy = 1
        for f in free:
            if f > start:
                busy += 1
        service = m.overhead_s + m.rtf * audio_s
        end = start + service
        heapq.heapreplace(free, end)
        first = m.first_chunk_s + m.first_chunk_per_stream_s * (busy - 1)
        if first > service:
            first = service
        queue = start - arrival
        if self.first_audio_log is not None:
            self.first_audio_log.append((arrival, queue + first))
        heapq.heappush(pod.ends, (end, queue, end - arrival))
        if start > arrival:
            heapq.heappush(pod.waiting, start)
        if end > pod.last_end:
            pod.last_end = end
        return queue + first

    def in_system(self, now: float) -> int:
        """Requests in the Ready pods now (queued or streaming): what Knative's queue-proxy
        counts."""
        total = 0
        for pod in self.routable:
            total += sum(1 for f in pod.free if f > now)
            total += sum(1 for w in pod.waiting if w > now)
        return total
