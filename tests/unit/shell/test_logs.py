"""The operator's log lines: JSON on request, and never a credential whatever the format."""

from __future__ import annotations

import io
import json
import logging

import pytest

from cosyvoice_operator.shell import logs


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ("Prometheus at http://ops:hunter2pass@prom:9090 unreachable", "hunter2pass"),
        ("GET https://u:p%40ss@host/api failed", "p%40ss"),
        (
            "header Authorization: Bearer eyJhbGciOiJSUzI1NiIsImtpZCI6",
            "eyJhbGciOiJSUzI1NiIsImtpZCI6",
        ),
        ("refused: token=ghp_abcdef0123456789 in the query", "ghp_abcdef0123456789"),
        ('settings {"password": "s3cret-value", "user": "x"}', "s3cret-value"),
        ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG", "wJalrXUtnFEMI/K7MDENG"),
        # The shapes the security review found leaking (issue 21 L2):
        ("Prometheus at http://user:p@ss@host:9090 unreachable", "ss@host"),
        ("Prometheus at http://user:pa/ss@host:9090 unreachable", "pa/ss"),
        ("GET https://ghp_TOKEN0123456789@github.com/x failed", "ghp_TOKEN0123456789"),
        ("env HF_TOKEN='hf_abcdefghijklmnop' set", "hf_abcdefghijklmnop"),
        ("{'token': 'hf_abcdefghijklmnop', 'repo': 'x'}", "hf_abcdefghijklmnop"),
        ('{\\"password\\": \\"s3cret-value\\"}', "s3cret-value"),
        ("header api-key: 0123456789abcdef", "0123456789abcdef"),
        ("x-api-key=0123456789abcdef&q=1", "0123456789abcdef"),
        ("Authorization: Token 0123456789abcdef", "0123456789abcdef"),
        ("'Authorization': 'Basic dXNlcjpwYXNz'", "dXNlcjpwYXNz"),
        (
            "GET https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAEXAMPLE%2F20261203%2Fus"
            "&X-Amz-Signature=abcdef0123456789&X-Amz-Security-Token=FQoGZXIvYXdzEXAMPLE",
            "AKIAEXAMPLE",
        ),
        ("X-Amz-Signature=abcdef0123456789", "abcdef0123456789"),
        ("X-Amz-Security-Token=FQoGZXIvYXdzEXAMPLE", "FQoGZXIvYXdzEXAMPLE"),
        ("private_key=-----BEGIN", "-----BEGIN"),
        ("client_secret: abcdef012345", "abcdef012345"),
    ],
)
def test_credentials_are_redacted(line: str, secret: str) -> None:
    clean = logs.redact(line)
    assert secret not in clean and "***" in clean


def test_ordinary_lines_are_left_alone() -> None:
    for line in (
        "ns/tts: created Job cvs-engine-sm89-deefb7bb4469955f5771-ddd2c7-a1",
        "Prometheus at http://prometheus.monitoring:9090 unreachable: [Errno 111]",
        "scaling up 1 -> 2: queue latency 121.8 ms against a 20 ms target",
        "engine key tokens=32768",
        "maxNumTokens: 8192 tokenizerDir=model/llm",
        "credentials from Secret hf-creds (keys HF_TOKEN)",
        "Prometheus at http://prometheus.monitoring:9090/api unreachable",
        "spec.serving.image 'nvcr.io/nvidia/tritonserver:25.07-trtllm-python-py3' not allowed",
    ):
        assert logs.redact(line) == line


def test_json_format_and_redaction_on_every_handler() -> None:
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    try:
        logs.configure("json")
        stream = io.StringIO()
        # kopf's own handler (pytest's capture handlers are stream handlers too).
        [kopf_handler] = [h for h in root.handlers if type(h).__module__.startswith("kopf")]
        assert isinstance(kopf_handler, logging.StreamHandler)
        kopf_handler.setStream(stream)
        log = logging.getLogger("cosyvoice_operator.test")
        log.warning("Prometheus at %s: %s", "http://a:topsecret1@p:9090", "refused")
        try:
            raise RuntimeError("connect to https://b:topsecret2@api failed")
        except RuntimeError:
            log.exception("pass failed")
        lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
        assert lines[0]["message"] == "Prometheus at http://***@p:9090: refused"
        assert lines[0]["severity"] == "warn" and "timestamp" in lines[0]
        assert "topsecret" not in stream.getvalue()
        assert "RuntimeError" in lines[1].get("exc_info", "")
    finally:
        root.handlers[:], root.level = saved


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_lines_about_an_object_carry_its_reference_and_names_are_whole(log_format: str) -> None:
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    try:
        logs.configure(log_format)
        stream = io.StringIO()
        [kopf_handler] = [h for h in root.handlers if type(h).__module__.startswith("kopf")]
        assert isinstance(kopf_handler, logging.StreamHandler)
        kopf_handler.setStream(stream)
        log = logging.getLogger("cosyvoice_operator.shell.autoscale_loop")
        with logs.about("CosyVoiceService", "tts", "zh", "tts.cosyvoice.dev/v1alpha1"):
            log.warning("holding: no metrics")
        log.warning("not about any object")
        out = stream.getvalue().splitlines()
        if log_format == "json":
            first, second = (json.loads(line) for line in out)
            assert first["object"] == {
                "apiVersion": "tts.cosyvoice.dev/v1alpha1",
                "kind": "CosyVoiceService",
                "namespace": "tts",
                "name": "zh",
            }
            assert "object" not in second
        else:
            assert "cosyvoice_operator.shell.autoscale_loop [WARNING ] [tts/zh] holding" in out[0]
            assert out[1].endswith(
                "cosyvoice_operator.shell.autoscale_loop [WARNING ] not about any object"
            )
    finally:
        root.handlers[:], root.level = saved


def test_the_builders_shapes_are_the_operators() -> None:
    """The builder ships without the operator: its copy of the patterns must not drift."""
    from cosyvoice_engine_builder import redaction

    ours = [(p.pattern, p.flags, r) for p, r in logs._PATTERNS]
    theirs = [(p.pattern, p.flags, r) for p, r in redaction.SHAPES]
    assert ours == theirs
