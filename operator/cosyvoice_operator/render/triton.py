"""The Triton model repository of a CosyVoiceService: one ``config.pbtxt`` per model (pure).

``render_repository(svc, engine_dir)`` returns ``{model name: config.pbtxt text}``; the
model code (upstream's Python models) comes from the serving image, the engine files from
the engine directory mounted at ``engine_dir``. Nothing here reads a file or the cluster.

docs/concepts/triton-repository.md says which facts come from upstream (FunAudioLLM/CosyVoice,
``runtime/triton_trtllm`` at commit ace7c47) and which are ours, and why: every GPU of the
pod used, the LLM once per tensor-parallel group, the orchestrator's instance count,
batching from the spec, the paths inside the engine directory and :data:`MODEL_VIEW`, queue
policy and stream chunking, device memory between GPUs, and state in instances. The
parameters each model carries are declared once, in ``render/model_parameters.py``, and
every rendered configuration is checked against that declaration. The text format itself
is ``render/pbtxt.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from cosyvoice_operator.api.spec import (
    UPSTREAM_FIRST_CHUNK_TOKENS,
    VARIANTS,
    QueuePolicy,
    QueuePolicySpec,
    ServiceSpec,
)
from cosyvoice_operator.render.model_parameters import MODEL_PARAMETERS
from cosyvoice_operator.render.pbtxt import EnumValue, Value, message_text

MODEL_NAMES: dict[str, tuple[str, ...]] = {
    "cosyvoice2": (
        "cosyvoice2",
        "tensorrt_llm",
        "token2wav",
        "audio_tokenizer",
        "speaker_embedding",
    ),
    "cosyvoice3": ("cosyvoice3", "token2wav", "vocoder", "audio_tokenizer", "speaker_embedding"),
}
LLM_BASE_PORT = 8010
# The model directory the serving entrypoint assembles in the pod
# (docs/concepts/triton-repository.md).
MODEL_VIEW = "/tmp/model_view"
LLM_CHAT_PATH = "/v1/chat/completions"
# CosyVoice2 token2wav's vocoder state between the chunks of a stream (serving-models/):
# the last 8 mel frames, their excitation source and the last 160 ms of audio.
HIFT_STATE: tuple[tuple[str, list[int]], ...] = (
    ("mel", [80, -1]),
    ("source", [-1]),
    ("speech", [-1]),
)
# The LLM servers listen on this address (serving/launch.py binds them to it): the
# orchestrator's URLs name it rather than "localhost", which may resolve to ::1 first.
LLM_HOST = "127.0.0.1"
# Upstream's bls_instance_num, which it runs on a single GPU.
ORCHESTRATOR_INSTANCES_PER_GPU: dict[str, int] = {"cosyvoice2": 4, "cosyvoice3": 10}
# Upstream's attention window (run.sh); the KV cache holds one per batch slot.
ATTENTION_WINDOW_TOKENS = 2560
# Where the serving image (upstream's base image) has the TensorRT-LLM executor worker.
TRTLLM_EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"

# The engine directory's layout, as engine-builder/cosyvoice_engine_builder/layout.py
# writes it (a unit test keeps the two in step; the operator does not import the builder).
ENGINE_LLM_DIR = "llm"
ENGINE_MODEL_DIR = "model"
ENGINE_PLANS_DIR = "plans"
# spec.speakers.default's prompt features (speakers/default.npz), when the spec names one.
ENGINE_DEFAULT_SPEAKER = "speakers/default.npz"
MANIFEST_NAME = "manifest.json"
TOKENIZER_SUBDIR = "llm"


@dataclass(frozen=True)
class EnginePaths:
    """Where the files of one engine directory are, seen from inside the pod."""

    root: str

    @property
    def llm(self) -> str:
        return f"{self.root}/{ENGINE_LLM_DIR}"

    @property
    def model(self) -> str:
        return f"{self.root}/{ENGINE_MODEL_DIR}"

    @property
    def tokenizer(self) -> str:
        return f"{self.model}/{TOKENIZER_SUBDIR}"

    @property
    def plans(self) -> str:
        return f"{self.root}/{ENGINE_PLANS_DIR}"

    @property
    def manifest(self) -> str:
        return f"{self.root}/{MANIFEST_NAME}"

    @property
    def default_speaker(self) -> str:
        return f"{self.root}/{ENGINE_DEFAULT_SPEAKER}"


def engine_paths(engine_dir: str) -> EnginePaths:
    if not engine_dir.startswith("/"):
        raise ValueError(f"engine_dir must be an absolute path, got {engine_dir!r}")
    return EnginePaths(engine_dir.rstrip("/") or "/")


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")


def orchestrator(variant: str) -> str:
    """The BLS model clients call: upstream names it after the variant."""
    _check_variant(variant)
    return MODEL_NAMES[variant][0]


def llm_groups(svc: ServiceSpec) -> list[list[int]]:
    """GPU indices of each tensor-parallel group of one pod: gpus 4, tp 2 -> [[0, 1], [2, 3]]."""
    tp = svc.engine.tensor_parallel_size
    gpus = svc.serving.gpus_per_replica
    if tp < 1 or gpus % tp:
        raise ValueError(f"gpusPerReplica ({gpus}) must be a multiple of tensorParallelSize ({tp})")
    return [list(range(start, start + tp)) for start in range(0, gpus, tp)]


def llm_beside_triton(svc: ServiceSpec) -> bool:
    """Whether the LLM runs as its own server beside Triton: CosyVoice3's trtllm-serve.
    CosyVoice2 keeps it inside Triton (the ``tensorrt_llm`` model)."""
    return svc.model.variant == "cosyvoice3"


def llm_ports(svc: ServiceSpec) -> list[int]:
    """The port of each group's LLM server (8010, 8011, ...); none when the LLM is in Triton."""
    if not llm_beside_triton(svc):
        return []
    return [LLM_BASE_PORT + i for i in range(len(llm_groups(svc)))]


