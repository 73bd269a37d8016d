"""Stand-in for convert_checkpoint.py, quantize.py, trtllm-build, trtexec, nvidia-smi and the
speaker_prompt tool.

The tests write tiny wrappers that call :func:`main` with the tool's name. Each call is
appended to ``$CALL_LOG`` as one JSON line; outputs are created where the real tool would
put them. Behaviour switches, all through the environment:

- ``FAKE_FAIL=<tool>``: print ``FAKE_STDERR_LINES`` lines to stderr and exit 3 (or
  ``FAKE_FAIL_CODE``)
  (only calls with an argument containing ``FAKE_FAIL_ARG``, when that is set)
- ``FAKE_LEAK``: a string printed to stderr by a failing tool (a leaked secret)
- ``FAKE_NO_OUTPUT=<tool>``: exit 0 without producing anything
- ``FAKE_SLEEP=<tool>:<seconds>``: sleep first (writes its pid to ``$FAKE_PID_FILE``)
- ``FAKE_COMPUTE_CAP``: what the nvidia-smi stand-in reports
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# Mirrors cosyvoice_engine_builder.redaction.SECRET_ENV_VARS (checked by test_redaction), so
# that this stand-in, which runs as a separate script, imports nothing of the builder.
SECRET_NAMES = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)


def _opt(argv: list[str], name: str) -> str:
    for i, arg in enumerate(argv):
        if arg == name:
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise SystemExit(f"stand-in: missing {name} in {argv}")


def main(tool: str) -> None:
    argv = sys.argv[1:]
    with open(os.environ["CALL_LOG"], "a", encoding="utf-8") as log:
        record = {
            "tool": tool,
            "argv": argv,
            "hf_token_in_env": "HF_TOKEN" in os.environ,
            "secrets_in_env": sorted(k for k in SECRET_NAMES if k in os.environ),
        }
        log.write(json.dumps(record) + "\n")

    sleep = os.environ.get("FAKE_SLEEP", "")
    if sleep.startswith(tool + ":"):
        Path(os.environ["FAKE_PID_FILE"]).write_text(str(os.getpid()))
        time.sleep(float(sleep.split(":", 1)[1]))

    fail_arg = os.environ.get("FAKE_FAIL_ARG", "")
    if os.environ.get("FAKE_FAIL") == tool and any(fail_arg in a for a in argv):
        print(f"{tool}: starting", flush=True)
        for i in range(int(os.environ.get("FAKE_STDERR_LINES", "30"))):
            print(
                f"{tool} error line {i} " + os.environ.get("FAKE_STDERR_PAD", ""), file=sys.stderr
            )
        if os.environ.get("FAKE_LEAK"):
            print(f"auth header: Bearer {os.environ['FAKE_LEAK']}", file=sys.stderr)
        print(f"{tool}: fatal: simulated failure", file=sys.stderr)
        raise SystemExit(int(os.environ.get("FAKE_FAIL_CODE", "3")))
    if os.environ.get("FAKE_NO_OUTPUT") == tool:
        return

    if tool == "nvidia-smi":
        print(os.environ.get("FAKE_COMPUTE_CAP", "9.0"))
    elif tool in ("convert", "quantize"):
        out = Path(_opt(argv, "--output_dir"))
        out.mkdir(parents=True, exist_ok=True)
        tp = int(_opt(argv, "--tp_size"))
        (out / "config.json").write_text(json.dumps({"tp": tp, "tool": tool, "argv": argv}))
        for rank in range(tp):
            (out / f"rank{rank}.safetensors").write_bytes(f"weights {rank} {argv}".encode())
    elif tool == "trtllm-build":
        ckpt = Path(_opt(argv, "--checkpoint_dir"))
        tp = json.loads((ckpt / "config.json").read_text())["tp"]
        out = Path(_opt(argv, "--output_dir"))
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({"built_from": str(ckpt), "argv": argv}))
        for rank in range(tp):
            (out / f"rank{rank}.engine").write_bytes(f"engine {rank} {argv}".encode() * 10)
    elif tool == "trtexec":
        onnx = Path(_opt(argv, "--onnx"))
        plan = Path(_opt(argv, "--saveEngine"))
        plan.write_bytes(b"plan for " + onnx.read_bytes())
    elif tool == "speaker-prompt":
        # --model-dir --variant --audio --transcript-file --out: a file naming its inputs.
        out = Path(_opt(argv, "--out"))
        out.parent.mkdir(parents=True, exist_ok=True)
        text = Path(_opt(argv, "--transcript-file")).read_text(encoding="utf-8")
        audio = Path(_opt(argv, "--audio")).read_bytes()
        out.write_text(json.dumps({"transcript": text, "audio_bytes": len(audio), "argv": argv}))
    elif tool == "aws":
        # aws s3 sync s3://bucket/prefix/ DEST --no-progress
        dest = Path(argv[3])
        (dest / "llm").mkdir(parents=True, exist_ok=True)
        (dest / "llm" / "config.json").write_text("{}")
        (dest / "flow.decoder.estimator.fp32.onnx").write_bytes(b"onnx")
        (dest / "campplus.onnx").write_bytes(b"onnx")
        (dest / "llm" / "tokenizer.json").write_text("{}")
        for name in ("cosyvoice2.yaml", "flow.pt", "hift.pt", "speech_tokenizer_v2.onnx"):
            (dest / name).write_bytes(b"stand-in")
    else:
        raise SystemExit(f"stand-in: unknown tool {tool}")
