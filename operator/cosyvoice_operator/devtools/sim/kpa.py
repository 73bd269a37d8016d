"""A Knative Pod Autoscaler (KPA) style decider, as Knative's documentation describes it.

Pure. Knative samples the concurrency of every pod (requests inside its queue-proxy,
waiting or served) each second and decides every 2 s (the tick):

- the stable concurrency is the mean over the stable window (60 s), the panic concurrency
  the mean over the panic window (6 s, 10 % of the stable one);
- desired pods = ``ceil(concurrency / target per pod)`` for each, both kept within
  ``[ready / max-scale-down-rate, ready * max-scale-up-rate]`` (2 and 1000);
- panic starts when the panic desire is at least the panic threshold (200 %) times the
  Ready pods, and ends once a whole stable window has passed without that; in panic the
  count follows the panic desire but never goes down;
- a scale-down delay (0 by default) keeps the highest desire of the last that many
  seconds;
- the result stays within ``[minScale, maxScale]``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

TICK_S = 2.0


@dataclass(frozen=True)
class KpaConfig:
    target: float  # concurrency per pod (container-concurrency-target x utilization)
    min_scale: int = 1
    max_scale: int = 1000
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_down_delay_s: float = 0.0


@dataclass
class Kpa:
    config: KpaConfig

    def __post_init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque()  # (time, total concurrency)
        self.panic_since: float | None = None  # last time the panic condition held
        self.max_panic_pods = 0
        self.delayed: deque[tuple[float, int]] = deque()

    @property
    def panicking(self) -> bool:
        return self.panic_since is not None

    def observe(self, now: float, concurrency: float) -> None:
        self.samples.append((now, concurrency))
        while self.samples and self.samples[0][0] <= now - self.config.stable_window_s:
            self.samples.popleft()

    def _mean(self, now: float, window: float) -> float | None:
        values = [c for t, c in self.samples if t > now - window]
        return sum(values) / len(values) if values else None

    def decide(self, now: float, ready: int) -> int | None:
        """The desired count; None with no sample yet (no decision)."""
        cfg = self.config
        stable = self._mean(now, cfg.stable_window_s)
        panic = self._mean(now, cfg.panic_window_s)
        if stable is None or panic is None:
            return None
        pods = max(1, ready)
        most = math.ceil(cfg.max_scale_up_rate * pods)
        least = math.floor(pods / cfg.max_scale_down_rate)
        stable_pods = min(max(math.ceil(stable / cfg.target), least), most)
        panic_pods = min(max(math.ceil(panic / cfg.target), least), most)
        over = panic_pods / pods >= cfg.panic_threshold
        if over:
            self.panic_since = now
        elif self.panic_since is not None and now - self.panic_since >= cfg.stable_window_s:
            self.panic_since = None
            self.max_panic_pods = 0
        if self.panic_since is not None:
            desired = max(panic_pods, self.max_panic_pods)
            self.max_panic_pods = desired
        else:
            desired = stable_pods
        if cfg.scale_down_delay_s > 0:
            self.delayed.append((now, desired))
            while self.delayed and self.delayed[0][0] <= now - cfg.scale_down_delay_s:
                self.delayed.popleft()
            desired = max(d for _, d in self.delayed)
        return min(max(desired, cfg.min_scale), cfg.max_scale)