def llm_urls(svc: ServiceSpec) -> list[str]:
    """The chat-completions URL of each LLM server, in group order."""
    return [f"http://{LLM_HOST}:{port}{LLM_CHAT_PATH}" for port in llm_ports(svc)]


def llm_model_name(paths: EnginePaths) -> str:
    """The model name trtllm-serve answers under: the basename of the engine directory it is
    started on (cosyvoice-serve starts it on ``<engine>/llm``; TensorRT-LLM's ``OpenAIServer``
    takes ``Path(model).name`` when the path is a directory). Its chat request schema
    (``ChatCompletionRequest``) requires the field; the server does not compare the value."""
    return PurePosixPath(paths.llm).name


def orchestrator_instances(svc: ServiceSpec) -> int:
    """Instances of the orchestrator in one pod: upstream's per-GPU count times the GPUs, and
    for CosyVoice2 at least one per LLM sequence slot (docs/concepts/triton-repository.md says
    why)."""
    _check_variant(svc.model.variant)
    upstream = ORCHESTRATOR_INSTANCES_PER_GPU[svc.model.variant] * svc.serving.gpus_per_replica
    if svc.model.variant != "cosyvoice2":
        return upstream
    return max(upstream, svc.engine.max_batch_size * len(llm_groups(svc)))


# Requests to the LLM servers in the pod never go through a proxy: Python's HTTP clients
# (httpx, requests, urllib) honour HTTP(S)_PROXY unless NO_PROXY names the host; both
# spellings, since some read only one.
NO_PROXY_HOSTS = f"localhost,{LLM_HOST},::1"


def trtllm_orchestrator_mode(svc: ServiceSpec) -> bool:
    """Whether the TensorRT-LLM backend runs in orchestrator mode: CosyVoice2 with more than
    one LLM GPU in a pod (several groups, or a tensor-parallel engine, whose ranks the
    orchestrator spawns). One group of one GPU runs in leader mode, as upstream's run.sh
    starts it (world size 1, no TRTLLM_ORCHESTRATOR); leader mode with tensor parallelism
    would need tritonserver itself started as tp MPI ranks."""
    if svc.model.variant != "cosyvoice2":
        return False
    groups = llm_groups(svc)
    return len(groups) > 1 or len(groups[0]) > 1


