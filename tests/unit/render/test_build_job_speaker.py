"""spec.speakers.default in the build Job (issue 19, item 5): the builder's flags, the
speaker's claim, the golden file."""

from __future__ import annotations

from cosyvoice_operator.api import engine_identity
from cosyvoice_operator.api.engine_identity import EngineTarget
from cosyvoice_operator.render import build_job
from cosyvoice_operator.render.build_job import BuildSettings, render_job
from tests.unit.objects import CACHE, service
from tests.unit.render.test_build_job import (
    _assert_golden,
    _container,
    _flag,
    _mounts,
    _pod_spec,
    _render,
    _volumes,
    builder_module,
)


def test_build_job_with_a_default_speaker_golden() -> None:
    """The speaker's flags and its claim's mount (issue 19, item 5)."""
    svc = service(
        model={"variant": "cosyvoice2", "uri": "hf://FunAudioLLM/CosyVoice2-0.5B"},
        speakers={"default": {"audioUri": "pvc://voices/narrator.wav", "transcript": "Hello."}},
    )
    ident = engine_identity.identity(svc, "sm_90", BuildSettings().default_builder_image)
    target = EngineTarget(ident, ("NVIDIA-H100-80GB-HBM3",))
    _assert_golden(
        "build-job-speaker.yaml", render_job(target, svc, "ml", 1, BuildSettings(), CACHE)
    )


SPEAKER = {
    "default": {"audioUri": "pvc://voices/narrator/take-2.wav", "transcript": "Hello $(HOME), $$5."}
}


def test_a_default_speaker_reaches_the_builder_and_its_claim_is_mounted() -> None:
    job = _render(service(speakers=SPEAKER))
    args = _container(job)["args"]
    assert _flag(args, "--default-speaker-audio") == "pvc://voices/narrator/take-2.wav"
    # The kubelet expands $(HOME) and reduces $$ to $: every $ doubled reads back as written.
    assert _flag(args, "--default-speaker-transcript") == "Hello $$(HOME), $$$$5."
    mount = _mounts(job)["/models/voices"]
    assert mount["readOnly"] is True
    assert _volumes(job)[mount["name"]]["persistentVolumeClaim"] == {
        "claimName": "voices",
        "readOnly": True,
    }


def test_a_speaker_on_the_model_claim_mounts_it_once() -> None:
    speakers = {"default": {"audioUri": "pvc://model-store/voice.wav", "transcript": "Hi."}}
    job = _render(service(model={"uri": "pvc://model-store/cv3"}, speakers=speakers))
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in _pod_spec(job)["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["cosyvoice-engines", "model-store"]


def test_no_speaker_flags_without_a_default_speaker() -> None:
    args = _container(_render(service()))["args"]
    assert not any(a.startswith("--default-speaker") for a in args)


def test_builder_cli_accepts_the_speaker_args() -> None:
    ident = engine_identity.identity(service(speakers=SPEAKER), "sm_90", "img:1")
    args = builder_module("cli").build_parser().parse_args(build_job.builder_args(ident))
    assert args.default_speaker_audio == "pvc://voices/narrator/take-2.wav"
    assert args.default_speaker_transcript == "Hello $$(HOME), $$$$5."
