"""Keeping credentials out of everything the builder writes.

Tools are free to echo their environment or a URL with a token in it into an error; the
builder's stdout ends up in ``kubectl logs`` and the termination message ends up in the
custom resource's status, both readable by far more people than the Secret. So every
line leaves the process through a :class:`Redactor`.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
from collections.abc import Iterable, Mapping

SECRET_ENV_VARS: tuple[str, ...] = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)

# Replacing a one- or two-character "secret" would shred every log line while protecting
# nothing; real tokens and keys are far longer.
_MIN_SECRET_LENGTH = 4

MASK = "***"

# Credential-shaped text whatever its value (a token the builder was not given, a tool's
# own setting): the same shapes as the operator's log filter (operator/cosyvoice_operator/
# shell/logs.py; the builder ships without the operator, so they are repeated here and
# tests/unit/shell/test_logs.py checks the two agree).
_KEY = (
    r"[a-z_-]*(?:token|passw(?:or)?d|secret|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|client[_-]?secret)(?:[_-][a-z_-]*)?"
)
SHAPES: tuple[tuple[re.Pattern[str], str], ...] = (
    # userinfo in a URL: user:password@, token@, passwords with '@' or '/' in them
    (re.compile(r"(?<=://)[^\s'\"<>]*@"), "***@"),
    # Authorization: Bearer|Basic|Token|... <credentials>
    (
        re.compile(r"(?i)\b(authorization\\?['\"]?\s*[:=]\s*\\?['\"]?)(?:[a-z-]+\s+)?[^\s'\",}]+"),
        r"\1***",
    ),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 ***"),
    # AWS presigned URLs
    (
        re.compile(r"(?i)\b(x-amz-(?:credential|signature|security-token))=[^\s&'\"]+"),
        r"\1=***",
    ),
    # token=..., HF_TOKEN='...', 'api-key': '...', AWS_SECRET_ACCESS_KEY=..., private_key=...
    (
        re.compile(rf"(?i)\b({_KEY})(\\?['\"]?\s*[:=]\s*\\?['\"]?)[^\s\"',&}}\\]+"),
        r"\1\2***",
    ),
)


def redact_shapes(text: str) -> str:
    for pattern, replacement in SHAPES:
        text = pattern.sub(replacement, text)
    return text


def _encodings(secret: str) -> set[str]:
    """The secret as it appears in URLs, form bodies and base64 headers as well as plain:
    an AWS secret key's '/' and '+' are URL-encoded in presigned URLs and query strings."""
    forms = {
        secret,
        urllib.parse.quote(secret, safe=""),
        urllib.parse.quote_plus(secret, safe=""),
        base64.b64encode(secret.encode()).decode().rstrip("="),
    }
    return {f for f in forms if len(f) >= _MIN_SECRET_LENGTH}


class Redactor:
    """Replaces every known secret value (and its URL-encoded and base64 forms) in a text
    with :data:`MASK`, then every credential-shaped part (:data:`SHAPES`)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        unique: set[str] = set()
        for secret in secrets:
            if len(secret) >= _MIN_SECRET_LENGTH:
                unique |= _encodings(secret)
        # Longest first, so a secret that contains another is masked whole.
        self._secrets = sorted(unique, key=len, reverse=True)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Redactor:
        return cls(environ.get(name, "") for name in SECRET_ENV_VARS)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return redact_shapes(text)


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for tools that have no business seeing credentials."""
    return {k: v for k, v in environ.items() if k not in SECRET_ENV_VARS}
