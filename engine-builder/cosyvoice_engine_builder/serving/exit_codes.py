"""What ``cosyvoice-serve`` exits with, and the two exceptions that carry an exit code.

They sit apart from :mod:`.command` because the supervisor (which raises
:class:`ServerFailed`) and the planning modules (which raise :class:`ConfigError`) need
them too, and :mod:`.command` imports all of those.

Exit codes:

- 0..255  tritonserver's own exit code, once it has started
- 1  a server could not be started, or an LLM server did not answer ``/health`` in time
- 2  invalid command line, or a repository configuration the image cannot serve (no
     ``*.pbtxt``, a model whose code is not in the image)
- 3  the engine is missing, incomplete, changed since its build (its manifest is not the one
     `--manifest-sha256` names, or a file differs from it), or not built for this pod (the gate)
- N  a ``trtllm-serve``'s exit code when it exits first (1 if it exited with 0)
- 128+N  stopped by signal N before Triton started (143 for SIGTERM)
"""

from __future__ import annotations

from collections.abc import Sequence

EXIT_SERVER_FAILED = 1
EXIT_CONFIG = 2
EXIT_INCOMPATIBLE = 3


class ConfigError(Exception):
    """The repository configuration cannot be served by this image; exit 2."""


class ServerFailed(Exception):
    """A child server failed to start or to become healthy; carries the exit code."""

    def __init__(self, message: str, code: int, tail: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.tail = tuple(tail)
