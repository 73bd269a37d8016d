"""Keeping credentials out of everything the builder writes.

Tools are free to echo their environment or a URL with a token in it into an error; the
builder's stdout ends up in ``kubectl logs`` and the termination message ends up in the
custom resource's status, both readable by far more people than the Secret. So every
line leaves the process through a :class:`Redactor`.
"""

from __future__ import annotations

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


class Redactor:
    """Replaces every known secret value in a text with :data:`MASK`."""

    def __init__(self, secrets: Iterable[str]) -> None:
        unique = {s for s in secrets if len(s) >= _MIN_SECRET_LENGTH}
        # Longest first, so a secret that contains another is masked whole.
        self._secrets = sorted(unique, key=len, reverse=True)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Redactor:
        return cls(environ.get(name, "") for name in SECRET_ENV_VARS)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for tools that have no business seeing credentials."""
    return {k: v for k, v in environ.items() if k not in SECRET_ENV_VARS}
