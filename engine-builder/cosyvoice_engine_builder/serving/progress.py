"""A wedged stub: work in flight and no inference completing (issue 19, item 7).

A stub that hangs stays alive, so :mod:`.stubs` cannot see it, and Triton's health endpoints
stay 200 (Triton issues #8604, #8841). What it stops is progress: every chunk of a stream is
an inference of a model in Triton (the orchestrators' BLS calls: ``token2wav``, the vocoder,
the reference models, CosyVoice2's ``tensorrt_llm``), and Triton counts each completed one
in ``nv_inference_request_success`` or ``nv_inference_request_failure``. So, from Triton's
``/metrics``: while there is work (the orchestrators' ``cosyvoice_active_streams`` gauge, or
requests waiting in a queue, ``nv_inference_pending_request_count``) and the sum of those
two counters over every model stays the same for ``--stall-seconds``, something in the
chain hangs: the orchestrator's own code, or a model it waits on (ours or upstream's, the
same test for all). Dead stubs are :mod:`.stubs`' job.

What this does not see: one hung stream while other streams of the pod progress (their
chunks move the counters); it is seen once they are done and it is alone. And a stream of
CosyVoice3 waiting on a hung LLM server (outside Triton) looks the same; Triton's restart
then does not cure it.

Pure: :class:`StallWatch` is fed readings and the time; nothing here reads a clock or a URL.
"""

from __future__ import annotations

from dataclasses import dataclass

from cosyvoice_engine_builder.serving.health import ACTIVE_STREAMS, PENDING_REQUESTS, sample_sum

COMPLETED = ("nv_inference_request_success", "nv_inference_request_failure")


@dataclass(frozen=True)
class Reading:
    work: float  # streams in flight plus requests queued
    completed: float  # inferences completed so far, every model, either outcome


def reading(metrics: str) -> Reading:
    """One page of Triton's /metrics, as the watch reads it."""
    return Reading(
        work=sample_sum(metrics, ACTIVE_STREAMS) + sample_sum(metrics, PENDING_REQUESTS),
        completed=sum(sample_sum(metrics, family) for family in COMPLETED),
    )


class StallWatch:
    """How long the pod has had work without completing an inference."""

    def __init__(self, stall_seconds: float) -> None:
        self.stall_seconds = stall_seconds
        self._completed: float | None = None
        self._since: float | None = None  # when work was last seen with no progress since

    def observe(self, now: float, seen: Reading | None) -> float | None:
        """The seconds without progress once they reach ``stall_seconds``, else None. An
        unreadable page (``None``) changes nothing: it neither proves progress nor a hang."""
        if seen is None or self.stall_seconds <= 0:
            return None
        if seen.work <= 0 or seen.completed != self._completed or self._since is None:
            self._completed = seen.completed
            self._since = None if seen.work <= 0 else now
            return None
        stalled = now - self._since
        return stalled if stalled >= self.stall_seconds else None
