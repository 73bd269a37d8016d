"""What both orchestrators' ``TritonPythonModel`` do alike: the ``cosyvoice_active_streams``
gauge of their instance, and the request loop around it with the drain's admission check
(:mod:`.admission`). One stream at a time per instance, so Triton's queue time is the wait
before synthesis starts (docs/triton-repository.md, "Queue latency").

``triton_python_backend_utils`` exists only inside a Python-backend stub: it is imported where
it is used, so the package stays importable elsewhere (its tests, the image's import check).
"""

from __future__ import annotations

from typing import Any

from cosyvoice_serving_models import admission


class OneStreamAtATime:
    """Base of an orchestrator model: a subclass sets ``decoupled`` and defines ``_stream``
    (decoupled: sends its own responses) and ``_offline`` (returns the one response)."""

    decoupled: bool

    def _start_gauge(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

        # The family must outlive its metric (the backend refuses a metric whose family is gone).
        self.metric_family = pb_utils.MetricFamily(
            name="cosyvoice_active_streams",
            description="Streams this orchestrator instance is serving now (0 or 1)",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self.active = self.metric_family.Metric(
            labels={"instance": args.get("model_instance_name", "")}
        )
        self.active.set(0)

    def _stream(self, request: Any) -> None:
        raise NotImplementedError

    def _offline(self, request: Any) -> Any:
        raise NotImplementedError

    def execute(self, requests: list[Any]) -> list[Any] | None:
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            self.active.set(1)  # before the drain check: see admission.py
            try:
                if admission.draining():
                    raise pb_utils.TritonModelException(admission.DRAINING_ERROR)
                if self.decoupled:
                    self._stream(request)
                else:
                    responses.append(self._offline(request))
            except Exception as exc:
                error = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
                if self.decoupled:
                    request.get_response_sender().send(
                        error, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                    )
                else:
                    responses.append(error)
            finally:
                self.active.set(0)
        return None if self.decoupled else responses
