"""The Triton model repository of a CosyVoiceService: one ``config.pbtxt`` per model (pure).

``render_repository(svc, engine_dir)`` returns ``{model name: config.pbtxt text}``; the
model code (upstream's Python models) comes from the serving image, the engine files from
the engine directory mounted at ``engine_dir``. Nothing here reads a file or the cluster.

From upstream (FunAudioLLM/CosyVoice, ``runtime/triton_trtllm`` at commit ace7c47: the
templates ``model_repo/*/config.pbtxt`` and ``model_repo_cosyvoice3/*/config.pbtxt``, the
parameter reads of their ``model.py``, the values ``run.sh`` / ``run_cosyvoice3.sh`` fill in):

- the topology (:data:`MODEL_NAMES`), each model's backend and every input and output
  (name, type, dims, optional, reshape, ragged batching); ``tensorrt_llm``'s interface is the
  TensorRT-LLM backend's own, with upstream's ``TYPE_FP16`` encoder features and
  ``TYPE_FP32`` logits;
- which models are decoupled when streaming: the orchestrator, and CosyVoice2's
  ``tensorrt_llm`` (upstream fills both from one ``decoupled_mode``);
- the parameter keys upstream's model code reads (``model_dir``, ``llm_tokenizer_dir``,
  ``dynamic_chunk_strategy``, ``llm_api_base``, the TensorRT-LLM backend's keys) and
  ``tensorrt_llm``'s values from ``run.sh`` (``inflight_fused_batching``, beam width 1,
  attention window 2560, ``kv_cache_free_gpu_mem_fraction`` 0.5, input excluded from the
  output, no KV-cache reuse, the executor worker's path in the image);
- the orchestrator instances of one GPU: upstream's ``bls_instance_num`` (4 for CosyVoice2,
  10 for CosyVoice3), which it runs on one GPU;
- priority levels only on CosyVoice3's ``token2wav``, the one model whose caller sends a
  priority per chunk (``chunk_index + 1``: first chunks first). Upstream sends it as a BLS
  request parameter named ``priority``; python_backend's ``request_executor.cc`` hands BLS
  parameters to Triton as plain request parameters, not as the scheduling priority, so
  whether it reorders anything must be checked on the serving image.

Ours:

- **Every GPU of the pod is used.** Upstream pins everything to GPU 0 (``gpus: [0]``,
  ``CUDA_VISIBLE_DEVICES=0``) and declares most GPU models ``KIND_CPU``. Here every model that
  runs on a GPU (token2wav, vocoder, audio_tokenizer, speaker_embedding) gets
  ``instance_group [{ count: instancesPerGpu, kind: KIND_GPU, gpus: [0 .. gpusPerReplica-1] }]``:
  Triton starts ``count`` instances on each listed GPU.
- **The LLM runs once per tensor-parallel group** (:func:`llm_groups`). CosyVoice2's
  ``tensorrt_llm`` keeps ``KIND_CPU`` with one instance per group and ``gpu_device_ids`` with
  one entry per group (``"0,1;2,3"``): the TensorRT-LLM backend ignores ``instance_group``
  for GPU placement and places instance *i* on the *i*-th entry; the numbers of instances
  and of entries must be equal, and Triton core balances requests over them in the
  backend's orchestrator mode (``TRTLLM_ORCHESTRATOR=1``, :func:`server_environment`; the
  backend's ``docs/llama_multi_instance.md``). CosyVoice3 has no ``tensorrt_llm`` model:
  one ``trtllm-serve`` per group runs beside Triton on ports :data:`LLM_BASE_PORT` + i
  (8010, 8011, ...; upstream's default 8000 is Triton's HTTP port), and the orchestrator
  gets every URL (``llm_api_bases``, comma-separated) besides upstream's single
  ``llm_api_base`` (the first). Upstream's pinned ``model.py`` reads only ``llm_api_base``:
  spreading over the groups needs the serving image's orchestrator to read
  ``llm_api_bases``.
- **The orchestrator** (Python BLS, no GPU of its own) stays ``KIND_CPU``
  (:func:`orchestrator_instances`). A CosyVoice2 stream holds one instance for its whole
  synthesis (upstream's ``execute`` is synchronous), so the count is the pod's stream
  concurrency. Upstream runs 4 per GPU, which leaves an LLM engine built for 16 sequences
  three-quarters idle: on the lent H200, with stand-ins of CosyVoice2's shape, a pod with 4
  orchestrator instances saturated at 2.8 requests/s, one with 16 at 7.7 and one with 32
  (and an engine of 32 sequences) at 11.2 (``bench/results/gpu-sweep.json``). So CosyVoice2
  gets one instance per LLM sequence slot, ``engine.maxBatchSize`` per tensor-parallel
  group, and never fewer than upstream's 4 per GPU; CosyVoice3 keeps upstream's 10 per GPU
  (not measured). The count does not grow with ``instancesPerGpu``; every instance is a
  Python process of its own (host memory: size ``serving.resources`` for it). Its
  ``max_batch_size`` is 1 (upstream: 16 for CosyVoice2, 1 for CosyVoice3): upstream's
  CosyVoice2 ``execute`` runs the requests of a batch one after another, so a request
  batched behind another would wait inside ``execute``, unseen by
  ``nv_inference_queue_duration_us``, the signal the autoscaler reads.
- **Batching** comes from the spec: every batching model gets ``max_queue_delay_microseconds``
  and the preferred sizes capped to its own ``max_batch_size`` (engine.maxBatchSize for
  ``tensorrt_llm`` and the GPU models, as the CRD documents; 1 for the orchestrator).
  ``priority_levels`` (and the default level, the lowest) only where upstream's caller sends
  priorities; 0 turns them off. ``tensorrt_llm``'s KV cache holds a full attention window for
  every batch slot (``max_tokens_in_paged_kv_cache`` = maxBatchSize x 2560; upstream's 2560
  fits about two streams into an engine built for 16), still capped by the free-memory
  fraction.
- **Paths** point inside ``engine_dir``, the builder's layout
  (``engine-builder/cosyvoice_engine_builder/layout.py``): ``llm/`` the TensorRT-LLM engine,
  ``model/`` the model directory (its ``llm/`` the tokenizer), ``plans/`` the prebuilt
  TensorRT plans, ``manifest.json``. Plan file names carry the GPU architecture and the
  TensorRT version, which only the manifest knows (``layout.flowEstimatorPlan``,
  ``layout.speakerEmbeddingPlan``): the models that load plans get ``engine_manifest`` and
  ``plans_dir``. Upstream's pinned code instead looks for its own plan names in
  ``model_dir`` and builds them when absent, which a read-only engine mount refuses. So
  ``model_dir`` is :data:`MODEL_VIEW`, a writable directory the serving entrypoint
  (``cosyvoice-engine-builder serve``) fills at start: links to the engine's ``model/`` files
  and, under the names upstream's code asks for, to the plans the build Job prebuilt (it reads
  their names from the manifest).

The article's levers (issue 14):

- **vLLM** (``spec.model.llmRuntime: vllm``): the LLM runs beside Triton for both variants
  (:func:`llm_beside_triton`), one ``vllm serve`` per tensor-parallel group on the same ports
  as CosyVoice3's trtllm-serve; CosyVoice2 then has no ``tensorrt_llm`` model
  (:func:`model_names`) and its orchestrator gets ``llm_api_base(s)`` like CosyVoice3's, plus
  ``llm_runtime`` and ``llm_served_model_name`` (vLLM refuses any other model name). The
  tokenizer is the fetched checkpoint's (``checkpoint_dir``); the plans stay per architecture.
  Upstream's pinned CosyVoice2 orchestrator has no OpenAI-client path: the serving image's
  must have one (upstream's Step-Audio2 DiT orchestrator does).
- **Queue policy** (``spec.serving.queuePolicy``): only on the orchestrator, the queue clients
  wait in (``default_queue_policy``; per-priority ``priority_queue_policy`` entries give it
  ``priority_levels`` too). The inner models get none: a rejected chunk would break a stream
  already playing.
- **Stream chunking** (``spec.serving.streamChunking``): ``dynamic_chunk_strategy`` from
  ``hopGrowth``, and ``token_hop_len`` only when it is not upstream's 15, so that a service
  that never set it keeps its repository (and its pods) as they were. Upstream's pinned
  orchestrator hard-codes 15: reading ``token_hop_len`` is the serving image's job.

Device memory between GPUs. A tensor that one model leaves on GPU *a* and another model on
GPU *b* reads as device memory fails (TensorRT-LLM discussion #15476). What this
repository does about it:

- every Python-backend model gets ``FORCE_CPU_ONLY_INPUT_TENSORS: "yes"`` written out (the
  backend's default, pinned so that it cannot be flipped unnoticed; upstream sets ``"no"``
  only on ``tensorrt_llm``: a Python-backend key, which the C++ TensorRT-LLM backend does
  not read, so it is left out there):
  Triton hands every input of those models over in host memory, whatever memory the
  producer used. That covers every hop into token2wav, vocoder, audio_tokenizer,
  speaker_embedding and the orchestrator;
- the orchestrator, the only model that calls others, has no GPU (``KIND_CPU``), and its
  inputs to ``tensorrt_llm`` are NumPy arrays in upstream's code (host memory).

What it cannot do: the memory of a BLS *response* is chosen by the caller
(``pb_utils.InferenceRequest(..., preferred_memory=PreferredMemory(TRITONSERVER_MEMORY_CPU))``;
by default it is the producer's). Upstream's orchestrators do not ask for host memory and
move tensors to ``cuda`` (device 0) themselves; upstream's CosyVoice3 token2wav copies its
mel to the host before answering ("otherwise, dlpack bug"), the other models answer from
the GPU. The real protection therefore lives in the Python model code the serving image
takes at a pinned commit; the CPU twin's stand-ins (``tests/triton_twin``) show the pattern
(host-memory responses, NumPy everywhere). Likewise, upstream's models use ``cuda`` (device
0 of the process) and ignore the ``model_instance_device_id`` Triton passes to each
``KIND_GPU`` instance: unpatched, every instance would run on GPU 0.

State in instances. Upstream's CosyVoice2 ``token2wav`` keeps each stream's vocoder cache in
the instance that served its previous chunk (keyed by request id). With more than one
instance (``gpusPerReplica`` or ``instancesPerGpu`` above 1) Triton may send the next chunk
to another instance, which upstream's code does not survive (a missing cache entry at
``finalize``). Keeping a stream on one instance needs sequence batching with a correlation
id that the orchestrator sends, i.e. a change of the model code too; the CPU twin's
stand-in refuses such a chunk, so the hazard is visible there. CosyVoice3's token2wav and
vocoder are stateless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from cosyvoice_operator.api.spec import (
    UPSTREAM_FIRST_CHUNK_TOKENS,
    VARIANTS,
    QueuePolicy,
    QueuePolicySpec,
    ServiceSpec,
)

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
# The model directory the serving entrypoint assembles in the pod (see the module docstring).
MODEL_VIEW = "/tmp/model_view"
LLM_CHAT_PATH = "/v1/chat/completions"
# The model name the vLLM servers answer to, and the orchestrator asks for (vLLM refuses a
# chat completion for any other name; trtllm-serve ignores it).
VLLM_SERVED_MODEL_NAME = "cosyvoice-llm"
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
    """Whether the LLM runs as its own server beside Triton: CosyVoice3's trtllm-serve, or
    vLLM for either variant. Only CosyVoice2 on TensorRT-LLM keeps it inside Triton."""
    return svc.model.variant == "cosyvoice3" or svc.model.llm_runtime == "vllm"


def llm_ports(svc: ServiceSpec) -> list[int]:
    """The port of each group's LLM server (8010, 8011, ...); none when the LLM is in Triton."""
    if not llm_beside_triton(svc):
        return []
    return [LLM_BASE_PORT + i for i in range(len(llm_groups(svc)))]


