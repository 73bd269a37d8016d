"""spec.speakers.default (issue 19, item 5): read and refused by the spec, and in the engine
key only while set."""

from __future__ import annotations

import pytest

from cosyvoice_operator.api import engine_identity, spec
from cosyvoice_operator.api.spec import SpecError
from tests.unit.objects import raw_spec, service


def test_a_default_speaker_is_read_and_absent_by_default() -> None:
    assert spec.parse(raw_spec()).speakers.default is None
    assert spec.parse(raw_spec(speakers={})).speakers.default is None
    read = spec.parse(
        raw_spec(speakers={"default": {"audioUri": "pvc://voices/a/b.wav", "transcript": "Hi."}})
    ).speakers.default
    assert read == spec.DefaultSpeaker("pvc://voices/a/b.wav", "Hi.")
    assert read is not None and read.pvc_claim == "voices"


@pytest.mark.parametrize(
    ("default", "field"),
    [
        ({"audioUri": "s3://voices/a.wav", "transcript": "Hi."}, "audioUri"),
        ({"audioUri": "pvc://voices", "transcript": "Hi."}, "audioUri"),
        ({"audioUri": "pvc://voices/../a.wav", "transcript": "Hi."}, "audioUri"),
        ({"audioUri": "pvc://voices/$(X).wav", "transcript": "Hi."}, "audioUri"),
        ({"audioUri": "pvc://voices/a.wav", "transcript": ""}, "transcript"),
        ({"audioUri": "pvc://voices/a.wav", "transcript": "   "}, "transcript"),
        ({"audioUri": "pvc://voices/a.wav", "transcript": "two\nlines"}, "transcript"),
        ({"audioUri": "pvc://voices/a.wav", "transcript": "x" * 2001}, "transcript"),
    ],
)
def test_a_bad_default_speaker_is_refused_naming_the_field(
    default: dict[str, str], field: str
) -> None:
    with pytest.raises(SpecError) as info:
        spec.parse(raw_spec(speakers={"default": default}))
    assert info.value.field == f"spec.speakers.default.{field}"


def test_a_default_speaker_enters_the_key_only_while_set() -> None:
    """Absent, the key is the one every engine had before spec.speakers existed; set, its
    audio path and transcript each make another engine (the prompt file is in its dir)."""
    plain = engine_identity.identity(service(), "sm_90", "img:1")
    assert "speaker_audio_uri" not in plain.canonical()
    assert engine_identity.identity(service(speakers={}), "sm_90", "img:1").key == plain.key
    keys = {
        engine_identity.identity(
            service(speakers={"default": {"audioUri": uri, "transcript": text}}), "sm_90", "img:1"
        ).key
        for uri, text in [
            ("pvc://v/a.wav", "Hi."),
            ("pvc://v/b.wav", "Hi."),
            ("pvc://v/a.wav", "Yo."),
        ]
    }
    assert len(keys) == 3 and plain.key not in keys
    ident = engine_identity.identity(
        service(speakers={"default": {"audioUri": "pvc://v/a.wav", "transcript": "Hi."}}),
        "sm_90",
        "img:1",
    )
    data = engine_identity.identity_to_dict(ident)
    assert data["speakerAudioUri"] == "pvc://v/a.wav" and data["speakerTranscript"] == "Hi."
    assert engine_identity.identity_from_dict(data) == ident
