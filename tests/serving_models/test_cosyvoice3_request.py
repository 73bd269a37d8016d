"""CosyVoice3's chat request against the stand-in trtllm-serve (``cpu_twin.LlmStandIn``, a real
HTTP server): the stand-in refuses what trtllm-serve's ``ChatCompletionRequest`` refuses (no
``model``, no ``messages``, an unknown field: HTTP 400, trtllm-serve's own answer to a
validation error) and a CosyVoice3 prompt without ``<|endofprompt|>``; the body our
orchestrator builds (``cosyvoice3_prompt.chat_body``) is accepted and answered."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from cosyvoice_operator.devtools.closedloop import cpu_twin
from cosyvoice_serving_models import cosyvoice3_prompt

URL = "http://127.0.0.1:8010/v1/chat/completions"
REFERENCE = "A reference sentence."
TARGET = "Hello there."
TOKENS = np.array([3, 1, 4, 1, 5])
# What the orchestrator sent before issue 31 (serving-models/models/cosyvoice3/model.py at
# 71a3317): no model, no instruction.
OLD_BODY: dict[str, Any] = {
    "messages": [
        {"role": "user", "content": REFERENCE + TARGET},
        {"role": "assistant", "content": "<|s_3|><|s_1|><|s_4|><|s_1|><|s_5|>"},
    ],
    "max_tokens": 240,
    "temperature": 0.8,
    "top_p": 0.95,
    "top_k": 50,
    "repetition_penalty": 1.1,
    "stop": ["<|eos1|>", "<|eos|>"],
    "stream": False,
}


@pytest.fixture(scope="module")
def llm() -> Iterator[cpu_twin.LlmStandIn]:
    with cpu_twin.LlmStandIn([URL]) as standin:
        yield standin


def post(llm: cpu_twin.LlmStandIn, body: object) -> tuple[int, dict[str, Any]]:
    call = urllib.request.Request(
        llm.remap[URL], data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(call, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def corrected() -> dict[str, Any]:
    return cosyvoice3_prompt.chat_body("llm", REFERENCE, TARGET, TOKENS, 240, stream=False)


def test_the_old_body_is_refused_with_400(llm: cpu_twin.LlmStandIn) -> None:
    before = len(llm.servers[0].refused)
    status, answer = post(llm, OLD_BODY)
    assert status == cpu_twin.VALIDATION_STATUS == 400
    assert "model: Field required" in answer["error"]
    assert llm.servers[0].refused[before:] == [OLD_BODY]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"model": None}, "model: Field required"),
        ({"messages": None}, "messages: Field required"),
        ({"priority": 1}, "priority: Extra inputs are not permitted"),
        ({"model": 7}, "model: Input should be a valid string"),
        ({"stream_options": {"include_usage": True}}, "stream_options can only be set"),
        ({"max_completion_tokens": 240}, "one field, given twice"),
    ],
)
def test_each_schema_violation_alone_is_refused(
    llm: cpu_twin.LlmStandIn, change: dict[str, Any], why: str
) -> None:
    body = corrected()
    for key, value in change.items():
        if value is None:
            del body[key]
        else:
            body[key] = value
    status, answer = post(llm, body)
    assert status == 400
    assert why in answer["error"]


def test_a_cosyvoice3_prompt_without_the_end_of_prompt_token_is_refused(
    llm: cpu_twin.LlmStandIn,
) -> None:
    body = corrected()
    body["messages"][0]["content"] = REFERENCE + TARGET
    status, answer = post(llm, body)
    assert status == 400
    assert "<|endofprompt|>" in answer["error"]
    # The same body is one trtllm-serve's schema takes: only the CosyVoice3 check refuses it.
    assert cpu_twin.chat_request_problems(body, cosyvoice3=False) == []


def test_the_body_our_orchestrator_builds_is_accepted(llm: cpu_twin.LlmStandIn) -> None:
    body = corrected()
    assert body["model"] == "llm"
    assert body["messages"][0]["content"] == (
        "You are a helpful assistant.<|endofprompt|>" + REFERENCE + TARGET
    )
    assert body["messages"][1]["content"] == "<|s_3|><|s_1|><|s_4|><|s_1|><|s_5|>"
    status, answer = post(llm, body)
    assert status == 200
    content = answer["choices"][0]["message"]["content"]
    # As many tokens as the stand-in gives the text after the instruction.
    count = cpu_twin.speech_token_count(REFERENCE + TARGET, 240)
    assert content == "".join(f"<|s_{i}|>" for i in range(count))
    assert llm.servers[0].requests[-1] == body


def test_the_instruction_is_not_doubled() -> None:
    own = "Speak slowly.<|endofprompt|>" + REFERENCE
    assert cosyvoice3_prompt.with_instruction(own) == own
    assert cosyvoice3_prompt.with_instruction(REFERENCE) == (
        cosyvoice3_prompt.INSTRUCTION + REFERENCE
    )
    assert cosyvoice3_prompt.with_instruction("") == cosyvoice3_prompt.INSTRUCTION
    with pytest.raises(ValueError, match="llm_model_name"):
        cosyvoice3_prompt.chat_body("", REFERENCE, TARGET, TOKENS, 240, stream=True)
