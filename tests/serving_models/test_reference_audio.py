"""The pure pieces of the reference-audio models (``audio_tokenizer``, ``speaker_embedding``):
which tokenizer a release's directory names, the tokenizer's size read from its weights, and
where the engine's prebuilt speaker-embedding plan is. The models themselves run in the CPU
twins with upstream's library (``serving-models/tests/test_twin*.py``, in ``make test``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cosyvoice_serving_models import speaker_embedding, speech_tokenizer


@pytest.mark.parametrize("variant", ["cosyvoice2", "cosyvoice3"])
def test_the_release_yaml_names_the_variant_and_so_its_tokenizer(
    tmp_path: Path, variant: str
) -> None:
    (tmp_path / f"{variant}.yaml").write_text("sample_rate: 24000\n")
    assert speech_tokenizer.release_variant(tmp_path) == variant
    assert speech_tokenizer.SPEECH_TOKENIZER[variant] == f"speech_tokenizer_v{variant[-1]}.onnx"


def test_a_directory_with_no_yaml_or_both_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="found none"):
        speech_tokenizer.release_variant(tmp_path)
    (tmp_path / "cosyvoice2.yaml").write_text("")
    (tmp_path / "cosyvoice3.yaml").write_text("")
    with pytest.raises(ValueError, match="exactly one"):
        speech_tokenizer.release_variant(tmp_path)


def test_the_tokenizer_size_comes_from_its_weights() -> None:
    def weights(width: int, blocks: int) -> dict[str, np.ndarray[Any, Any]]:
        found = {"encoder.conv1.weight": np.zeros((width, 128, 3), dtype=np.float32)}
        for block in range(blocks):
            for part in ("attn.query.weight", "mlp.0.bias", "attn_ln.weight"):
                found[f"encoder.blocks.{block}.{part}"] = np.zeros(1, dtype=np.float32)
        return found

    # The released v2 and v3 tokenizers: s3tokenizer's defaults.
    released = speech_tokenizer.dimensions(weights(1280, 6))
    assert (released.mels, released.width, released.blocks) == (128, 1280, 6)
    assert speech_tokenizer.dimensions(weights(1280, 12)).blocks == 12
    assert speech_tokenizer.dimensions(weights(128, 2)).width == 128
    with pytest.raises(ValueError, match="multiple of 64"):
        speech_tokenizer.dimensions(weights(100, 2))


def test_the_prebuilt_plan_is_the_manifests_under_plans_dir(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        json.dumps({"layout": {"speakerEmbeddingPlan": "plans/campplus.fp32.sm90.trt10.plan"}})
    )
    plan = speaker_embedding.prebuilt_plan(str(manifest), "/engines/k/plans")
    assert plan == "/engines/k/plans/campplus.fp32.sm90.trt10.plan"
    manifest.write_text(json.dumps({"layout": {}}))
    assert speaker_embedding.prebuilt_plan(str(manifest), "/p") == ""
    assert speaker_embedding.prebuilt_plan(str(tmp_path / "absent.json"), "/p") == ""
