"""How the operator logs: kopf's text lines or one JSON object per line, and never a secret.

`cosyvoice-operator run --log-format json` gives log pipelines one JSON object per line (kopf's
JSON formatter: message, severity, timestamp, and the object concerned where kopf knows it).
Whatever the format, every line goes through :class:`Redact` on its way out: the operator reads
no Secret, but a URL it was given may carry credentials (a Prometheus URL with
``user:password@``) and an error message may quote a header; those parts are replaced by
``***`` before anything is written.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
from collections.abc import Iterator
from typing import Any

import kopf

# kopf's FULL text format cuts logger names to 20 characters ("cosyvoice_operator.s"): the
# same line with the whole name.
TEXT_FORMAT = "[%(asctime)s] %(name)s [%(levelname)-8.8s] %(message)s"

# The object the current asyncio task works on (a service, while a worker runs its pass): every
# line logged meanwhile carries it, as kopf's own per-object lines do (JSON: "object":
# {apiVersion, kind, namespace, name}; text: a "[namespace/name]" prefix).
_OBJECT: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "cosyvoice_log_object", default=None
)

# Credential-shaped text, in the forms it takes in URLs, headers, settings, env, JSON and
# Python reprs. Kept in step with engine-builder/cosyvoice_engine_builder/redaction.py's
# SHAPES (the builder ships without the operator; tests/unit/shell/test_logs.py checks both).
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


@contextlib.contextmanager
def about(kind: str, namespace: str, name: str, api_version: str = "") -> Iterator[None]:
    """Lines logged inside (by this task and the tasks it starts) concern this object."""
    ref = {"kind": kind, "namespace": namespace, "name": name}
    if api_version:
        ref["apiVersion"] = api_version
    token = _OBJECT.set(ref)
    try:
        yield
    finally:
        _OBJECT.reset(token)


class ObjectReference(logging.Filter):
    """Gives a record the object of :func:`about` as kopf's ``k8s_ref``, unless it has one."""

    def filter(self, record: logging.LogRecord) -> bool:
        ref = _OBJECT.get()
        if ref is not None and not hasattr(record, "k8s_ref"):
            record.k8s_ref = ref
        return True


def configure(log_format: str = "text", verbose: bool = False) -> None:
    """kopf's logging in the chosen format, with :class:`Redact` and :class:`ObjectReference`
    on every handler."""
    json_lines = log_format == "json"
    chosen: Any = kopf.LogFormat.JSON if json_lines else TEXT_FORMAT  # kopf takes a str too
    kopf.configure(verbose=verbose, log_format=chosen, log_prefix=not json_lines)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, ObjectReference) for f in handler.filters):
            handler.addFilter(ObjectReference())
        if not any(isinstance(f, Redact) for f in handler.filters):
            handler.addFilter(Redact())
