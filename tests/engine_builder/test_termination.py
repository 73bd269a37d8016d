"""The termination message: content, the 2 KiB message cap and the 4096-byte limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cosyvoice_engine_builder import termination
from tests.engine_builder.conftest import KEY, Builder


def test_failure_message_carries_the_tail_of_the_tool_stderr(builder: Builder) -> None:
    result = builder.build(env_extra={"FAKE_FAIL": "convert", "FAKE_STDERR_LINES": "50"})
    assert result.code == 1
    msg = result.termination
    assert msg is not None
    assert set(msg) == {"result", "step", "key", "message"}
    assert (msg["result"], msg["step"], msg["key"]) == ("failed", "convert", KEY)
    lines = msg["message"].splitlines()
    assert lines[0].startswith("convert_checkpoint.py: exited with code 3")
    assert lines[-1] == "convert: fatal: simulated failure"
    assert "convert error line 49 " in msg["message"]
    # Last ~20 lines only: the early ones are gone.
    assert "convert error line 10 " not in msg["message"]
    assert len(lines) <= 20


def test_huge_stderr_stays_within_the_limits(builder: Builder) -> None:
    env = {"FAKE_FAIL": "trtllm-build", "FAKE_STDERR_LINES": "500", "FAKE_STDERR_PAD": "é" * 900}
    result = builder.build(env_extra=env)
    assert result.code == 1
    raw = builder.termination_path.read_bytes()
    assert len(raw) <= termination.KUBERNETES_LIMIT_BYTES
    msg = json.loads(raw)
    assert len(msg["message"].encode("utf-8")) <= termination.MESSAGE_MAX_BYTES
    assert msg["message"].startswith("trtllm-build: exited with code 3")
    assert msg["message"].endswith("trtllm-build: fatal: simulated failure")


def test_encode_shortens_only_the_message() -> None:
    payload = {"result": "failed", "step": "build", "key": KEY, "message": '"\\\n' * 5000}
    text = termination.encode(payload)
    assert len(text.encode("utf-8")) <= termination.KUBERNETES_LIMIT_BYTES
    decoded = json.loads(text)
    assert decoded["step"] == "build" and decoded["key"] == KEY
    assert decoded["message"] and set(decoded["message"]) <= {'"', "\\", "\n"}


def test_tail_text_keeps_the_end_and_never_splits_a_character() -> None:
    text = termination.tail_text([f"line {i} " + "ü" * 300 for i in range(100)])
    assert len(text.encode("utf-8")) <= termination.MESSAGE_MAX_BYTES
    assert text.endswith("ü")
    assert "line 99" in text
    text.encode("utf-8")  # valid UTF-8 throughout


def test_unwritable_path_is_skipped_silently(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "dir" / "termination-log"
    termination.write({"result": "ok"}, {"TERMINATION_MESSAGE_PATH": str(target)})
    assert not target.exists()


def test_default_path_is_not_created_outside_a_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # /dev/termination-log only exists when the kubelet mounts it; not creating it
    # matters when a developer runs the builder as root. The default path is pointed at a
    # file of this test, so that the check does not depend on the machine it runs on.
    default = tmp_path / "termination-log"
    monkeypatch.setattr(termination, "DEFAULT_PATH", str(default))
    termination.write({"result": "ok"}, {})
    assert not default.exists()
    # Mounted (it exists): written there.
    default.write_text("")
    termination.write({"result": "ok"}, {})
    assert json.loads(default.read_text()) == {"result": "ok"}


def test_usage_errors_are_reported_too(builder: Builder) -> None:
    result = builder.run(builder.args(precision="int2"))
    assert result.code == 2
    assert result.termination is not None
    assert result.termination["step"] == "arguments"
    assert "int2" in result.termination["message"]
    assert "usage:" in result.err
