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

    Only the ``message`` field is ever shortened.
    """
    document = dict(payload)
    text = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    message = document.get("message")
    while len(text.encode("utf-8")) > _DOCUMENT_BUDGET_BYTES and isinstance(message, str):
        overflow = len(text.encode("utf-8")) - _DOCUMENT_BUDGET_BYTES
        # JSON escaping can make each byte of message cost up to six in the document.
        keep = max(0, len(message.encode("utf-8")) - overflow - 16)
        message = clip_bytes(message, keep) if keep else ""
        document["message"] = message
        text = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
        if not message:
            break
    return text


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
