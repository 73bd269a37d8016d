"""What the CPU twin's stand-ins share: every one reads tensors with :func:`host_array`; the
two orchestrators (``cosyvoice2``, ``cosyvoice3``) share the rest.

Triton loads each model's ``model.py`` on its own; ``cpu_twin.write_repository`` copies this
module beside each stand-in (into the model's version directory, which is on the stub's
``sys.path``), so they import it as ``twin_common``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

FIRST_HOP_TOKENS = 15
LOOKAHEAD_TOKENS = 3
TOKEN_RATE = 25
MAX_TOKENS = 750
MEL_BINS = 80


def host_array(tensor: Any) -> Any:
    """The tensor as NumPy. It must be in host memory: a model's inputs are, by the rendered
    FORCE_CPU_ONLY_INPUT_TENSORS; a BLS response is, by the caller's preferred_memory."""
    if not tensor.is_cpu():
        raise pb_utils.TritonModelException(f"{tensor.name()} is in device memory, not host")
    return tensor.as_numpy()


class Pace:
    """The service time the closed-loop harness asks for (a test seam, read at load time).

    ``COSYVOICE_TWIN_SERVICE_SECONDS``: each request holds its orchestrator instance at least
    this long; ``COSYVOICE_TWIN_FIRST_CHUNK_SECONDS`` (default a quarter of it) of that
    passes before its first audio. Unset: as fast as the stand-ins go.
    """

    def __init__(self) -> None:
        self.total = float(os.environ.get("COSYVOICE_TWIN_SERVICE_SECONDS") or 0)
        first = os.environ.get("COSYVOICE_TWIN_FIRST_CHUNK_SECONDS")
        self.first = min(self.total, float(first) if first else self.total / 4)

    @staticmethod
    def wait(start: float, seconds: float) -> None:
        """Sleep until ``seconds`` after ``start`` (a ``time.monotonic()``), if not past."""
        left = start + seconds - time.monotonic()
        if left > 0:
            time.sleep(left)


class Chunking:
    """The chunk schedule from the orchestrator's parameters, as the operator renders them:
    ``token_hop_len`` (the first chunk's tokens; upstream's 15 when absent) and
    ``dynamic_chunk_strategy``: ``exponential`` (later hops 25 x 2^k), ``equal`` (every hop
    the first's). ``time_based`` sizes hops from measured synthesis speed upstream; on a CPU
    twin that speed means nothing, so the stand-in follows ``exponential`` for it.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.first = int(params.get("token_hop_len") or FIRST_HOP_TOKENS)
        self.strategy = params.get("dynamic_chunk_strategy") or "exponential"

    def next_hop(self, index: int) -> int:
        """The hop after chunk ``index`` (0 for the first)."""
        if self.strategy == "equal":
            return self.first
        return int(TOKEN_RATE * 2**index)  # upstream's "exponential" strategy


def execute_all(
    requests: list[Any],
    decoupled: bool,
    offline: Callable[[Any], Any],
    stream: Callable[[Any], None],
) -> list[Any] | None:
    """An orchestrator's ``execute``, as upstream's runs it: one request after another (a
    stream holds the instance until it ends); an exception becomes that request's error
    response (the final one of a stream)."""
    if not decoupled:
        responses = []
        for request in requests:
            try:
                responses.append(offline(request))
            except Exception as exc:  # reported to the client
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses
    for request in requests:
        try:
            stream(request)
        except Exception as exc:  # reported to the client
            request.get_response_sender().send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
    return None
