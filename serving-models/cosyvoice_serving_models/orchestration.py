"""What both orchestrators' ``TritonPythonModel`` do alike: the ``cosyvoice_active_streams``
gauge of their instance, the request loop around it with the drain's admission check
(:mod:`.admission`), and the speaker of a request (its reference audio's prompt features,
cached, or the default speaker). One stream at a time per instance, so Triton's queue time
is the wait before synthesis starts (docs/concepts/triton-repository.md, "Queue latency").

``triton_python_backend_utils`` exists only inside a Python-backend stub: it is imported where
it is used, so the package stays importable elsewhere (its tests, the image's import check).
"""

from __future__ import annotations

from typing import Any

from cosyvoice_serving_models import admission, features
from cosyvoice_serving_models.speakers import SpeakerCache, aligned, speaker_key
from cosyvoice_serving_models.triton_io import NO_DEFAULT_SPEAKER, reference_audio

# A speaker as the orchestrators pass it to token2wav: (tokens [1, n] int32, mel [1, 2n, 80]
# float16, embedding [1, 192] float16), `speakers.Prompt.as_request_inputs`.
Speaker = tuple[Any, Any, Any]


class OneStreamAtATime:
    """Base of an orchestrator model: a subclass sets ``decoupled`` and defines ``_stream``
    (decoupled: sends its own responses) and ``_offline`` (returns the one response)."""

    decoupled: bool
    f_max: float  # the release's mel upper frequency (`features.check_release`)
    speakers: SpeakerCache[Speaker]
    default_speaker: tuple[str, Speaker] | None

    def _reference_features(self, wav: Any) -> tuple[Any, Any]:
        """The speech tokens and the speaker embedding of a reference wave [1, samples]
        (from the audio_tokenizer and speaker_embedding models)."""
        raise NotImplementedError

    def _speaker(self, request: Any) -> tuple[str, Speaker]:
        """The request's reference text and speaker: its reference audio's prompt features
        (cached by audio and text), or the default speaker when it sends none; ValueError
        when it sends none and the deployment has no default speaker."""
        reference = reference_audio(request)
        if reference is None:
            if self.default_speaker is None:
                raise ValueError(NO_DEFAULT_SPEAKER)
            return self.default_speaker
        wav, text = reference
        key = speaker_key(wav, text)
        cached = self.speakers.get(key)
        if cached is not None:
            return text, cached
        tokens, embedding = self._reference_features(wav)
        mel = features.prompt_mel(wav, self.f_max)
        speaker = aligned(text, tokens, mel, embedding).as_request_inputs()
        self.speakers.put(key, speaker)
        return text, speaker

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
                admission.admit()
                if self.decoupled:
                    self._stream(request)
                else:
                    responses.append(self._offline(request))
            except Exception as exc:
                error = pb_utils.InferenceResponse(error=error_of(pb_utils, exc))
                if self.decoupled:
                    request.get_response_sender().send(
                        error, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                    )
                else:
                    responses.append(error)
            finally:
                self.active.set(0)
        return None if self.decoupled else responses


def error_of(pb_utils: Any, exc: Exception) -> Any:
    """The ``TritonError`` a failed request answers: code UNAVAILABLE for a refusal while the
    pod drains (gRPC status 14, HTTP 503: retry on another pod), the backend's default
    (INTERNAL) for anything else. ``pb_utils`` is the stub's ``triton_python_backend_utils``,
    whose ``TritonError`` takes a code (the pytriton wheel's r24.10 does, checked in the twin;
    the serving image's Triton is newer)."""
    if isinstance(exc, admission.Draining):
        return pb_utils.TritonError(str(exc), pb_utils.TritonError.UNAVAILABLE)
    return pb_utils.TritonError(str(exc))
