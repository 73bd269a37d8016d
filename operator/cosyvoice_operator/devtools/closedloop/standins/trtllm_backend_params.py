"""What the TensorRT-LLM backend refuses in ``tensorrt_llm``'s parameters (the stand-in
``tensorrt_llm/model.py`` calls :func:`config_problems` when it loads, so that the CPU twin
does not load a configuration the real backend would not).

From ``triton_backend/inflight_batcher_llm/src/model_instance_state.cc`` (NVIDIA/TensorRT-LLM,
read at the stored commits 0c8de69 and 5cdd692, docs/concepts/triton-repository.md): the
``ModelInstanceState`` constructor throws, and Triton does not load the model, when

- a key read outside a ``try`` is absent: ``gpt_model_type`` (getBatchingTypeFromParams),
  ``tokenizer_dir``, ``xgrammar_tokenizer_info_path``, ``guided_decoding_backend``
  (getGuidedDecodingConfigFromParams) — the operator's ``TRTLLM_UNGUARDED_PARAMETERS``, kept
  equal to :data:`UNGUARDED` by a unit test (this file is copied beside the stand-in and
  imports nothing of the operator);
- ``gpt_model_type`` is not ``V1``/``v1``/``inflight_batching``/``inflight_fused_batching``;
- guided decoding is on (backend and tokenizer-info path both set, neither a ``${...}``
  placeholder) with a backend other than ``xgrammar`` or an info file that does not exist.

Every other key is read inside a ``try``: a bad value there falls back to the default with a
warning, which the backend does not refuse either.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

UNGUARDED = (
    "gpt_model_type",
    "tokenizer_dir",
    "xgrammar_tokenizer_info_path",
    "guided_decoding_backend",
)
BATCHING_TYPES = ("V1", "v1", "inflight_batching", "inflight_fused_batching")


def _unset(value: str, key: str) -> bool:
    return not value or value == "${" + key + "}"


def config_problems(parameters: Mapping[str, str]) -> list[str]:
    """Why the TensorRT-LLM backend would not create its model instance for these parameters
    (string values by key); empty when it would."""
    problems = [
        f"Cannot find parameter with name: {key}" for key in UNGUARDED if key not in parameters
    ]
    model_type = parameters.get("gpt_model_type")
    if model_type is not None and model_type not in BATCHING_TYPES:
        problems.append(
            "Invalid gpt_model_type. Must be v1/inflight_batching/inflight_fused_batching."
        )
    backend = parameters.get("guided_decoding_backend", "")
    info = parameters.get("xgrammar_tokenizer_info_path", "")
    if not _unset(backend, "guided_decoding_backend") and not _unset(
        info, "xgrammar_tokenizer_info_path"
    ):
        if not os.path.exists(info):
            problems.append(f"Xgrammar's tokenizer info path at {info} does not exist.")
        if backend != "xgrammar":
            problems.append(
                "Guided decoding is currently supported with 'xgrammar' backend. "
                "Invalid guided_decoding_backend parameter provided."
            )
    return problems
