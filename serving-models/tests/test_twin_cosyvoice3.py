"""Our ``cosyvoice3`` orchestrator in the real tritonserver: the operator's rendered
CosyVoice3 repository for a pod of two LLM groups (``gpusPerReplica: 2``), with our
``audio_tokenizer`` (on a tiny ``speech_tokenizer_v3.onnx``), ``speaker_embedding``,
``token2wav`` and ``vocoder`` (on fakes of the two networks: the PyPI packages hold no
CosyVoice3 flow, README), and the twin's stand-ins for the two trtllm-serve processes
(``cpu_twin.LlmStandIn``: OpenAI chat completions, streamed). The server is
``conftest.cosyvoice3_twin`` (shared with ``test_default_speaker_cosyvoice3`` and
``test_cosyvoice3_audio``).

What the twin changes, named there: KIND_GPU -> KIND_CPU (``cpu_twin.to_cpu``); the LLM URLs
point at the stand-ins' free ports; ``model_dir`` / ``llm_tokenizer_dir`` at a model directory
holding a ``cosyvoice3.yaml`` whose flow and hift are ``cv3_fakes``' (with the tiny release's
``feat_extractor``) and their checkpoints, the tiny release's tokenizer and
``campplus.onnx``, and a tiny ``speech_tokenizer_v3.onnx`` (``tiny_onnx``);
``default_speaker`` at the speaker's file.
"""

from __future__ import annotations

import json
from pathlib import Path

from twins import CosyVoice3Twin, debian_python, infer, stream


def test_each_stream_goes_to_the_least_loaded_llm_group(cosyvoice3_twin: CosyVoice3Twin) -> None:
    """The counts are shared by every orchestrator process through one file: load a group
    there (as streams in flight on other instances would) and the next stream goes to the
    other one, both ways. No timing involved."""
    from cosyvoice_serving_models.llm_groups import LeastLoaded

    llm = cosyvoice3_twin.llm
    urls = [llm.remap[u] for u in llm.urls]
    groups = LeastLoaded(urls, str(cosyvoice3_twin.repo / "cosyvoice3"))
    served = []
    for busy in ([0, 5], [5, 0], [5, 0]):
        Path(groups.path).write_text(json.dumps(busy))
        before = llm.requests_per_server()
        target = "Stream to the least loaded group, please."
        chunks = stream(cosyvoice3_twin.server, [target], "cosyvoice3")
        assert sum(len(c) for c in chunks[target]) > 0
        after = llm.requests_per_server()
        served.append([b - a for a, b in zip(before, after, strict=True)])
        assert groups.counts() == busy  # the stream gave its slot back
    assert served == [[1, 0], [0, 1], [0, 1]]
    Path(groups.path).write_text(json.dumps([0, 0]))


def test_the_speech_tokenizer_is_the_releases_v3(
    cosyvoice3_twin: CosyVoice3Twin, tmp_path: Path
) -> None:
    """Our ``audio_tokenizer`` in the CosyVoice3 repository reads ``speech_tokenizer_v3.onnx``
    (the release's yaml says cosyvoice3) through ``s3tokenizer``'s v3 converter: its tokens
    are those of the generated v3 weights run as upstream's model runs them."""
    import numpy as np

    wav = np.sin(np.arange(16000 * 2, dtype=np.float32) / 7.0).reshape(1, -1)
    np.save(tmp_path / "wav.npy", wav)
    check = Path(__file__).parent / "reference_check.py"
    v2, v3 = (
        json.loads(debian_python(str(check), str(tmp_path / "wav.npy"), version).splitlines()[-1])
        for version in ("v2", "v3")
    )
    length = np.array([[wav.shape[1]]], dtype=np.int32)
    tokens = infer(
        cosyvoice3_twin.server,
        "audio_tokenizer",
        {"reference_wav": wav, "reference_wav_len": length},
        "prompt_speech_tokens",
    )
    assert tokens.reshape(-1).tolist() == v3["tokens"] != v2["tokens"]