def llm_urls(svc: ServiceSpec) -> list[str]:
    """The chat-completions URL of each LLM server, in group order."""
    return [f"http://localhost:{port}{LLM_CHAT_PATH}" for port in llm_ports(svc)]


def orchestrator_instances(svc: ServiceSpec) -> int:
    """Instances of the orchestrator in one pod: upstream's per-GPU count times the GPUs, and
    for CosyVoice2 at least one per LLM sequence slot (see the module docstring)."""
    _check_variant(svc.model.variant)
    upstream = ORCHESTRATOR_INSTANCES_PER_GPU[svc.model.variant] * svc.serving.gpus_per_replica
    if svc.model.variant != "cosyvoice2":
        return upstream
    return max(upstream, svc.engine.max_batch_size * len(llm_groups(svc)))


def server_environment(svc: ServiceSpec) -> dict[str, str]:
    """Environment tritonserver needs for this repository.

    CosyVoice2 on TensorRT-LLM: the TensorRT-LLM backend's orchestrator mode, in which it
    spawns one executor per ``gpu_device_ids`` entry and Triton core balances requests over
    them.
    """
    return {"TRTLLM_ORCHESTRATOR": "1"} if not llm_beside_triton(svc) else {}


# ---- protobuf text format ------------------------------------------------------------------


