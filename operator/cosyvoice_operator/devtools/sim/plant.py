"""The simulated plant: Triton pods with their slots, and the Prometheus that scrapes them.

A pod is ``slots`` concurrent streams (CosyVoice2's orchestrator instances of one GPU: a
stream holds one for its whole synthesis) in front of one FIFO queue (Triton's). A request
of ``a`` seconds of audio holds its slot ``overhead_s + rtf * a`` seconds; its first audio
comes ``first_chunk_s + first_chunk_per_stream_s * (k - 1)`` seconds after it starts, ``k``
being the streams busy on the pod at that moment, itself included (the first chunk slows
down as streams share the GPU). By default requests go round-robin over the Ready pods that
are not draining (a Service's endpoints); `ROUTINGS` lists the others (the operator's router:
one FIFO over the fleet's slots per router replica; Envoy's P2C). First-come first-served
with ``c`` slots is computed exactly by keeping each pod's slot release times in a heap: a
request starts at ``max(arrival, earliest release)``; behind the router, a replica's queue is
the same heap over its slots of every Ready pod. A request is placed when it arrives, so a
pod that becomes Ready takes the streams arriving after it, not those already queued (their
wait is bounded by the queue timeout).

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
import random
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
    # Behind the router: each router replica's slots on this pod (its maxconn), as release
    # times (one heap per replica); empty under the other routings.
    router_free: list[list[float]] = field(default_factory=list)

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


@dataclass
class RouterSeries:
    """The router's scraped samples (summed over its replicas)."""

    times: list[float] = field(default_factory=list)
    queue: list[int] = field(default_factory=list)  # haproxy_backend_current_queue
    sessions: list[int] = field(default_factory=list)  # haproxy_server_current_sessions
    streams: list[int] = field(default_factory=list)  # streams that reached the backend


@dataclass(frozen=True)
class RouterView:
    """What queries over the router's exporter give (summed over its replicas)."""

    queue: float  # streams queued now
    sessions: float  # streams on the pods now
    mean_queue: float  # avg_over_time of the queue over the rate window
    mean_sessions: float  # and of the sessions
    stream_rate: float  # streams arriving per second over the window


class Prometheus:
    def __init__(self, model: PrometheusModel, outages: Sequence[tuple[float, float]]) -> None:
        self.model = model
        self.outages = tuple(outages)
        self.series: dict[int, Series] = {}
        self.router = RouterSeries()  # the router's exporter (routing ROUTER)

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

    def scrape_router(self, now: float, queue: int, sessions: int, streams: int) -> None:
        """The router's exporter: its queue and sessions gauges and its stream counter
        (summed over the replicas)."""
        if self.in_outage(now):
            return
        r = self.router
        r.times.append(now)
        r.queue.append(queue)
        r.sessions.append(sessions)
        r.streams.append(streams)

    def router_view(self, now: float) -> RouterView | None:
        """The router's figures as a query at ``now`` sees them: the gauges' last samples
        and their ``avg_over_time`` over the rate window, the streams' rate; None when the
        result is empty (as `view`)."""
        if self.in_outage(now):
            return None
        r = self.router
        seen = now - self.model.lag_s
        hi = bisect.bisect_right(r.times, seen) - 1
        if hi < 0 or seen - r.times[hi] > 2 * self.model.scrape_interval_s:
            return None
        lo = bisect.bisect_left(r.times, seen - self.model.rate_window_s)
        if hi - lo < 1:
            return None
        n = hi - lo + 1
        return RouterView(
            queue=float(r.queue[hi]),
            sessions=float(r.sessions[hi]),
            mean_queue=sum(r.queue[lo : hi + 1]) / n,
            mean_sessions=sum(r.sessions[lo : hi + 1]) / n,
            stream_rate=(r.streams[hi] - r.streams[lo]) / (r.times[hi] - r.times[lo]),
        )

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


