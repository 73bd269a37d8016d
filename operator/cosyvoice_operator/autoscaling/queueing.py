"""The queueing model of the autoscaler (pure): each pod an M/M/c queue, its mean queue time
by Erlang C, and the searches the policy makes with it (the slots that explain an observed
wait, the fewest replicas that keep a load under a wait). `policy`'s docstring says why."""

from __future__ import annotations

import math
from collections.abc import Callable

# Bounds on the model's work for absurd inputs (slots per pod, replicas searched).
MAX_SLOTS = 10_000
MAX_SEARCH = 1_000_000
# The smallest queue time a slot fit aims at: Triton reports microseconds.
_MIN_WAIT_SECONDS = 1e-6


def queue_seconds(load: float, slots: int, service_seconds: float) -> float:
    """Mean time in queue of an M/M/c queue (Erlang C): `load` Erlangs (requests in service on
    average) offered to `slots` servers whose mean service time is `service_seconds`.
    Infinite at or beyond saturation."""
    if load <= 0:
        return 0.0
    if load >= slots:
        return math.inf
    blocking = 1.0  # Erlang B, by the stable recursion B(k) = aB(k-1) / (k + aB(k-1))
    for k in range(1, slots + 1):
        blocking = load * blocking / (k + load * blocking)
    wait_probability = slots * blocking / (slots - load * (1.0 - blocking))
    return wait_probability * service_seconds / (slots - load)


def fitted_slots(load: float, service_seconds: float, queue_wait_seconds: float) -> int:
    """The most slots per pod that still explain the observed queue time by queueing alone
    (Erlang C at `load` gives at least the observed wait), and at least one more than the
    load. A wait the model does not know (Triton's batching delay) only lowers the estimate,
    so it errs toward fewer slots, that is more replicas."""
    wait = max(queue_wait_seconds, _MIN_WAIT_SECONDS)
    low = max(1, math.floor(load) + 1)
    slots = _smallest(low, lambda c: queue_seconds(load, c, service_seconds) <= wait, MAX_SLOTS)
    if slots > low and queue_seconds(load, slots, service_seconds) < wait:
        slots -= 1
    return slots


def replicas_for(load: float, slots: int, service_seconds: float, wait_limit_seconds: float) -> int:
    """The fewest pods of `slots` slots that keep the predicted queue time of a total `load`
    (Erlangs, spread evenly) at most `wait_limit_seconds`; 0 for no load."""
    if load <= 0:
        return 0
    low = math.floor(load / slots) + 1
    return _smallest(
        low,
        lambda n: queue_seconds(load / n, slots, service_seconds) <= wait_limit_seconds,
        MAX_SEARCH,
    )


def _smallest(low: int, ok: Callable[[int], bool], cap: int) -> int:
    """The smallest n in [low, cap] for which the monotone `ok` holds (cap if none does)."""
    if low >= cap:
        return cap
    if ok(low):
        return low
    bad, step = low, 1
    while True:
        probe = min(bad + step, cap)
        if ok(probe):
            good = probe
            break
        if probe == cap:
            return cap
        bad, step = probe, step * 2
    while good - bad > 1:
        mid = (bad + good) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def wait_probability(load: float, slots: int) -> float:
    """Erlang C: the probability that an arrival waits for a slot (1 at or beyond
    saturation)."""
    if load <= 0:
        return 0.0
    if load >= slots:
        return 1.0
    blocking = 1.0
    for k in range(1, slots + 1):
        blocking = load * blocking / (k + load * blocking)
    return slots * blocking / (slots - load * (1.0 - blocking))


def miss_probability(
    load: float,
    slots: int,
    service_seconds: float,
    budget_seconds: float,
    variability: float = 1.0,
) -> float:
    """The share of requests that wait longer than `budget_seconds` for a slot. M/M/c
    (``variability`` 1): ``C(c, a) * exp(-(c - a) * budget / s)``, the wait of a request
    that waits being exponential with rate ``(c - a) / s``. For other arrival and service
    processes, ``variability`` k = (ca² + cs²) / 2 (the squared coefficients of variation
    of the interarrival and service times, Allen-Cunneen's G/G/c factor) scales the mean
    wait: here, the chance of waiting (capped at 1) and the mean wait of those who do."""
    if load <= 0:
        return 0.0
    if load >= slots:
        return 1.0
    k = max(variability, 1e-6)
    return min(1.0, k * wait_probability(load, slots)) * math.exp(
        -(slots - load) * max(budget_seconds, 0.0) / (service_seconds * k)
    )


def replicas_for_miss(
    load: float,
    slots: int,
    service_seconds: float,
    budget_seconds: float,
    miss: float,
    variability: float = 1.0,
) -> int:
    """The fewest pods of `slots` slots over which a total `load` (Erlangs, spread evenly)
    leaves at most a share `miss` of requests waiting longer than `budget_seconds`; 0 for no
    load."""
    if load <= 0:
        return 0
    low = math.floor(load / slots) + 1
    return _smallest(
        low,
        lambda n: (
            miss_probability(load / n, slots, service_seconds, budget_seconds, variability) <= miss
        ),
        MAX_SEARCH,
    )


# ---- one pooled queue (behind the router) ---------------------------------------------------
# Behind the router every stream waits in one FIFO queue and takes the first slot freed on any
# pod: the fleet is one M/M/(n x c) queue, not n separate M/M/c ones. Pooling is what lets a
# routed fleet run hotter at the same wait (at 48 slots a load of 40 Erlangs waits less than
# 3 pods of 16 each loaded with 13.3).


def pooled_replicas_for(
    load: float, slots: int, service_seconds: float, wait_limit_seconds: float
) -> int:
    """The fewest pods of `slots` slots, pooled behind one queue, that keep the predicted
    mean queue time of a total `load` (Erlangs) at most `wait_limit_seconds`; 0 for no load."""
    if load <= 0:
        return 0
    low = math.floor(load / slots) + 1
    return _smallest(
        low,
        lambda n: queue_seconds(load, n * slots, service_seconds) <= wait_limit_seconds,
        _pooled_cap(load, slots),
    )


def pooled_replicas_for_miss(
    load: float,
    slots: int,
    service_seconds: float,
    budget_seconds: float,
    miss: float,
    variability: float = 1.0,
) -> int:
    """The fewest pods of `slots` slots, pooled behind one queue, over which a total `load`
    (Erlangs) leaves at most a share `miss` of requests waiting longer than `budget_seconds`
    (`miss_probability` with ``n x slots`` servers); 0 for no load."""
    if load <= 0:
        return 0
    low = math.floor(load / slots) + 1
    return _smallest(
        low,
        lambda n: (
            miss_probability(load, n * slots, service_seconds, budget_seconds, variability) <= miss
        ),
        _pooled_cap(load, slots),
    )


def _pooled_cap(load: float, slots: int) -> int:
    """A bound on the pooled search: the Erlang B recursion costs n x slots steps a probe, so
    the search stops where the slots are ten times the load plus a hundred (far past any
    wait or miss target a spec can set)."""
    return max(1, min(MAX_SEARCH, math.ceil((10 * load + 100) / slots)))
