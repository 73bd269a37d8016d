"""The drain's admission check, shared by the orchestrators.

``cosyvoice-serve`` keeps Triton running after SIGTERM until the orchestrators'
``cosyvoice_active_streams`` gauge sums to 0, and meanwhile creates the file
``COSYVOICE_DRAIN_FILE`` names (in tritonserver's environment, which the stubs inherit): a
request that starts while it exists is refused (:func:`admit` raises :class:`Draining`),
and the client gets Triton's error code UNAVAILABLE with :data:`DRAINING_ERROR`
(``orchestration.error_of``): gRPC status 14 where the client can see a status, HTTP 503, the
code a client retries on another pod (docs/concepts/draining-and-stub-health.md, "The refusal"). An
orchestrator raises its gauge *before* it calls :func:`admit`, so every request either shows
in the gauge the supervisor reads after creating the file, or sees the file and is refused.
"""

from __future__ import annotations

import os

DRAIN_FILE_ENV = "COSYVOICE_DRAIN_FILE"
DRAINING_ERROR = "this pod is draining (stopping): send the stream to another pod"


class Draining(Exception):
    """A request that started while the pod drains (answered UNAVAILABLE)."""


def draining(environ: dict[str, str] | None = None) -> bool:
    path = (os.environ if environ is None else environ).get(DRAIN_FILE_ENV, "")
    return bool(path) and os.path.exists(path)


def admit(environ: dict[str, str] | None = None) -> None:
    """Raise :class:`Draining` when the pod drains (the request is refused), else return."""
    if draining(environ):
        raise Draining(DRAINING_ERROR)