def server_environment(svc: ServiceSpec) -> dict[str, str]:
    """Environment the serving container needs for this repository.

    Always ``NO_PROXY`` / ``no_proxy`` for the pod's own addresses. CosyVoice2 with more than
    one LLM GPU (:func:`trtllm_orchestrator_mode`): the TensorRT-LLM backend's orchestrator
    mode (``TRTLLM_ORCHESTRATOR=1``), in which it spawns one executor per ``gpu_device_ids``
    entry (``TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1``, the backend's default, written out) and
    Triton core balances requests over them; the serving entrypoint then starts tritonserver
    under ``mpirun -n 1`` as TensorRT-LLM's launcher does (engine-builder serving/launch.py).
    """
    env = {"NO_PROXY": NO_PROXY_HOSTS, "no_proxy": NO_PROXY_HOSTS}
    if trtllm_orchestrator_mode(svc):
        env["TRTLLM_ORCHESTRATOR"] = "1"
        env["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] = "1"
    return env


# ---- the pieces of a model config ----------------------------------------------------------


def _tensor(
    name: str,
    dtype: str,
    dims: list[int],
    *,
    optional: bool = False,
    scalar: bool = False,
    ragged: bool = False,
) -> dict[str, Value]:
    tensor: dict[str, Value] = {
        "name": name,
        "data_type": EnumValue(f"TYPE_{dtype}"),
        "dims": list[Value](dims),
    }
    if scalar:  # a [1] per request, handed to the model as a scalar
        tensor["reshape"] = {"shape": []}
    if ragged:
        tensor["allow_ragged_batch"] = True
    if optional:
        tensor["optional"] = True
    return tensor


def _parameters(values: dict[str, str]) -> list[Value]:
    return [{"key": key, "value": {"string_value": value}} for key, value in values.items()]


def _preferred(sizes: tuple[int, ...], max_batch_size: int) -> list[int]:
    """The spec's preferred sizes capped to one model's max_batch_size, in order, once each."""
    return sorted({min(size, max_batch_size) for size in sizes})


def _batching(
    svc: ServiceSpec,
    max_batch_size: int,
    *,
    priorities: bool = False,
    queue_policy: QueuePolicySpec | None = None,
) -> dict[str, Value]:
    db = svc.serving.dynamic_batching
    batching: dict[str, Value] = {}
    preferred = _preferred(db.preferred_batch_sizes, max_batch_size)
    if preferred:
        batching["preferred_batch_size"] = list[Value](preferred)
    batching["max_queue_delay_microseconds"] = db.max_queue_delay_microseconds
    if priorities and db.priority_levels > 0:
        # Requests without a priority take the lowest level; chunks sent with one go first.
        batching["priority_levels"] = db.priority_levels
        batching["default_priority_level"] = db.priority_levels
    if queue_policy is not None:
        batching["default_queue_policy"] = _queue_policy(queue_policy.default)
        if queue_policy.priority_policies:
            batching["priority_queue_policy"] = [
                {"key": p.priority_level, "value": _queue_policy(p.policy)}
                for p in queue_policy.priority_policies
            ]
    return batching


def _queue_policy(policy: QueuePolicy) -> dict[str, Value]:
    """Triton's ModelQueuePolicy. 0 keeps Triton's meaning: no bound, no timeout."""
    return {
        "timeout_action": EnumValue(policy.timeout_action.upper()),
        "default_timeout_microseconds": policy.default_timeout_microseconds,
        "allow_timeout_override": policy.allow_timeout_override,
        "max_queue_size": policy.max_queue_size,
    }


def _gpu_instances(svc: ServiceSpec) -> list[Value]:
    return [
        {
            "count": svc.serving.instances_per_gpu,
            "kind": EnumValue("KIND_GPU"),
            "gpus": list[Value](range(svc.serving.gpus_per_replica)),
        }
    ]


def _cpu_instances(count: int) -> list[Value]:
    return [{"count": count, "kind": EnumValue("KIND_CPU")}]


def _decoupled(svc: ServiceSpec) -> dict[str, Value]:
    return {"decoupled": svc.serving.streaming}


# Python models: inputs always in host memory (docs/concepts/triton-repository.md: "Device memory
# between GPUs").
_HOST_INPUTS = {"FORCE_CPU_ONLY_INPUT_TENSORS": "yes"}


def _python_model(
    name: str,
    svc: ServiceSpec,
    inputs: list[Value],
    outputs: list[Value],
    parameters: dict[str, str],
    *,
    priorities: bool = False,
) -> dict[str, Value]:
    max_batch = svc.engine.max_batch_size
    return {
        "name": name,
        "backend": "python",
        "max_batch_size": max_batch,
        "dynamic_batching": _batching(svc, max_batch, priorities=priorities),
        "parameters": _parameters({**_HOST_INPUTS, **parameters}),
        "input": inputs,
        "output": outputs,
        "instance_group": _gpu_instances(svc),
    }


# ---- the models ----------------------------------------------------------------------------

_ORCHESTRATOR_MAX_BATCH = 1


# spec.serving.streamChunking.hopGrowth -> upstream's dynamic_chunk_strategy values.
HOP_GROWTH_STRATEGY = {"exponential": "exponential", "equal": "equal", "time-based": "time_based"}


def _orchestrator(svc: ServiceSpec, paths: EnginePaths) -> dict[str, Value]:
    chunking = svc.serving.stream_chunking
    params = {
        **_HOST_INPUTS,
        "model_dir": MODEL_VIEW,
        "llm_tokenizer_dir": paths.tokenizer,
        "dynamic_chunk_strategy": HOP_GROWTH_STRATEGY[chunking.hop_growth],
    }
    if chunking.first_chunk_tokens != UPSTREAM_FIRST_CHUNK_TOKENS:
        # Upstream's value is the model code's own default: written out only when it differs,
        # so the repository (and the pods) of a service that never set it stay as they were.
        params["token_hop_len"] = str(chunking.first_chunk_tokens)
    if svc.speakers.default is not None:
        # Rendered only with a default speaker: without it, a request without reference audio
        # gets an error from the orchestrator.
        params["default_speaker"] = paths.default_speaker
    if llm_beside_triton(svc):
        urls = llm_urls(svc)
        params["llm_api_base"] = urls[0]
        params["llm_api_bases"] = ",".join(urls)
        params["llm_model_name"] = llm_model_name(paths)
    queue = svc.serving.queue_policy
    # Per-priority policies need priority levels on the queue clients wait in; without them
    # the orchestrator keeps upstream's single level.
    client_priorities = queue is not None and bool(queue.priority_policies)
    return {
        "name": orchestrator(svc.model.variant),
        "backend": "python",
        "max_batch_size": _ORCHESTRATOR_MAX_BATCH,
        "dynamic_batching": _batching(
            svc, _ORCHESTRATOR_MAX_BATCH, priorities=client_priorities, queue_policy=queue
        ),
        "model_transaction_policy": _decoupled(svc),
        "parameters": _parameters(params),
        "input": [
            _tensor("reference_wav", "FP32", [-1], optional=True),
            _tensor("reference_wav_len", "INT32", [1], optional=True),
            _tensor("reference_text", "STRING", [1], optional=True),
            _tensor("target_text", "STRING", [1]),
        ],
        "output": [_tensor("waveform", "FP32", [-1])],
        "instance_group": _cpu_instances(orchestrator_instances(svc)),
    }


def _token2wav(svc: ServiceSpec, paths: EnginePaths) -> dict[str, Value]:
    # CosyVoice2's token2wav synthesises audio; CosyVoice3's stops at the mel spectrogram and
    # leaves the audio to the vocoder.
    # CosyVoice2's project model code (serving-models/) keeps no stream state in an instance:
    # each streamed chunk returns the vocoder state (hift_next_*) and the orchestrator sends
    # it back with the next chunk (hift_cache_*), so any instance can serve any chunk.
    cosyvoice3 = svc.model.variant == "cosyvoice3"
    state = [(f"hift_{{}}_{part}", dims) for part, dims in HIFT_STATE]
    inputs: list[Value] = [
        _tensor("target_speech_tokens", "INT32", [-1]),
        _tensor("prompt_speech_tokens", "INT32", [-1], optional=True),
        _tensor("prompt_speech_feat", "FP16", [-1, 80], optional=True),
        _tensor("prompt_spk_embedding", "FP16", [-1], optional=True),
        _tensor("token_offset", "INT32", [1], scalar=True, optional=True),
        _tensor("finalize", "BOOL", [1], scalar=True, optional=True),
    ]
    outputs: list[Value] = (
        [_tensor("mel", "FP32", [80, -1])] if cosyvoice3 else [_tensor("waveform", "FP32", [-1])]
    )
    if not cosyvoice3:
        inputs += [_tensor(n.format("cache"), "FP32", d, optional=True) for n, d in state]
        outputs += [_tensor(n.format("next"), "FP32", d) for n, d in state]
    return _python_model(
        "token2wav",
        svc,
        inputs,
        outputs,
        {"model_dir": MODEL_VIEW, "engine_manifest": paths.manifest, "plans_dir": paths.plans},
        priorities=svc.model.variant == "cosyvoice3",
    )


def _vocoder(svc: ServiceSpec, paths: EnginePaths) -> dict[str, Value]:
    return _python_model(
        "vocoder",
        svc,
        [_tensor("mel", "FP32", [80, -1]), _tensor("finalize", "BOOL", [1], scalar=True)],
        [_tensor("tts_speech", "FP32", [-1])],
        {"model_dir": MODEL_VIEW},
    )


def _audio_tokenizer(svc: ServiceSpec, paths: EnginePaths) -> dict[str, Value]:
    return _python_model(
        "audio_tokenizer",
        svc,
        [_tensor("reference_wav", "FP32", [-1]), _tensor("reference_wav_len", "INT32", [1])],
        [_tensor("prompt_speech_tokens", "INT32", [-1])],
        {"model_dir": MODEL_VIEW},
    )


def _speaker_embedding(svc: ServiceSpec, paths: EnginePaths) -> dict[str, Value]:
    return _python_model(
        "speaker_embedding",
        svc,
        [_tensor("reference_wav", "FP32", [-1])],
        [_tensor("prompt_spk_embedding", "FP16", [-1])],
        {"model_dir": MODEL_VIEW, "engine_manifest": paths.manifest, "plans_dir": paths.plans},
    )


# The TensorRT-LLM backend's request interface: (name, type, dims, how), where how is "s" a
# per-request scalar (dims [1] reshaped to []), "r" ragged-batched, "" neither. Every input
# but input_lengths and request_output_len is optional.
_TRTLLM_INPUTS: tuple[tuple[str, str, tuple[int, ...], str], ...] = (
    ("input_ids", "INT32", (-1,), "r"),
    ("encoder_input_features", "FP16", (-1, -1), "r"),
    ("encoder_output_lengths", "INT32", (1,), "s"),
    ("input_lengths", "INT32", (1,), "s"),
    ("request_output_len", "INT32", (1,), "s"),
    ("num_return_sequences", "INT32", (1,), "s"),
    ("draft_input_ids", "INT32", (-1,), "r"),
    ("decoder_input_ids", "INT32", (-1,), "r"),
    ("decoder_input_lengths", "INT32", (1,), "s"),
    ("draft_logits", "FP32", (-1, -1), "r"),
    ("draft_acceptance_threshold", "FP32", (1,), "s"),
    ("end_id", "INT32", (1,), "s"),
    ("pad_id", "INT32", (1,), "s"),
    ("stop_words_list", "INT32", (2, -1), "r"),
    ("bad_words_list", "INT32", (2, -1), "r"),
    ("embedding_bias", "FP32", (-1,), "r"),
    ("beam_width", "INT32", (1,), "s"),
    ("temperature", "FP32", (1,), "s"),
    ("runtime_top_k", "INT32", (1,), "s"),
    ("runtime_top_p", "FP32", (1,), "s"),
    ("runtime_top_p_min", "FP32", (1,), "s"),
    ("runtime_top_p_decay", "FP32", (1,), "s"),
    ("runtime_top_p_reset_ids", "INT32", (1,), "s"),
    ("len_penalty", "FP32", (1,), "s"),
    ("early_stopping", "BOOL", (1,), "s"),
    ("repetition_penalty", "FP32", (1,), "s"),
    ("min_length", "INT32", (1,), "s"),
    ("beam_search_diversity_rate", "FP32", (1,), "s"),
    ("presence_penalty", "FP32", (1,), "s"),
    ("frequency_penalty", "FP32", (1,), "s"),
    ("random_seed", "UINT64", (1,), "s"),
    ("return_log_probs", "BOOL", (1,), "s"),
    ("return_context_logits", "BOOL", (1,), "s"),
    ("return_generation_logits", "BOOL", (1,), "s"),
    ("return_perf_metrics", "BOOL", (1,), "s"),
    ("exclude_input_in_output", "BOOL", (1,), "s"),
    ("stop", "BOOL", (1,), "s"),
    ("streaming", "BOOL", (1,), "s"),
    ("prompt_embedding_table", "FP16", (-1, -1), "r"),
    ("prompt_table_extra_ids", "UINT64", (-1,), "r"),
    ("prompt_vocab_size", "INT32", (1,), "s"),
    ("cross_attention_mask", "BOOL", (-1, -1), "r"),
    ("mrope_rotary_cos_sin", "FP32", (-1,), ""),
    ("mrope_position_deltas", "INT64", (1,), ""),
    ("lora_task_id", "UINT64", (1,), "s"),
    ("lora_weights", "FP16", (-1, -1), "r"),
    ("lora_config", "INT32", (-1, 3), "r"),
    ("context_phase_params", "UINT8", (-1,), "r"),
    ("skip_cross_attn_blocks", "BOOL", (1,), "r"),
    ("retention_token_range_starts", "INT32", (-1,), "r"),
    ("retention_token_range_ends", "INT32", (-1,), "r"),
    ("retention_token_range_priorities", "INT32", (-1,), "r"),
    ("retention_token_range_durations_ms", "INT32", (-1,), "r"),
    ("retention_decode_priority", "INT32", (1,), "r"),
    ("retention_decode_duration_ms", "INT32", (1,), "r"),
    ("guided_decoding_guide_type", "STRING", (1,), "r"),
    ("guided_decoding_guide", "STRING", (1,), "r"),
    ("lookahead_window_size", "INT32", (1,), "r"),
    ("lookahead_ngram_size", "INT32", (1,), "r"),
    ("lookahead_verification_set_size", "INT32", (1,), "r"),
)
_TRTLLM_REQUIRED = frozenset({"input_lengths", "request_output_len"})
_TRTLLM_OUTPUTS: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("output_ids", "INT32", (-1, -1)),
    ("sequence_length", "INT32", (-1,)),
    ("cum_log_probs", "FP32", (-1,)),
    ("output_log_probs", "FP32", (-1, -1)),
    ("context_logits", "FP32", (-1, -1)),
    ("generation_logits", "FP32", (-1, -1, -1)),
    ("batch_index", "INT32", (1,)),
    ("sequence_index", "INT32", (1,)),
    ("context_phase_params", "UINT8", (-1,)),
    ("kv_cache_alloc_new_blocks", "INT32", (1,)),
    ("kv_cache_reused_blocks", "INT32", (1,)),
    ("kv_cache_alloc_total_blocks", "INT32", (1,)),
    ("arrival_time_ns", "INT64", (1,)),
    ("first_scheduled_time_ns", "INT64", (1,)),
    ("first_token_time_ns", "INT64", (1,)),
    ("last_token_time_ns", "INT64", (1,)),
    ("acceptance_rate", "FP32", (1,)),
    ("total_accepted_draft_tokens", "INT32", (1,)),
    ("total_draft_tokens", "INT32", (1,)),
)


