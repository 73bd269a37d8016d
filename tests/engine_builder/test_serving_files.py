"""The model files the serving pods open (issue 19, items 5 and 8; serving audit B2, D6): the
builder refuses a release without them, records upstream's speaker table when the release has
one, and the start-up gate refuses an engine whose model directory lacks one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cosyvoice_engine_builder.layout import (
    SPEAKER_INFO,
    LayoutError,
    resolve_layout,
    serving_files,
)
from cosyvoice_engine_builder.request import Variant
from cosyvoice_engine_builder.serving.gate import PodFacts, compare
from tests.engine_builder.conftest import KEY, Builder, make_model


@pytest.mark.parametrize("variant", list(Variant))
def test_the_files_each_variant_serves_from(variant: Variant) -> None:
    v = variant.value[-1]
    assert serving_files(variant, "llm") == (
        "llm/tokenizer.json",
        f"{variant.value}.yaml",
        "flow.pt",
        "hift.pt",
        f"speech_tokenizer_v{v}.onnx",
    )
    assert serving_files(variant, "")[0] == "tokenizer.json"  # an LLM at the model's root


@pytest.mark.parametrize("variant", ["cosyvoice2", "cosyvoice3"])
@pytest.mark.parametrize("missing", ["llm/tokenizer.json", "hift.pt", "speech_tokenizer_v*.onnx"])
def test_a_release_without_a_served_file_is_refused(
    tmp_path: Path, variant: str, missing: str
) -> None:
    name = missing.replace("v*", f"v{variant[-1]}")
    root = make_model(tmp_path / "model", variant, omit=[name])
    with pytest.raises(LayoutError, match=f"serving pods open {re.escape(name)}"):
        resolve_layout(root, Variant(variant))


def test_yaml_named_after_the_variant_is_required(tmp_path: Path) -> None:
    root = make_model(tmp_path / "model", "cosyvoice2", omit=["cosyvoice2.yaml"])
    with pytest.raises(LayoutError, match=r"cosyvoice2\.yaml"):
        resolve_layout(root, Variant.COSYVOICE2)


def _manifest(builder: Builder) -> dict[str, object]:
    return dict(json.loads((builder.engine_dir / "manifest.json").read_text()))


def test_the_speaker_table_is_kept_and_recorded_when_the_release_has_it(builder: Builder) -> None:
    (builder.pvc_root / "models" / "cosyvoice2" / SPEAKER_INFO).write_bytes(b"speakers")
    assert builder.build().code == 0
    manifest = _manifest(builder)
    layout = manifest["layout"]
    assert isinstance(layout, dict) and layout["speakerInfo"] == f"model/{SPEAKER_INFO}"
    assert (builder.engine_dir / "model" / SPEAKER_INFO).read_bytes() == b"speakers"


def test_without_a_speaker_table_the_engine_builds_and_says_none(builder: Builder) -> None:
    assert builder.build().code == 0
    layout = _manifest(builder)["layout"]
    assert isinstance(layout, dict) and "speakerInfo" not in layout


def _facts() -> PodFacts:
    return PodFacts((), "", None, None)


def test_the_gate_names_a_served_file_the_engine_lacks(builder: Builder) -> None:
    assert builder.build().code == 0
    manifest = _manifest(builder)

    def kinds() -> dict[str, str]:
        found = compare(
            manifest,
            engine_dir=builder.engine_dir,
            key=KEY,
            variant=Variant.COSYVOICE2,
            facts=_facts(),
            llm_groups=None,
            file_problems=[],
        )
        return {m.field: m.detail for m in found}

    assert "model-files" not in kinds()
    (builder.engine_dir / "model" / "hift.pt").unlink()
    (builder.engine_dir / "model" / "llm" / "tokenizer.json").unlink()
    detail = kinds()["model-files"]
    assert "llm/tokenizer.json, hift.pt" in detail and "serving models open" in detail