# How requests are spread over the Ready pods.
# - ROUND_ROBIN: what a Kubernetes Service in front of Triton gives (kube-proxy spreads
#   connections, not load); each pod queues what it gets in Triton's FIFO. The default, and
#   every result recorded before issue 30.
# - LEAST_LOADED: a what-if (issue 22): each request goes to the pod whose first slot frees
#   soonest, the fewest busy streams breaking ties, then waits in that pod's queue.
# - ROUTER: the router the operator deploys (issue 30, HAProxy `balance leastconn` with
#   per-server `maxconn` and one backend queue): R router replicas (`RouterModel`), each
#   owning ``max(1, slots // R)`` slots of every Ready pod (its maxconn) and one FIFO queue
#   over them: a stream waits in its replica's queue and takes the first freed slot of any
#   Ready pod, in arrival order (a free slot now: the pod with the fewest active streams);
#   one that waited ``queue_timeout_s`` is refused (HAProxy's `timeout queue`: a 503). Streams
#   reach the replicas at random (kube-proxy's iptables mode picks a backend per connection
#   at random; clients with a connection each) or round-robin (IPVS' rr).
# - P2C: Envoy's LeastRequest (the Gateway API option): two Ready pods drawn at random, the
#   one with fewer active requests (streaming or queued there) gets the stream, which then
#   waits in that pod's own queue (no fleet queue, no timeout but the client's).
ROUND_ROBIN = "round-robin"
LEAST_LOADED = "least-loaded"
ROUTER = "router"
P2C = "p2c"
ROUTINGS = (ROUND_ROBIN, LEAST_LOADED, ROUTER, P2C)
SPREAD_RANDOM = "random"
SPREAD_ROUND_ROBIN = "round-robin"
SPREADS = (SPREAD_RANDOM, SPREAD_ROUND_ROBIN)