def gpu_device_ids(svc: ServiceSpec) -> str:
    """tensorrt_llm's ``gpu_device_ids``: one comma-separated group per instance, ``;`` between."""
    return ";".join(",".join(str(gpu) for gpu in group) for group in llm_groups(svc))


def _tensorrt_llm(svc: ServiceSpec, paths: EnginePaths) -> dict[str, Value]:
    max_batch = svc.engine.max_batch_size
    groups = llm_groups(svc)
    return {
        "name": "tensorrt_llm",
        "backend": "tensorrtllm",
        "max_batch_size": max_batch,
        "model_transaction_policy": _decoupled(svc),
        "dynamic_batching": _batching(svc, max_batch),
        "input": [
            _tensor(
                name,
                dtype,
                list(dims),
                optional=name not in _TRTLLM_REQUIRED,
                scalar=how == "s",
                ragged=how == "r",
            )
            for name, dtype, dims, how in _TRTLLM_INPUTS
        ],
        "output": [_tensor(name, dtype, list(dims)) for name, dtype, dims in _TRTLLM_OUTPUTS],
        # The backend places its instances itself, one per gpu_device_ids entry.
        "instance_group": _cpu_instances(len(groups)),
        "parameters": _parameters(
            {
                "gpt_model_type": "inflight_fused_batching",
                # Read with no fallback (render/model_parameters.py); empty turns guided
                # decoding off, which CosyVoice's LLM does not use.
                "tokenizer_dir": "",
                "xgrammar_tokenizer_info_path": "",
                "guided_decoding_backend": "",
                "gpt_model_path": paths.llm,
                "gpu_device_ids": gpu_device_ids(svc),
                "max_beam_width": "1",
                "max_attention_window_size": str(ATTENTION_WINDOW_TOKENS),
                "max_tokens_in_paged_kv_cache": str(max_batch * ATTENTION_WINDOW_TOKENS),
                "kv_cache_free_gpu_mem_fraction": "0.5",
                "exclude_input_in_output": "True",
                "enable_kv_cache_reuse": "False",
                "executor_worker_path": TRTLLM_EXECUTOR_WORKER,
            }
        ),
    }


