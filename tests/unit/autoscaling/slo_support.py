"""What the SLO-sizing tests share (test_slo, test_seasonal): the spec with SLO sizing on,
a usable sample of a given load, and a sample without data."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from cosyvoice_operator.api.spec import AutoscalingSpec, ScaleRule, SloSpec
from cosyvoice_operator.autoscaling.policy import Observation


def slo_spec(slo: Mapping[str, float], up_step: int = 100) -> AutoscalingSpec:
    """SLO sizing for first audio within 1.5 s, Poisson variability and no forecast headroom
    unless ``slo`` (SloSpec's fields) says otherwise; a 300 s scale-down window of any step."""
    values: dict[str, float] = {
        "first_audio_milliseconds": 1500,
        "variability": 1.0,
        "forecast_std_devs": 0.0,
    }
    values.update(slo)
    return AutoscalingSpec(
        enabled=True,
        min_replicas=1,
        max_replicas=1000,
        target_queue_latency_milliseconds=393.0,
        scale_up=ScaleRule(0, up_step),
        scale_down=ScaleRule(300, 1000),
        slo=SloSpec(**values),  # type: ignore[arg-type]
    )


def sample(
    t: dt.datetime, in_flight: float, completions: float, latency: float = 0.0
) -> Observation:
    """A usable sample: ``in_flight`` requests in the system, ``completions`` per second,
    nobody waiting, ``latency`` ms of queue time."""
    return Observation(t, True, "", "", latency, 0.0, in_flight, completions, False)


def no_data(t: dt.datetime, message: str = "connection refused") -> Observation:
    """A sample without data (Prometheus unreachable)."""
    return Observation(t, False, "Unreachable", message, None, None, None, None, False)