@dataclass(frozen=True)
class RouterModel:
    """The router in front of the pods (routing ROUTER): its replicas, how streams reach
    them, and its queue timeout (0: none here; `engine.SimConfig.router_model` resolves 0 as
    the operator does, to the SLO's wait budget)."""

    replicas: int = 1
    spread: str = SPREAD_RANDOM
    queue_timeout_s: float = 0.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"router replicas {self.replicas}: at least 1")
        if self.spread not in SPREADS:
            raise ValueError(f"spread {self.spread!r}: one of {', '.join(SPREADS)}")
        if self.queue_timeout_s < 0:
            raise ValueError(f"queue timeout {self.queue_timeout_s}: at least 0")

    def slots_per_pod(self, slots: int) -> int:
        """Each replica's maxconn on one pod: floor(slots / R), at least 1."""
        return max(1, slots // self.replicas)


def _load_seen(pod: Pod, now: float) -> tuple[float, int]:
    """(how long a request sent now would wait for a slot, the streams busy now)."""
    return (max(0.0, pod.free[0] - now), sum(1 for f in pod.free if f > now))


def _active(pod: Pod, now: float) -> int:
    """Requests the pod holds now: streaming, or queued in Triton (Envoy's active count)."""
    return sum(1 for f in pod.free if f > now) + sum(1 for w in pod.waiting if w > now)


class Plant:
    """The pods of one service and their traffic."""

    def __init__(
        self,
        model: ServiceModel,
        cold_start_s: float,
        initial_ready: int,
        give_up_s: float = 30.0,
        routing: str = ROUND_ROBIN,
        router: RouterModel | None = None,
        seed: int = 0,
    ) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing {routing!r}: one of {', '.join(ROUTINGS)}")
        self.routing = routing
        self.router = router or RouterModel()
        # The router's random draws (replica picked, P2C's two pods): deterministic per seed.
        self.rng = random.Random(seed)
        self.replica_rr = 0
        self.refused = 0  # streams refused by the router's queue timeout
        self.router_streams = 0  # streams that reached the router (its request counter)
        self.router_waiting: list[float] = []  # when each queued stream leaves the queue
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
        pod = Pod(self.serial, now, ready_at, self.model.slots)
        if self.routing == ROUTER:
            per_replica = self.router.slots_per_pod(self.model.slots)
            pod.router_free = [[ready_at] * per_replica for _ in range(self.router.replicas)]
        self.pods.append(pod)
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
        """Send one request; its first-audio latency (``give_up_s`` for one given up on or
        refused by the router)."""
        if self.routing == ROUTER:
            return self._through_router(arrival, audio_s)
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
        elif self.routing == P2C and len(pods) > 1:
            a, b = self.rng.sample(pods, 2)
            pod = b if _active(b, arrival) < _active(a, arrival) else a
        elif self.routing == P2C:
            pod = pods[0]
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

    # -- the router (routing ROUTER) --

    def _candidates(self, arrival: float) -> list[Pod]:
        """The pods the router sends to: the Ready ones; with none, the one Ready first."""
        if self.routable:
            return self.routable
        live = [p for p in self.pods if not p.draining and p.deleted is None]
        if not live:
            self._create(arrival, arrival + self.cold_start_s)
            live = [self.pods[-1]]
        return [min(live, key=lambda p: p.ready_at)]

    def _replica(self) -> int:
        r = self.router.replicas
        if r == 1:
            return 0
        if self.router.spread == SPREAD_RANDOM:
            return self.rng.randrange(r)
        self.replica_rr += 1
        return (self.replica_rr - 1) % r

    def queue_timeout_s(self) -> float:
        """The router's `timeout queue` in force (the client's give-up if that is sooner)."""
        timeout = self.router.queue_timeout_s or float("inf")
        return min(timeout, self.give_up_s)

    def _through_router(self, arrival: float, audio_s: float) -> float:
        self.router_streams += 1
        replica = self._replica()
        best: Pod | None = None
        best_key = (float("inf"), 0)
        for pod in self._candidates(arrival):
            release = pod.router_free[replica][0]
            key = (release if release > arrival else arrival, 0)
            if key[0] > best_key[0]:
                continue
            if key[0] <= arrival:  # free slots on several pods: leastconn
                key = (arrival, sum(1 for f in pod.free if f > arrival))
            if key < best_key:
                best, best_key = pod, key
        assert best is not None
        pod = best
        start = best_key[0]
        if start - arrival > self.queue_timeout_s():
            self.refused += 1
            heapq.heappush(self.router_waiting, arrival + self.queue_timeout_s())
            if self.first_audio_log is not None:
                self.first_audio_log.append((arrival, self.give_up_s))
            return self.give_up_s
        if start > arrival:
            heapq.heappush(self.router_waiting, start)
        m = self.model
        free = pod.free
        # Triton's own queue: empty while R x maxconn <= slots (a pod's slots not overcommitted).
        triton_start = start if start >= free[0] else free[0]
        busy = 1
        for f in free:
            if f > triton_start:
                busy += 1
        service = m.overhead_s + m.rtf * audio_s
        end = triton_start + service
        heapq.heapreplace(free, end)
        heapq.heapreplace(pod.router_free[replica], end)
        first = m.first_chunk_s + m.first_chunk_per_stream_s * (busy - 1)
        if first > service:
            first = service
        latency = triton_start - arrival + first
        if self.first_audio_log is not None:
            self.first_audio_log.append((arrival, latency))
        heapq.heappush(pod.ends, (end, triton_start - start, end - start))
        if triton_start > start:
            heapq.heappush(pod.waiting, triton_start)
        if end > pod.last_end:
            pod.last_end = end
        return latency

    def router_queue(self, now: float) -> int:
        """Streams waiting in the router's queues now (haproxy_backend_current_queue, summed
        over the router replicas)."""
        waiting = self.router_waiting
        while waiting and waiting[0] <= now:
            heapq.heappop(waiting)
        return len(waiting)

    def router_sessions(self, now: float) -> int:
        """Streams the router holds on the pods now (haproxy_server_current_sessions, summed
        over pods and replicas): slots taken on Ready pods, draining ones included."""
        total = 0
        for pod in self.pods:
            if pod.deleted is None and pod.ready_at <= now:
                for heap in pod.router_free:
                    total += sum(1 for f in heap if f > now)
        return total
