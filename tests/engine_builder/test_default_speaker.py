"""The build's ``speaker`` step (issue 19, item 5): spec.speakers.default's recording and
transcript go through the speaker_prompt tool (a stand-in here: the real one needs upstream's
library and the release's ONNX models), the file is published as ``speakers/default.npz``,
listed with its SHA-256, named in ``layout.defaultSpeaker`` and described under
``speakers.default``; the gate accepts it, and a changed recording reruns the step."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from cosyvoice_engine_builder.manifest import verify_engine_dir
from cosyvoice_engine_builder.request import Variant
from cosyvoice_engine_builder.serving.gate import PodFacts, compare
from tests.engine_builder.conftest import KEY, Builder

TRANSCRIPT = "Hello, I am the voice of this service. $(not a variable)"


def _with_speaker(builder: Builder, audio: bytes = b"RIFF stand-in wav") -> Path:
    wav = builder.pvc_root / "voices" / "narrator" / "take-1.wav"
    wav.parent.mkdir(parents=True, exist_ok=True)
    wav.write_bytes(audio)
    return wav


def _speaker_args() -> dict[str, Any]:
    return {
        "default_speaker_audio": "pvc://voices/narrator/take-1.wav",
        "default_speaker_transcript": TRANSCRIPT,
    }


def test_the_default_speaker_is_built_published_and_listed(builder: Builder) -> None:
    wav = _with_speaker(builder)
    result = builder.build(**_speaker_args())
    assert result.code == 0, result.err
    assert "[step 6/7] speaker: done (" in result.out
    assert f"[step 7/7] publish: published {builder.engine_dir} (" in result.out
    (call,) = [c for c in builder.calls() if c["tool"] == "speaker-prompt"]
    model = builder.pvc_root / "models" / "cosyvoice2"
    assert call["argv"][:6] == [
        "--model-dir",
        str(model),
        "--variant",
        "cosyvoice2",
        "--audio",
        str(wav),
    ]
    assert call["secrets_in_env"] == []

    manifest = builder.manifest()
    assert manifest["layout"]["defaultSpeaker"] == "speakers/default.npz"
    speaker_file = builder.engine_dir / "speakers" / "default.npz"
    written = json.loads(speaker_file.read_text())
    assert written["transcript"] == TRANSCRIPT
    (entry,) = [f for f in manifest["files"] if f["path"] == "speakers/default.npz"]
    assert entry["sha256"] == hashlib.sha256(speaker_file.read_bytes()).hexdigest()
    assert manifest["speakers"] == {
        "default": {
            "file": "speakers/default.npz",
            "audioUri": "pvc://voices/narrator/take-1.wav",
            "audioSha256": hashlib.sha256(wav.read_bytes()).hexdigest(),
            "transcript": TRANSCRIPT,
        }
    }
    assert verify_engine_dir(builder.engine_dir, manifest["key"]).ok


def test_no_speaker_step_without_a_default_speaker(builder: Builder) -> None:
    result = builder.build()
    assert result.code == 0
    assert "speaker" not in builder.tools_called()
    assert "[step 6/6] publish" in result.out
    manifest = builder.manifest()
    assert "defaultSpeaker" not in manifest["layout"] and "speakers" not in manifest


def test_a_missing_recording_fails_for_good_before_any_work(builder: Builder) -> None:
    result = builder.build(**_speaker_args())
    assert result.code == 2
    assert result.termination is not None and result.termination["step"] == "speaker"
    assert "pvc://voices/narrator/take-1.wav" in result.termination["message"]
    assert "claim 'voices'" in result.termination["message"]
    assert builder.tools_called() == []  # before any download or GPU work


def test_a_changed_recording_reruns_only_the_speaker_step(builder: Builder) -> None:
    _with_speaker(builder)
    args: dict[str, Any] = {**_speaker_args(), "work_dir": builder.tmp / "work"}
    builder.env["FAKE_FAIL"] = "speaker-prompt"
    assert builder.build(**args).code == 1
    del builder.env["FAKE_FAIL"]
    _with_speaker(builder, b"RIFF another take")
    builder.reset_calls()
    assert builder.build(**args).code == 0
    assert builder.tools_called() == ["speaker-prompt"]
    assert json.loads((builder.engine_dir / "speakers" / "default.npz").read_text())[
        "audio_bytes"
    ] == len(b"RIFF another take")


def test_the_speaker_flags_go_together(builder: Builder) -> None:
    result = builder.build(default_speaker_audio="pvc://voices/a.wav")
    assert result.code == 2
    assert "go together" in result.err
    result = builder.build(
        default_speaker_audio="s3://voices/a.wav", default_speaker_transcript="Hi."
    )
    assert result.code == 2
    assert "pvc://CLAIM/PATH" in result.err


def test_the_gate_checks_the_default_speakers_file(builder: Builder) -> None:
    _with_speaker(builder)
    assert builder.build(**_speaker_args()).code == 0
    manifest = builder.manifest()

    def mismatches(doc: dict[str, Any]) -> dict[str, str]:
        found = compare(
            doc,
            engine_dir=builder.engine_dir,
            key=KEY,
            variant=Variant.COSYVOICE2,
            facts=PodFacts((), "", None, None),
            llm_groups=None,
            file_problems=[],
        )
        return {m.field: m.detail for m in found}

    assert "default-speaker" not in mismatches(manifest)
    unlisted = {
        **manifest,
        "files": [f for f in manifest["files"] if f["path"] != "speakers/default.npz"],
    }
    assert "not listed" in mismatches(unlisted)["default-speaker"]
    (builder.engine_dir / "speakers" / "default.npz").unlink()
    assert "missing" in mismatches(manifest)["default-speaker"]


def test_an_image_without_the_speaker_tool_fails_in_preflight_for_good(builder: Builder) -> None:
    """The default tool needs upstream's frontend and ONNX Runtime (not in this venv, nor in
    the builder image yet): found out before any download or GPU work, exit 2."""
    _with_speaker(builder)
    env = {k: v for k, v in builder.env.items() if k != "COSYVOICE_SPEAKER_PROMPT"}
    result = builder.run(builder.args(**_speaker_args()), env=env)
    assert result.code == 2, result.out
    assert result.termination is not None and result.termination["step"] == "preflight"
    assert "the default speaker's tool cannot run in this image" in result.termination["message"]
    assert builder.tools_called() == []


def test_the_dry_run_shows_the_speaker_step(builder: Builder) -> None:
    _with_speaker(builder)
    result = builder.run(builder.args(**_speaker_args(), dry_run=True))
    assert result.code == 0, result.err
    model = builder.pvc_root / "models" / "cosyvoice2"
    assert f"[step 6/7] speaker: {builder.env['COSYVOICE_SPEAKER_PROMPT']} --model-dir {model}" in (
        result.out
    )
    assert "[step 7/7] publish" in result.out
    assert builder.tools_called() == [] and not builder.engine_dir.exists()


def test_a_recording_the_tool_refuses_fails_for_good(builder: Builder) -> None:
    """speaker_prompt exits 2 for a file that is not a PCM WAV or is too short or long:
    retrying cannot help, so the build fails with exit 2 and the tool's words."""
    _with_speaker(builder)
    result = builder.build(
        env_extra={"FAKE_FAIL": "speaker-prompt", "FAKE_FAIL_CODE": "2"}, **_speaker_args()
    )
    assert result.code == 2
    assert result.termination is not None and result.termination["step"] == "speaker"
    assert "simulated failure" in result.termination["message"]
