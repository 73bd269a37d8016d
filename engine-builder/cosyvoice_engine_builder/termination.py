"""The one-line JSON result the operator reads from the pod's termination message.

Kubernetes truncates termination messages at 4096 bytes; a truncated JSON document is
useless to the operator, so the message is cut down *before* encoding until the whole
document fits, keeping the end of the tool's output (where the error usually is).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

DEFAULT_PATH = "/dev/termination-log"
KUBERNETES_LIMIT_BYTES = 4096
# Headroom under the Kubernetes limit for the other fields.
_DOCUMENT_BUDGET_BYTES = 4000
MESSAGE_MAX_LINES = 20
MESSAGE_MAX_BYTES = 2048


def tail_text(lines: Iterable[str], *, max_lines: int = MESSAGE_MAX_LINES) -> str:
    """The last ``max_lines`` lines, then at most :data:`MESSAGE_MAX_BYTES` of UTF-8."""
    kept = list(lines)[-max_lines:]
    return clip_bytes("\n".join(kept), MESSAGE_MAX_BYTES)


def clip_bytes(text: str, limit: int) -> str:
    """Keep the end of ``text`` within ``limit`` UTF-8 bytes, never splitting a character."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[len(data) - limit :].decode("utf-8", errors="ignore")


def encode(payload: Mapping[str, object]) -> str:
    """Encode ``payload`` as one JSON line that fits the Kubernetes limit.

    Only the ``message`` field is ever shortened, from its start. JSON escaping makes the
    encoded size of a message unpredictable (a quote or newline costs two bytes, a control
    character six), so the longest fitting tail is found by bisection.
    """

    def dumps(document: Mapping[str, object]) -> str:
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False)

    def fits(text: str) -> bool:
        return len(text.encode("utf-8")) <= _DOCUMENT_BUDGET_BYTES

    text = dumps(payload)
    message = payload.get("message")
    if fits(text) or not isinstance(message, str):
        return text
    low, high = 0, len(message)  # characters kept from the end: low fits, high does not
    while high - low > 1:
        middle = (low + high) // 2
        if fits(dumps({**payload, "message": message[len(message) - middle :]})):
            low = middle
        else:
            high = middle
    return dumps({**payload, "message": message[len(message) - low :] if low else ""})


def write(payload: Mapping[str, object], environ: Mapping[str, str]) -> None:
    """Write the message where the kubelet looks for it; skip silently if impossible.

    With the default path and no such file we are not in a pod (a developer's shell,
    a test), and creating ``/dev/termination-log`` as root would be a surprise.
    """
    configured = environ.get("TERMINATION_MESSAGE_PATH")
    path = Path(configured or DEFAULT_PATH)
    if not configured and not path.exists():
        return
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(encode(payload))
            handle.flush()
            os.fsync(handle.fileno())
    except OSError:
        pass
