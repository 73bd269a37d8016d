"""The command runner: tails, timeouts, redaction, missing programs."""

from __future__ import annotations

import sys
import time

import pytest

from cosyvoice_engine_builder.redaction import Redactor
from cosyvoice_engine_builder.runner import Command, CommandFailed, Runner


def _runner(lines: list[str], secrets: tuple[str, ...] = ()) -> Runner:
    return Runner(redactor=Redactor(secrets), echo=lines.append, heartbeat_seconds=0.3)


def _py(code: str, **kwargs: float) -> Command:
    return Command((sys.executable, "-c", code), **kwargs)  # type: ignore[arg-type]


def test_output_is_streamed_and_tails_are_kept() -> None:
    echoed: list[str] = []
    result = _runner(echoed).run(
        _py("import sys\nfor i in range(300): print(i)\nprint('err', file=sys.stderr)")
    )
    assert result.returncode == 0
    assert len(result.stdout_tail) == 200 and result.stdout_tail[-1] == "299"
    assert result.stderr_tail == ("err",)
    assert "  | 0" in echoed and "  | err" in echoed


def test_failure_tail_falls_back_to_stdout_when_stderr_is_empty() -> None:
    with pytest.raises(CommandFailed) as info:
        _runner([]).run(_py("print('[TRT-LLM] [E] boom'); raise SystemExit(5)"))
    assert info.value.reason == "exited with code 5"
    assert info.value.tail() == ("[TRT-LLM] [E] boom",)


def test_timeout_kills_the_process_group() -> None:
    started = time.monotonic()
    with pytest.raises(CommandFailed) as info:
        _runner([]).run(_py("import time; time.sleep(30)", timeout=0.5))
    assert "timed out" in info.value.reason
    assert time.monotonic() - started < 15


def test_a_missing_program_fails_clearly() -> None:
    with pytest.raises(CommandFailed) as info:
        _runner([]).run(Command(("/no/such/trtexec", "--onnx=x")))
    assert str(info.value).startswith("trtexec: could not start")


def test_echoed_and_captured_lines_are_redacted() -> None:
    echoed: list[str] = []
    with pytest.raises(CommandFailed) as info:
        _runner(echoed, ("s3cr3t-value",)).run(
            _py("import sys; print('key=s3cr3t-value', file=sys.stderr); sys.exit(1)")
        )
    assert info.value.tail() == ("key=***",)
    assert echoed == ["  | key=***"]


def test_heartbeat_when_a_tool_is_quiet() -> None:
    beats: list[float] = []
    _runner([]).run(_py("import time; time.sleep(1.2)"), heartbeat=beats.append)
    assert beats and all(b > 0 for b in beats)


def test_tool_name_for_interpreted_scripts() -> None:
    cmd = Command(("python3", "/opt/x/convert_checkpoint.py", "--model_dir", "m"))
    assert cmd.tool == "convert_checkpoint.py"
    assert Command(("python3", "-c", "pass")).tool == "python3"
