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

# Credential-shaped text, in the forms it takes in URLs, headers, settings, env, JSON and
# Python reprs. Kept in step with engine-builder/cosyvoice_engine_builder/redaction.py's
# SHAPES (the builder ships without the operator; tests/unit/test_logs.py checks both).
_KEY = (
    r"[a-z_-]*(?:token|passw(?:or)?d|secret|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|client[_-]?secret)(?:[_-][a-z_-]*)?"
)
_PATTERNS = (
    # userinfo in a URL: user:password@, token@, and passwords with '@' or '/' in them (up to
    # the last '@' of the word: a later '@' in the path costs some of the URL, never a secret)
    (re.compile(r"(?<=://)[^\s'\"<>]*@"), "***@"),
    # Authorization: Bearer|Basic|Token|... <credentials>, quoted in an error message
    (
        re.compile(r"(?i)\b(authorization\\?['\"]?\s*[:=]\s*\\?['\"]?)(?:[a-z-]+\s+)?[^\s'\",}]+"),
        r"\1***",
    ),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 ***"),
    # AWS presigned URLs (query parameters X-Amz-Credential, -Signature, -Security-Token)
    (
        re.compile(r"(?i)\b(x-amz-(?:credential|signature|security-token))=[^\s&'\"]+"),
        r"\1=***",
    ),
    # token=..., password: ..., 'api-key': '...', HF_TOKEN='...', AWS_SECRET_ACCESS_KEY=...,
    # x-api-key: ..., private_key=... (query strings, headers, settings, env, JSON, reprs)
    (
        re.compile(rf"(?i)\b({_KEY})(\\?['\"]?\s*[:=]\s*\\?['\"]?)[^\s\"',&}}\\]+"),
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
