"""The default speaker with our ``cosyvoice3`` orchestrator in the real tritonserver (issue 19,
item 5): ``conftest.cosyvoice3_twin`` (shared with ``test_twin_cosyvoice3``: a
``cosyvoice3.yaml`` on fake networks, a tiny ``speech_tokenizer_v3.onnx``, ``campplus.onnx``),
whose speaker file the builder's tool made from a WAV with ``--variant cosyvoice3``, and the
stand-in trtllm-serve processes recording what the orchestrator asks. A request without
reference audio asks the LLM, under the model name trtllm-serve serves, with upstream's
instruction, the speaker's transcript and the target text, and the speaker's speech tokens as
the assistant's prefix: exactly the file's."""

from __future__ import annotations

from twins import TARGET, TRANSCRIPT, CosyVoice3Twin, request, samples


def test_a_request_without_reference_audio_prompts_the_llm_with_the_default_speaker(
    cosyvoice3_twin: CosyVoice3Twin,
) -> None:
    from cosyvoice_serving_models import speakers

    prompt = speakers.load_prompt(cosyvoice3_twin.speaker)
    assert prompt.speech_tokens.size > 0
    llm = cosyvoice3_twin.llm
    before = llm.requests_per_server()
    assert samples(cosyvoice3_twin.server, request(TARGET), "cosyvoice3") > 0
    # One request, to whichever LLM group was the least loaded.
    [asked] = [r for s, n in zip(llm.servers, before, strict=True) for r in s.requests[n:]]
    assert asked["model"] == "llm"  # the rendered llm_model_name
    user, assistant = asked["messages"]
    instruction = "You are a helpful assistant.<|endofprompt|>"
    assert user == {"role": "user", "content": instruction + TRANSCRIPT + TARGET}
    tokens = "".join(f"<|s_{int(t)}|>" for t in prompt.speech_tokens)
    assert assistant == {"role": "assistant", "content": tokens}
