"""What the two orchestrator stand-ins share: the ``cosyvoice_active_streams`` gauge and the
drain's admission check, as the project's orchestrators (serving-models/) have them.
``cpu_twin.write_repository`` puts this file beside each stand-in's ``model.py``, in the
model's version directory, which the Python backend's stub puts on ``sys.path``."""

from __future__ import annotations

import os
from typing import Any

import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

DRAINING_ERROR = "this pod is draining (stopping): send the stream to another pod"


class Streams:
    """The ``cosyvoice_active_streams`` gauge (one per instance, labelled ``instance``, as the
    project's orchestrators export it) and the drain's admission check.

    ``cosyvoice-serve`` keeps Triton running after SIGTERM until the gauge sums to 0 over
    every instance, and meanwhile creates the file ``COSYVOICE_DRAIN_FILE`` names: a request
    that starts while it exists is refused. The gauge is raised *before* the file is looked
    at, so a request either shows in the gauge the supervisor reads after creating the file,
    or sees the file and is refused.
    """

    def __init__(self, args: dict[str, str]) -> None:
        # The family must outlive its metric (the backend refuses a metric whose family is gone).
        self.family = pb_utils.MetricFamily(
            name="cosyvoice_active_streams",
            description="Streams this orchestrator instance is serving now",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self.gauge = self.family.Metric(labels={"instance": args.get("model_instance_name", "")})
        self.active = 0
        self.gauge.set(0)
        self.drain_file = os.environ.get("COSYVOICE_DRAIN_FILE", "")

    def admit(self) -> None:
        """Count the request in; raise :class:`Draining` when the pod no longer takes one."""
        self.active += 1
        self.gauge.set(self.active)
        if self.drain_file and os.path.exists(self.drain_file):
            self.done()
            raise Draining(DRAINING_ERROR)

    def done(self) -> None:
        self.active -= 1
        self.gauge.set(self.active)


class Draining(Exception):
    """A new request while the pod drains."""


def error_response(exc: Exception) -> Any:
    """The client's error: a refusal while draining is UNAVAILABLE (retry elsewhere), as the
    project's orchestrators answer it (``orchestration.error_of``); anything else INTERNAL."""
    if isinstance(exc, Draining):
        return pb_utils.InferenceResponse(
            error=pb_utils.TritonError(str(exc), pb_utils.TritonError.UNAVAILABLE)
        )
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
