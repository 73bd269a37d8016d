"""The default speaker (issue 19, item 5) end to end on the CPU, with upstream's library and
the tiny synthetic release: the engine builder's tool (``speaker_prompt``) turns a WAV and its
transcript into the speaker file, and the real tritonserver (pytriton's) serves the operator's
rendered CosyVoice2 repository with our ``cosyvoice2``, ``token2wav``, ``audio_tokenizer`` and
``speaker_embedding`` and ``default_speaker`` pointing at that file (``tensorrt_llm`` is the
CPU twin's stand-in): ``conftest.cosyvoice2_twin``, shared with ``test_twin``.

Two things are checked. The file holds what the pod itself computes for a request that sends
the same recording: the ``audio_tokenizer`` and ``speaker_embedding`` models' answers and the
orchestrator's prompt mel. And a request without reference audio speaks with it: the
``tensorrt_llm`` stand-in answers 3 speech tokens per text token of its prompt (the speaker's
transcript + the target text), so that request yields exactly the audio length of one that
sends the recording with the transcript as its reference text, and more than one whose
reference text is empty.
"""

from __future__ import annotations

import numpy as np
from twins import (
    SAMPLES_PER_TOKEN,
    TARGET,
    TRANSCRIPT,
    CosyVoice2Twin,
    infer,
    request,
    samples,
)


def test_the_speaker_file_holds_what_the_pod_computes_for_that_recording(
    cosyvoice2_twin: CosyVoice2Twin,
) -> None:
    from cosyvoice_serving_models import features, speakers

    server, path, wav = cosyvoice2_twin.server, cosyvoice2_twin.speaker, cosyvoice2_twin.recording
    prompt = speakers.load_prompt(path)
    assert prompt.text == TRANSCRIPT
    reference = {
        "reference_wav": wav.reshape(1, -1),
        "reference_wav_len": np.array([[wav.size]], dtype=np.int32),
    }
    tokens = infer(server, "audio_tokenizer", reference, "prompt_speech_tokens").reshape(-1)
    embedding = infer(
        server, "speaker_embedding", {"reference_wav": wav.reshape(1, -1)}, "prompt_spk_embedding"
    ).reshape(-1)
    mel = features.prompt_mel(wav)
    count = min(mel.shape[0] // 2, tokens.size)
    assert count > 0
    assert np.array_equal(prompt.speech_tokens, tokens[:count].astype(np.int32))
    assert np.array_equal(prompt.embedding.astype(np.float16), embedding.astype(np.float16))
    assert prompt.speech_feat.shape == (2 * count, 80)
    assert np.allclose(prompt.speech_feat, mel[: 2 * count], atol=1e-4)


def test_a_request_without_reference_audio_speaks_with_the_default_speaker(
    cosyvoice2_twin: CosyVoice2Twin,
) -> None:
    server, wav = cosyvoice2_twin.server, cosyvoice2_twin.recording
    default = samples(server, request(TARGET), "cosyvoice2")
    assert default > 0 and default % SAMPLES_PER_TOKEN == 0
    # The same text in the LLM's prompt: the default speaker's transcript reached it.
    assert default == samples(server, request(TARGET, wav, TRANSCRIPT), "cosyvoice2")
    assert default > samples(server, request(TARGET, wav, ""), "cosyvoice2")
