"""token2wav on upstream's library, in-process: a stream served chunk by chunk by two
engines (two instances, the state carried between them) equals upstream's own continuous
streaming synthesis of it, sample for sample, and is as long as the offline synthesis."""

from __future__ import annotations

import json
from pathlib import Path

from twins import debian_python

HERE = Path(__file__).parent


def test_chunks_over_two_instances_equal_upstreams_continuous_synthesis(release: Path) -> None:
    result = json.loads(
        debian_python(str(HERE / "continuity_check.py"), str(release)).splitlines()[-1]
    )
    # 120 tokens, first hop 15, exponential: 15, 25, 50, and the rest finalized.
    assert len(result["chunks"]) == 4
    assert result["chunks"] == result["reference_chunks"]
    assert result["samples"] == result["reference_samples"] == 120 * 960
    assert result["offline_samples"] == result["samples"]
    assert result["peak"] > 0
    assert result["max_abs_difference"] == 0.0
    assert result["built"] == ["flow", "hift"]


def test_the_release_yaml_would_build_more_than_flow_and_hift(release: Path) -> None:
    """The synthetic yaml's LLM cannot be built here (its Qwen2 checkpoint does not exist):
    loading the whole yaml fails there, in upstream's ``Qwen2Encoder``, so the engine's
    success above means it built only flow and HiFT. Any other failure (a missing module, a
    yaml error) fails this test."""
    script = (
        "import json, sys, traceback\n"
        "from hyperpyyaml import load_hyperpyyaml\n"
        "try:\n"
        f"    load_hyperpyyaml(open({str(release / 'cosyvoice2.yaml')!r}).read())\n"
        "except Exception as exc:\n"
        "    frames = traceback.extract_tb(exc.__traceback__)\n"
        "    print(json.dumps({'type': type(exc).__name__, 'message': str(exc),\n"
        "                      'where': [f'{f.filename}:{f.name}' for f in frames]}))\n"
        "else:\n"
        "    print(json.dumps({'type': None}))\n"
    )
    refused = json.loads(debian_python("-c", script).strip().splitlines()[-1])
    assert refused["type"] == "OSError", refused
    assert "/nonexistent/CosyVoice-BlankEN" in refused["message"], refused
    # Raised while building upstream's LLM (cosyvoice/llm/llm.py), from the yaml's llm entry.
    assert any(w.endswith("cosyvoice/llm/llm.py:__init__") for w in refused["where"]), refused
