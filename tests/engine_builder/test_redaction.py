"""Credentials never reach stdout, stderr or the termination message."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosyvoice_engine_builder.fetch import Downloaders
from cosyvoice_engine_builder.redaction import MASK, SECRET_ENV_VARS, Redactor
from tests.engine_builder import standin_tool
from tests.engine_builder.conftest import Builder

TOKEN = "hf_SeCrEtToKeN0123456789abcdef"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def test_redactor_masks_every_secret_longest_first() -> None:
    redact = Redactor([TOKEN, TOKEN[:10], "", "ab"])
    assert redact(f"token={TOKEN} prefix={TOKEN[:10]} ab") == f"token={MASK} prefix={MASK} ab"
    env = {"HF_TOKEN": TOKEN, "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "HOME": "/home/someone"}
    redact = Redactor.from_environ(env)
    assert redact(f"{AWS_SECRET} {TOKEN} /home/someone") == f"{MASK} {MASK} /home/someone"


def test_encoded_forms_of_a_secret_are_masked_too() -> None:
    """Issue 21 L2: an AWS key's '/' is %2F in a presigned URL or a query string."""
    import base64
    import urllib.parse

    redact = Redactor([AWS_SECRET, TOKEN])
    for form in (
        urllib.parse.quote(AWS_SECRET, safe=""),
        urllib.parse.quote_plus(AWS_SECRET, safe=""),
        base64.b64encode(TOKEN.encode()).decode(),
    ):
        assert form.rstrip("=") not in redact(f"GET /bucket?k={form} 403")


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ("downloading https://user:pa/ss@host/x", "pa/ss"),
        ("fetch https://ghp_OTHERTOKEN012345@github.com/x", "ghp_OTHERTOKEN012345"),
        ("{'token': 'hf_notgiventothebuilder'}", "hf_notgiventothebuilder"),
        ("X-Amz-Signature=abcdef0123456789", "abcdef0123456789"),
        ("x-api-key: 0123456789abcdef", "0123456789abcdef"),
        ("Authorization: Token 0123456789abcdef", "0123456789abcdef"),
    ],
)
def test_credential_shapes_are_masked_whatever_their_value(line: str, secret: str) -> None:
    """Secrets the builder was not given (a tool's own, or one inside a URL) still have
    their shape."""
    clean = Redactor([])(line)
    assert secret not in clean and MASK in clean


def test_a_tool_echoing_the_token_is_redacted_everywhere(builder: Builder) -> None:
    env = {"HF_TOKEN": TOKEN, "FAKE_FAIL": "trtllm-build", "FAKE_LEAK": TOKEN}
    result = builder.build(env_extra=env)
    assert result.code == 1
    assert result.termination_raw is not None
    assert "auth header: Bearer ***" in result.termination_raw
    assert "auth header: Bearer ***" in result.out
    for text in (result.out, result.err, result.termination_raw):
        assert TOKEN not in text


def test_tools_do_not_receive_credentials(builder: Builder) -> None:
    assert set(standin_tool.SECRET_NAMES) == set(SECRET_ENV_VARS)
    env = {name: f"secret-{i}" for i, name in enumerate(SECRET_ENV_VARS)}
    assert builder.build(env_extra=env).code == 0
    calls = builder.calls()
    assert [c["tool"] for c in calls] == ["convert", "trtllm-build", "trtexec", "trtexec"]
    assert all(c["secrets_in_env"] == [] for c in calls)


def test_the_stand_in_does_see_credentials_it_is_given(builder: Builder) -> None:
    # The check above would pass vacuously if the stand-in could not see its environment:
    # with the builder's stripping bypassed (a tool run by hand), the names do show.
    import subprocess
    import sys

    env = {**builder.env, "AWS_SECRET_ACCESS_KEY": AWS_SECRET}
    subprocess.run(
        [sys.executable, str(builder.tmp / "bin" / "trtexec"), "--onnx=x", "--saveEngine=y"],
        env=env,
        check=False,
        capture_output=True,
    )
    assert builder.calls()[-1]["secrets_in_env"] == ["AWS_SECRET_ACCESS_KEY"]


def test_a_download_error_quoting_the_token_is_redacted(builder: Builder) -> None:
    def failing_download(**kwargs: object) -> str:
        raise RuntimeError(f"401 Unauthorized for token {kwargs['token']}")

    builder.downloaders = Downloaders(hf_snapshot_download=failing_download)
    result = builder.build(model_uri="hf://yuekai/cosyvoice2_llm", env_extra={"HF_TOKEN": TOKEN})
    assert result.code == 1
    assert result.termination is not None
    assert result.termination["step"] == "fetch"
    assert "401 Unauthorized for token ***" in result.termination["message"]
    for text in (result.out, result.err, result.termination_raw or ""):
        assert TOKEN not in text


def test_an_internal_error_traceback_is_redacted(builder: Builder, tmp_path: Path) -> None:
    # A cache "directory" that is a file makes the lock's mkdir fail: an unexpected error
    # whose traceback quotes the path, which here contains the token.
    not_a_dir = tmp_path / TOKEN
    not_a_dir.write_text("")
    result = builder.build(cache_dir=not_a_dir, env_extra={"HF_TOKEN": TOKEN})
    assert result.code == 1
    assert result.termination is not None
    assert result.termination["step"] == "lock"
    assert result.termination["message"].startswith("internal error: NotADirectoryError")
    assert "Traceback" in result.out
    for text in (result.out, result.err, result.termination_raw or ""):
        assert TOKEN not in text


def test_interrupts_are_not_swallowed_as_fetch_errors(builder: Builder) -> None:
    def interrupted(**kwargs: object) -> str:
        raise KeyboardInterrupt

    builder.downloaders = Downloaders(hf_snapshot_download=interrupted)
    with pytest.raises(KeyboardInterrupt):
        builder.build(model_uri="hf://yuekai/cosyvoice2_llm")