def model_names(svc: ServiceSpec) -> tuple[str, ...]:
    """The models of the service's repository: its variant's."""
    _check_variant(svc.model.variant)
    return MODEL_NAMES[svc.model.variant]


def parameter_keys(config: dict[str, Value]) -> set[str]:
    """The parameter keys of one rendered model configuration."""
    entries = config.get("parameters") or []
    assert isinstance(entries, list)
    return {str(entry["key"]) for entry in entries if isinstance(entry, dict)}


def render_repository(svc: ServiceSpec, engine_dir: str) -> dict[str, str]:
    """Every model of the service -> its ``config.pbtxt`` text, in :func:`model_names` order.

    ``engine_dir`` is where the engine directory is mounted in the pod (``/engines/<key>``).
    Each model's parameters are checked against ``render/model_parameters.py``.
    """
    variant = svc.model.variant
    _check_variant(variant)
    paths = engine_paths(engine_dir)
    models: dict[str, dict[str, Value]] = {orchestrator(variant): _orchestrator(svc, paths)}
    if variant == "cosyvoice2":
        models["tensorrt_llm"] = _tensorrt_llm(svc, paths)
    models["token2wav"] = _token2wav(svc, paths)
    if variant == "cosyvoice3":
        models["vocoder"] = _vocoder(svc, paths)
    models["audio_tokenizer"] = _audio_tokenizer(svc, paths)
    models["speaker_embedding"] = _speaker_embedding(svc, paths)
    assert tuple(models) == model_names(svc)
    for name, config in models.items():
        MODEL_PARAMETERS[variant][name].check(name, parameter_keys(config))
    return {name: message_text(config) for name, config in models.items()}
