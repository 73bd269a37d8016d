"""How the operator logs: kopf's text lines or one JSON object per line, and never a secret.

`cosyvoice-operator run --log-format json` gives log pipelines one JSON object per line (kopf's
JSON formatter: message, severity, timestamp, and the object concerned where kopf knows it).
Whatever the format, every line goes through :class:`Redact` on its way out: the operator reads
no Secret, but a URL it was given may carry credentials (a Prometheus URL with
``user:password@``) and an error message may quote a header; those parts are replaced by
``***`` before anything is written.
"""

from __future__ import annotations

import logging
import re

import kopf

FORMATS = ("text", "json")

_PATTERNS = (
    # user:password@ in a URL
    (re.compile(r"(?<=://)[^/@\s:]+:[^/@\s]+@"), "***@"),
    # Authorization headers and bearer tokens, quoted in an error message
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 ***"),
    # token=..., password: ..., AWS_SECRET_ACCESS_KEY=... (query strings, settings, env)
    (
        re.compile(
            r"(?i)\b([a-z_]*(?:token|passw(?:or)?d|secret|api_?key|access_key)(?:_[a-z_]*)?)"
            r"(\"?\s*[:=]\s*\"?)[^\s\"',&}]+"
        ),
        r"\1\2***",
    ),
)


def redact(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class Redact(logging.Filter):
    """Rewrites a record's message (arguments merged in) and exception text without secrets."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info:
            # Formatters print exc_text when there is no exc_info (text and JSON alike).
            record.exc_text = record.exc_text or logging.Formatter().formatException(
                record.exc_info
            )
            record.exc_info = None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def configure(log_format: str = "text", verbose: bool = False) -> None:
    """kopf's logging in the chosen format, with :class:`Redact` on every handler."""
    kopf.configure(
        verbose=verbose,
        log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.FULL,
    )
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, Redact) for f in handler.filters):
            handler.addFilter(Redact())
