"""The chat-completions request CosyVoice3's orchestrator sends to its LLM server (trtllm-serve).

Pure functions, no Triton: the orchestrator (``models/cosyvoice3``) builds each request with
:func:`chat_body`.

- **The served model name** (``model``): trtllm-serve's ``ChatCompletionRequest`` declares
  ``model: str`` without a default and forbids unknown fields (``extra="forbid"``), so FastAPI
  refuses a body without it (400) before the handler runs. trtllm-serve answers under the
  basename of the engine directory it was started on (``OpenAIServer``: ``Path(model).name``
  when the path is a directory), which the operator renders as ``llm_model_name``.
- **The instruction**: CosyVoice3's LLM was trained on text that carries
  ``<|endofprompt|>`` (upstream's ``cosyvoice/llm/llm.py`` asserts token 151646 in the text or
  the prompt text). Upstream's Triton orchestrator (ace7c47,
  ``runtime/triton_trtllm/model_repo_cosyvoice3/cosyvoice3/1/model.py:260-261``) prepends
  ``'You are a helpful assistant.<|endofprompt|>'`` to the reference text when it lacks the
  token; :func:`with_instruction` does the same, for a request's reference text and for the
  default speaker's transcript alike.
"""

from __future__ import annotations

from typing import Any

END_OF_PROMPT = "<|endofprompt|>"
INSTRUCTION = "You are a helpful assistant." + END_OF_PROMPT
# Upstream's sampling for CosyVoice3's LLM (the same values upstream's orchestrator sends).
SAMPLING: dict[str, Any] = {
    "temperature": 0.8,
    "top_p": 0.95,
    "top_k": 50,
    "repetition_penalty": 1.1,
}
STOP = ("<|eos1|>", "<|eos|>")


def with_instruction(reference_text: str) -> str:
    """The reference text as the LLM must see it: upstream's instruction first, unless the
    text already carries ``<|endofprompt|>`` (a caller's own instruction)."""
    if END_OF_PROMPT in reference_text:
        return reference_text
    return INSTRUCTION + reference_text


def speech_prefix(prompt_tokens: Any) -> str:
    """The prompt's speech tokens as the assistant's text (``<|s_N|>`` each)."""
    return "".join(f"<|s_{int(t)}|>" for t in prompt_tokens)


def chat_body(
    model: str,
    reference_text: str,
    target_text: str,
    prompt_tokens: Any,
    max_tokens: int,
    stream: bool,
) -> dict[str, Any]:
    """One chat-completions request: the user says the reference text (with the instruction)
    and the target text, the assistant's turn begins with the prompt's speech tokens."""
    if not model:
        raise ValueError("the LLM server's model name is empty (llm_model_name)")
    return {
        "model": model,
        "messages": [
            {"role": "user", "content": with_instruction(reference_text) + target_text},
            {"role": "assistant", "content": speech_prefix(prompt_tokens)},
        ],
        "max_tokens": max_tokens,
        **SAMPLING,
        "stop": list(STOP),
        "stream": stream,
    }
