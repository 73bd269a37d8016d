"""Reading a request's tensors in a Triton Python model, in host memory.

Every model of ``models/`` takes its inputs as NumPy: the rendered configs force them into host
memory (``FORCE_CPU_ONLY_INPUT_TENSORS``), and the orchestrators ask every BLS response there.
A tensor found in device memory anyway is an error, never a silent copy. The backend's module
(``triton_python_backend_utils``) exists only inside the Python-backend stub, so it is imported
when a tensor is read, not when this module is.
"""

from __future__ import annotations

from typing import Any


def host_array(tensor: Any) -> Any:
    """The NumPy array of a ``pb_utils.Tensor`` held in host memory."""
    if not tensor.is_cpu():
        import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

        raise pb_utils.TritonModelException(f"tensor {tensor.name()} is in device memory")
    return tensor.as_numpy()


def input_array(request: Any, name: str, required: bool = True) -> Any:
    """Input ``name`` of ``request`` as a NumPy array; ``None`` for an absent optional input,
    ``ValueError`` for an absent required one."""
    import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        if required:
            raise ValueError(f"input {name} is missing")
        return None
    return host_array(tensor)


NO_DEFAULT_SPEAKER = (
    "reference_wav is required: this deployment has no default speaker (spec.speakers.default)"
)


def reference_audio(request: Any) -> tuple[Any, str] | None:
    """An orchestrator request's reference speaker: its waveform as a ``(1, samples)`` array
    cut to ``reference_wav_len`` when given, and ``reference_text`` ("" when absent); ``None``
    when the request has no ``reference_wav`` (the deployment's default speaker applies)."""
    wav = input_array(request, "reference_wav", required=False)
    if wav is None:
        return None
    wav = wav.reshape(1, -1)
    length = input_array(request, "reference_wav_len", required=False)
    if length is not None:
        wav = wav[:, : int(length.reshape(-1)[0])]
    text = input_array(request, "reference_text", required=False)
    return wav, "" if text is None else text.reshape(-1)[0].decode("utf-8")
