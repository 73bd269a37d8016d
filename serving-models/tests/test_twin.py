"""The project's model code in the real tritonserver (pytriton's, CPU), with upstream's
library on a tiny synthetic release: the operator's rendered CosyVoice2 repository with our
``cosyvoice2`` orchestrator, ``token2wav``, ``audio_tokenizer`` (``s3tokenizer``) and
``speaker_embedding`` (Kaldi fbank, ONNX Runtime); ``tensorrt_llm`` stays the CPU twin's
stand-in (no TensorRT-LLM on this machine). The server is ``conftest.cosyvoice2_twin``
(shared with ``test_default_speaker``).

Two things differ from what the operator renders, both named there: the twin's one transform
(KIND_GPU -> KIND_CPU, ``cpu_twin.to_cpu``) and the paths (``model_dir``,
``llm_tokenizer_dir`` and ``default_speaker`` point at the synthetic release and the
speaker's file, which the serving entrypoint's model view would hold).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from twins import FIRST_CHUNK_TOKENS, CosyVoice2Twin, debian_python, infer, stream


def test_streams_complete_with_the_chunk_schedule_rendered(cosyvoice2_twin: CosyVoice2Twin) -> None:
    from cosyvoice_serving_models.chunking import Chunking

    targets = ["Hello there, this is a test.", "A second stream, a little longer than one."]
    chunks = stream(cosyvoice2_twin.server, targets, "cosyvoice2")
    for target in targets:
        # The LLM stand-in answers a count of tokens that grows with the prompt's length;
        # the chunk sizes tell the schedule: firstChunkTokens, then 25 x 2^k, then the rest.
        sizes = [len(c) for c in chunks[target]]
        total = sum(sizes) // 960
        assert sum(sizes) == total * 960, sizes
        expected = Chunking(first=FIRST_CHUNK_TOKENS).schedule(total)
        assert sizes[0] == FIRST_CHUNK_TOKENS * 960 - 3840, sizes  # 160 ms held for the fade
        assert len(sizes) == len(expected), (sizes, expected)
        # (every chunk finite and non-zero: checked by twins.streams)


def test_each_instance_runs_on_the_device_triton_gave_it(cosyvoice2_twin: CosyVoice2Twin) -> None:
    records = cosyvoice2_twin.device_records
    entries = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
    for model in ("token2wav", "audio_tokenizer", "speaker_embedding"):
        instances = [e for e in entries if e["instance"].startswith(model)]
        assert len(instances) == 2, (model, entries)  # instancesPerGpu 2
        assert len({e["pid"] for e in instances}) == 2
        for entry in instances:
            assert entry["kind"] == "CPU" and entry["device"] == "cpu", entry


def test_the_orchestrator_reports_its_active_streams(cosyvoice2_twin: CosyVoice2Twin) -> None:
    """After the streams, every instance's gauge reads 0. An instance sets it back to 0 when
    its ``execute`` returns, just after it sent the stream's final response (a drain waits
    that long more): the client may see the final response first, so the gauges are read
    until they are all 0, for 10 s at most."""
    deadline = time.monotonic() + 10
    while True:
        metrics = cosyvoice2_twin.server.metrics().splitlines()
        lines = [line for line in metrics if line.startswith("cosyvoice_active_streams")]
        if all(line.endswith(" 0") for line in lines) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(lines) == 4, lines  # one gauge per orchestrator instance (maxBatchSize 2 -> 4)
    assert all(line.endswith(" 0") for line in lines), lines  # no stream left behind


def test_the_reference_models_answer_what_upstreams_computation_gives(
    cosyvoice2_twin: CosyVoice2Twin, tmp_path: Path
) -> None:
    """Our ``audio_tokenizer`` and ``speaker_embedding`` in tritonserver, on the reference
    every stream sends, against ``reference_check.py``: the tokenizer built from the generated
    weights directly (not read back from the ONNX file) and run as upstream's model runs it,
    and the embedding from upstream's fbank and the tiny network in NumPy. A reference cut by
    ``reference_wav_len`` is tokenized as the cut waveform."""
    triton_server = cosyvoice2_twin.server
    wav = np.sin(np.arange(16000 * 2, dtype=np.float32) / 7.0).reshape(1, -1)
    cut = 16000 + 4000
    expected = {}
    for length in (wav.shape[1], cut):
        np.save(tmp_path / "wav.npy", wav[:, :length])
        line = debian_python(
            str(Path(__file__).parent / "reference_check.py"), str(tmp_path / "wav.npy")
        )
        expected[length] = json.loads(line.splitlines()[-1])
    for length in (wav.shape[1], cut):
        tokens = infer(
            triton_server,
            "audio_tokenizer",
            {"reference_wav": wav, "reference_wav_len": np.array([[length]], dtype=np.int32)},
            "prompt_speech_tokens",
        )
        assert tokens.dtype == np.int32 and tokens.shape[0] == 1
        assert tokens.reshape(-1).tolist() == expected[length]["tokens"]
        assert len(expected[length]["tokens"]) == -(-length // 640)  # 25 tokens a second
    embedding = infer(
        triton_server, "speaker_embedding", {"reference_wav": wav}, "prompt_spk_embedding"
    )
    assert embedding.dtype == np.float16 and embedding.shape == (1, 192)
    want = np.array(expected[wav.shape[1]]["embedding"], dtype=np.float32)
    assert np.abs(want).max() > 0.01
    np.testing.assert_allclose(embedding.reshape(-1).astype(np.float32), want, atol=2e-3, rtol=2e-3)
    # A bad length is that request's error, and the instance serves on.
    from tritonclient.utils import InferenceServerException

    bad = {"reference_wav": wav, "reference_wav_len": np.array([[0]], dtype=np.int32)}
    with pytest.raises(InferenceServerException, match=r"outside 1\.\.32000"):
        infer(triton_server, "audio_tokenizer", bad, "prompt_speech_tokens")
    again = {"reference_wav": wav, "reference_wav_len": np.array([[cut]], dtype=np.int32)}
    tokens = infer(triton_server, "audio_tokenizer", again, "prompt_speech_tokens")
    assert tokens.reshape(-1).tolist() == expected[cut]["tokens"]