@dataclass(frozen=True)
class _Enum:
    name: str


Value: TypeAlias = "str | int | bool | _Enum | list[Value] | dict[str, Value]"


def _quote(text: str) -> str:
    if any(not ch.isprintable() for ch in text):
        raise ValueError(f"unprintable character in {text!r}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _scalar(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, _Enum):
        return value.name
    if isinstance(value, str):
        return _quote(value)
    raise TypeError(f"not a scalar: {value!r}")


def _inline(message: dict[str, Value]) -> str:
    parts: list[str] = []
    for key, value in message.items():
        if isinstance(value, dict):
            parts.append(f"{key} {_inline(value)}")
        elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
            raise TypeError(f"{key}: a list of messages is not written inline")
        elif isinstance(value, list):
            parts.append(f"{key}: {_scalar_list(value)}")
        else:
            parts.append(f"{key}: {_scalar(value)}")
    return "{ " + ", ".join(parts) + " }"


def _scalar_list(values: list[Value]) -> str:
    return "[ " + "".join(f"{_scalar(v)}, " for v in values)[:-2] + " ]" if values else "[ ]"


_WIDTH = 110


def _lines(message: dict[str, Value], indent: str) -> list[str]:
    out: list[str] = []
    for key, value in message.items():
        if isinstance(value, dict):
            out += [f"{indent}{key} {{", *_lines(value, indent + "  "), f"{indent}}}"]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            # Each entry on one line when it fits (tensors, parameters), else as a block.
            out.append(f"{indent}{key} [")
            for i, item in enumerate(value):
                assert isinstance(item, dict)
                comma = "," if i < len(value) - 1 else ""
                one_line = f"{indent}  {_inline(item)}{comma}"
                if len(one_line) <= _WIDTH and not _nested_lists(item):
                    out.append(one_line)
                else:
                    out += [f"{indent}  {{", *_lines(item, indent + "    "), f"{indent}  }}{comma}"]
            out.append(f"{indent}]")
        elif isinstance(value, list):
            out.append(f"{indent}{key}: {_scalar_list(value)}")
        else:
            out.append(f"{indent}{key}: {_scalar(value)}")
    return out


def _nested_lists(message: dict[str, Value]) -> bool:
    return any(
        isinstance(v, list) and any(isinstance(x, dict) for x in v) for v in message.values()
    )


def _text(message: dict[str, Value]) -> str:
    return "\n".join(_lines(message, "")) + "\n"


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
        "data_type": _Enum(f"TYPE_{dtype}"),
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
        "timeout_action": _Enum(policy.timeout_action.upper()),
        "default_timeout_microseconds": policy.default_timeout_microseconds,
        "allow_timeout_override": policy.allow_timeout_override,
        "max_queue_size": policy.max_queue_size,
    }


