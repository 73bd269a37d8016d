"""The ``speaker`` step: the default speaker's prompt features (issue 19, item 5).

With ``--default-speaker-audio pvc://CLAIM/PATH --default-speaker-transcript TEXT`` the
build runs, after the plans, the serving models' ``speaker_prompt`` tool on the release it
fetched: the recording's speech tokens, speaker embedding and prompt mel, computed by the
serving pod's own code for a reference recording, into one NumPy file that is published as
``speakers/default.npz`` of the engine directory. The manifest lists it with its SHA-256
like every file, names it in ``layout.defaultSpeaker``, and records where it came from under
``speakers.default`` (the audio's URI and SHA-256, the transcript). The serving pods' gate
checks it, and the orchestrator reads it for requests without reference audio.

``COSYVOICE_SPEAKER_PROMPT`` replaces the tool's command (default:
``$TRTLLM_PYTHON -m cosyvoice_serving_models.speaker_prompt``). The builder image ships the
tool and what it imports (``engine-builder/Dockerfile``: the package copied from
``serving-models/``, torchaudio built at the serving image's commit, ``s3tokenizer`` and
ONNX Runtime at exact versions; ``tests/engine_builder/test_builder_image.py`` keeps that
list and ``_IMPORTS`` in step with the tool's imports).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cosyvoice_engine_builder.manifest import sha256_file
from cosyvoice_engine_builder.request import BuildRequest
from cosyvoice_engine_builder.runner import Command, CommandFailed, Runner
from cosyvoice_engine_builder.steps import params_digest
from cosyvoice_engine_builder.toolchain import ToolchainError, require_executable

# The engine directory's speaker file (the operator renders the same path: render/triton.py).
DEFAULT_SPEAKER = "speakers/default.npz"
TOOL_MODULE = "cosyvoice_serving_models.speaker_prompt"


class SpeakerAudioMissing(Exception):
    """The recording is not where the request says (a permanent failure)."""


# What the default tool imports beyond the standard library, NumPy and PyTorch: the serving
# models' package and the libraries of the audio_tokenizer and speaker_embedding models it
# computes with (most of them only when it runs, hence the import here). The builder image
# installs each (engine-builder/Dockerfile).
_IMPORTS = (TOOL_MODULE, "s3tokenizer", "onnxruntime", "torchaudio")


def require_tool(
    runner: Runner, python: str, environ: Mapping[str, str], tool_env: Mapping[str, str]
) -> None:
    """In preflight, before any GPU work: the tool runs in this image (ToolchainError if not).

    The builder image has these modules (its build imports them); this catches another image
    set as the builder, or a ``TRTLLM_PYTHON`` that is not the image's Python, before the
    download and the engine builds rather than after."""
    prefix = environ.get("COSYVOICE_SPEAKER_PROMPT")
    if prefix:
        require_executable(shlex.split(prefix)[0], "COSYVOICE_SPEAKER_PROMPT", environ)
        return
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in _IMPORTS)
    try:
        runner.run(Command((python, "-c", code), env=tool_env, timeout=300), echo_output=False)
    except CommandFailed as exc:
        last = (exc.tail() or [str(exc)])[-1]
        raise ToolchainError(
            f"the default speaker's tool cannot run in this image ({last}): it needs "
            f"{', '.join(_IMPORTS)} for {python} (or set COSYVOICE_SPEAKER_PROMPT)"
        ) from exc


def audio_path(request: BuildRequest) -> Path:
    speaker = request.default_speaker
    assert speaker is not None
    return request.pvc_root / speaker.audio.authority / speaker.audio.path


def check_audio(request: BuildRequest) -> Path:
    path = audio_path(request)
    if not path.is_file():
        speaker = request.default_speaker
        assert speaker is not None
        raise SpeakerAudioMissing(
            f"--default-speaker-audio {speaker.audio.uri}: {path} is not a file; is the claim "
            f"{speaker.audio.authority!r} mounted at {request.pvc_root / speaker.audio.authority}?"
        )
    return path


def tool_argv(
    environ: Mapping[str, str], python: str, model_root: Path, request: BuildRequest, work: Path
) -> tuple[str, ...]:
    prefix = environ.get("COSYVOICE_SPEAKER_PROMPT")
    command = tuple(shlex.split(prefix)) if prefix else (python, "-m", TOOL_MODULE)
    return (
        *command,
        "--model-dir",
        str(model_root),
        "--variant",
        request.variant.value,
        "--audio",
        str(audio_path(request)),
        "--transcript-file",
        str(transcript_file(work)),
        "--out",
        str(output(work)),
    )


def transcript_file(work: Path) -> Path:
    return work / "speaker" / "transcript.txt"


def output(work: Path) -> Path:
    return work / "speaker" / "default.npz"


def digest(after: str, argv: tuple[str, ...], audio_sha256: str, transcript: str) -> str:
    """Reruns when the release, the command, the recording's bytes or the text changed."""
    return params_digest(
        {"after": after, "argv": list(argv), "audio": audio_sha256, "transcript": transcript}
    )


def manifest_fields(request: BuildRequest, audio_sha256: str) -> dict[str, Any]:
    speaker = request.default_speaker
    assert speaker is not None
    return {
        "default": {
            "file": DEFAULT_SPEAKER,
            "audioUri": speaker.audio.uri,
            "audioSha256": audio_sha256,
            "transcript": speaker.transcript,
        }
    }


def audio_digest(request: BuildRequest) -> str:
    return sha256_file(check_audio(request))