def _gpu_instances(svc: ServiceSpec) -> list[Value]:
    return [
        {
            "count": svc.serving.instances_per_gpu,
            "kind": _Enum("KIND_GPU"),
            "gpus": list[Value](range(svc.serving.gpus_per_replica)),
        }
    ]


def _cpu_instances(count: int) -> list[Value]:
    return [{"count": count, "kind": _Enum("KIND_CPU")}]


def _decoupled(svc: ServiceSpec) -> dict[str, Value]:
    return {"decoupled": svc.serving.streaming}


# Python models: inputs always in host memory (see the module docstring).
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
    if llm_beside_triton(svc):
        urls = llm_urls(svc)
        params["llm_api_base"] = urls[0]
        params["llm_api_bases"] = ",".join(urls)
    if svc.model.llm_runtime == "vllm":
        params["llm_runtime"] = "vllm"
        params["llm_served_model_name"] = VLLM_SERVED_MODEL_NAME
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
    output = (
        _tensor("mel", "FP32", [80, -1])
        if svc.model.variant == "cosyvoice3"
        else _tensor("waveform", "FP32", [-1])
    )
    return _python_model(
        "token2wav",
        svc,
        [
            _tensor("target_speech_tokens", "INT32", [-1]),
            _tensor("prompt_speech_tokens", "INT32", [-1], optional=True),
            _tensor("prompt_speech_feat", "FP16", [-1, 80], optional=True),
            _tensor("prompt_spk_embedding", "FP16", [-1], optional=True),
            _tensor("token_offset", "INT32", [1], scalar=True, optional=True),
            _tensor("finalize", "BOOL", [1], scalar=True, optional=True),
        ],
        [output],
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
    """The models of the service's repository: its variant's, less ``tensorrt_llm`` when the
    LLM runs beside Triton (vLLM)."""
    _check_variant(svc.model.variant)
    names = MODEL_NAMES[svc.model.variant]
    return tuple(n for n in names if n != "tensorrt_llm" or not llm_beside_triton(svc))


def render_repository(
    svc: ServiceSpec, engine_dir: str, checkpoint_dir: str = ""
) -> dict[str, str]:
    """Every model of the service -> its ``config.pbtxt`` text, in :func:`model_names` order.

    ``engine_dir`` is where the engine directory is mounted in the pod (``/engines/<key>``);
    with vLLM it holds the plans, and ``checkpoint_dir`` the fetched release (its ``model/``
    directory, tokenizer included).
    """
    variant = svc.model.variant
    _check_variant(variant)
    paths = engine_paths(engine_dir)
    model_paths = engine_paths(checkpoint_dir) if checkpoint_dir else paths
    models: dict[str, dict[str, Value]] = {orchestrator(variant): _orchestrator(svc, model_paths)}
    if "tensorrt_llm" in model_names(svc):
        models["tensorrt_llm"] = _tensorrt_llm(svc, paths)
    models["token2wav"] = _token2wav(svc, paths)
    if variant == "cosyvoice3":
        models["vocoder"] = _vocoder(svc, paths)
    models["audio_tokenizer"] = _audio_tokenizer(svc, paths)
    models["speaker_embedding"] = _speaker_embedding(svc, paths)
    assert tuple(models) == model_names(svc)
    return {name: _text(config) for name, config in models.items()}
