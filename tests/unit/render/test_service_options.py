"""The article's levers as service options (issue 14), end to end through the pure core:
the spec (defaults, refusals naming the field), what Triton is given (queue policy, stream
chunking, vLLM's URLs), the serving pods (vLLM's servers and checkpoint), and the lifecycle
of vLLM's architecture-free checkpoint (prefetched once, gating every architecture)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from cosyvoice_operator.api import engine_identity, labels, spec
from cosyvoice_operator.api.effects import ApplyObject, CreateObject
from cosyvoice_operator.cli.main import main
from cosyvoice_operator.plan import engine_state, engine_status
from cosyvoice_operator.plan.service import WARNING_REASONS, Policy, plan_service
from cosyvoice_operator.render import build_job, triton, workloads
from cosyvoice_operator.render.workloads import ArchServing, ServingSettings
from tests.unit.objects import CACHE, T0, job, raw_spec, record, service
from tests.unit.world import FakeWorld

ENGINE_DIR = "/engines/" + "e" * 40
CHECKPOINT_DIR = "/engines/" + "c" * 40
L20 = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L20"}}
POLICY = Policy()


def parse_config(text: str) -> Any:
    return text_format.Parse(text, mc.ModelConfig())


def params(config: Any) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


# ---- the spec --------------------------------------------------------------------------------


def test_defaults_are_upstreams_and_change_nothing() -> None:
    svc = service()
    assert svc.model.llm_runtime == "tensorrt-llm"
    assert svc.engine.kv_cache_type == "auto"
    assert svc.engine.smooth_quant is None
    assert svc.serving.queue_policy is None
    assert svc.serving.stream_chunking == spec.StreamChunking(15, "exponential")


def test_the_full_set_of_levers_parses() -> None:
    svc = service(
        engine={"precision": "int8-smoothquant", "kvCacheType": "int8"},
        serving={
            "dynamicBatching": {"priorityLevels": 3},
            "queuePolicy": {
                "maxQueueSize": 16,
                "defaultTimeoutMicroseconds": 250000,
                "timeoutAction": "Delay",
                "priorityPolicies": [
                    {"priorityLevel": 2, "maxQueueSize": 4},
                    {"priorityLevel": 1, "allowTimeoutOverride": True},
                ],
            },
            "streamChunking": {"firstChunkTokens": 5, "hopGrowth": "time-based"},
        },
    )
    assert svc.engine.smooth_quant == spec.SmoothQuant(0.5, True, True)
    queue = svc.serving.queue_policy
    assert queue is not None
    assert queue.default == spec.QueuePolicy(16, 250000, "Delay", False)
    # Sorted by level, each with Triton's "no bound, no timeout" where not given.
    assert [p.priority_level for p in queue.priority_policies] == [1, 2]
    assert queue.priority_policies[0].policy == spec.QueuePolicy(0, 0, "Reject", True)
    assert queue.priority_policies[1].policy.max_queue_size == 4
    assert svc.serving.stream_chunking == spec.StreamChunking(5, "time-based")


@pytest.mark.parametrize(
    ("sections", "field", "words"),
    [
        (
            {"model": {"llmRuntime": "vllm"}, "engine": {"precision": "fp8"}},
            "spec.engine.precision",
            "with spec.model.llmRuntime vllm use bfloat16 or float16",
        ),
        (
            {"model": {"llmRuntime": "vllm"}, "engine": {"kvCacheType": "int8"}},
            "spec.engine.kvCacheType",
            "vLLM quantizes its KV cache to fp8 only",
        ),
        (
            {"engine": {"precision": "fp8", "kvCacheType": "int8"}},
            "spec.engine.kvCacheType",
            "cannot go with spec.engine.precision fp8",
        ),
        (
            {"engine": {"precision": "int8-smoothquant", "kvCacheType": "fp8"}},
            "spec.engine.kvCacheType",
            "cannot go with spec.engine.precision int8-smoothquant",
        ),
        (
            {"engine": {"smoothQuant": {"alpha": 0.3}}},
            "spec.engine.smoothQuant",
            "only read with spec.engine.precision int8-smoothquant",
        ),
        (
            {"engine": {"precision": "int8-smoothquant", "smoothQuant": {"alpha": 2}}},
            "spec.engine.smoothQuant.alpha",
            "between 0 and 1",
        ),
        (
            {"model": {"llmRuntime": "sglang"}},
            "spec.model.llmRuntime",
            "must be one of tensorrt-llm, vllm",
        ),
        (
            {"serving": {"queuePolicy": {"priorityPolicies": [{"priorityLevel": 3}]}}},
            "spec.serving.queuePolicy.priorityPolicies[0].priorityLevel",
            "must be <= spec.serving.dynamicBatching.priorityLevels (2)",
        ),
        (
            {
                "serving": {
                    "queuePolicy": {
                        "priorityPolicies": [{"priorityLevel": 1}, {"priorityLevel": 1}]
                    }
                }
            },
            "spec.serving.queuePolicy.priorityPolicies[1].priorityLevel",
            "has a policy already",
        ),
        (
            {"serving": {"queuePolicy": {"timeoutAction": "Drop"}}},
            "spec.serving.queuePolicy.timeoutAction",
            "must be one of Reject, Delay",
        ),
        (
            {"serving": {"streamChunking": {"firstChunkTokens": 0}}},
            "spec.serving.streamChunking.firstChunkTokens",
            "between 1 and 750",
        ),
    ],
)
def test_refusals_name_the_field(sections: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(spec.SpecError) as err:
        spec.parse(raw_spec(**sections))
    assert err.value.field == field
    assert words in str(err.value)


# ---- Triton: queue policy and stream chunking ------------------------------------------------


def test_without_the_new_fields_the_repository_is_as_before() -> None:
    """No queue policy, no token_hop_len: the golden repositories stay byte for byte."""
    for variant, uri in (
        ("cosyvoice2", "hf://FunAudioLLM/CosyVoice2-0.5B"),
        ("cosyvoice3", "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"),
    ):
        golden = Path(__file__).parent / "golden" / "triton" / f"{variant}-1gpu"
        svc = service(
            model={"variant": variant, "uri": uri},
            serving={"streamChunking": {"firstChunkTokens": 15, "hopGrowth": "exponential"}},
        )
        repository = triton.render_repository(
            svc, "/engines/0123456789abcdef0123456789abcdef01234567"
        )
        for name, text in repository.items():
            assert text == (golden / f"{name}.pbtxt").read_text(), f"{variant}/{name}"


@pytest.mark.parametrize("variant", ["cosyvoice2", "cosyvoice3"])
def test_queue_policy_is_on_the_orchestrators_queue_only(variant: str) -> None:
    svc = service(
        model={"variant": variant},
        serving={
            "queuePolicy": {
                "maxQueueSize": 8,
                "defaultTimeoutMicroseconds": 200000,
                "priorityPolicies": [
                    {"priorityLevel": 1, "defaultTimeoutMicroseconds": 0},
                    {"priorityLevel": 2, "maxQueueSize": 2, "timeoutAction": "Delay"},
                ],
            }
        },
    )
    repository = {
        name: parse_config(text) for name, text in triton.render_repository(svc, ENGINE_DIR).items()
    }
    batching = repository[variant].dynamic_batching
    default = batching.default_queue_policy
    assert default.max_queue_size == 8
    assert default.default_timeout_microseconds == 200000
    assert default.timeout_action == mc.ModelQueuePolicy.REJECT
    assert not default.allow_timeout_override
    # Per-priority policies give the orchestrator the levels, new requests at the lowest.
    assert (batching.priority_levels, batching.default_priority_level) == (2, 2)
    assert set(batching.priority_queue_policy) == {1, 2}
    assert batching.priority_queue_policy[1].default_timeout_microseconds == 0
    assert batching.priority_queue_policy[2].max_queue_size == 2
    assert batching.priority_queue_policy[2].timeout_action == mc.ModelQueuePolicy.DELAY
    # A stream's later chunks must never be dropped: no policy on the inner models.
    for name, config in repository.items():
        if name != variant:
            assert not config.dynamic_batching.HasField("default_queue_policy"), name
            assert not config.dynamic_batching.priority_queue_policy, name


def test_a_default_policy_alone_keeps_the_orchestrator_single_level() -> None:
    svc = service(serving={"queuePolicy": {"maxQueueSize": 4}})
    batching = parse_config(
        triton.render_repository(svc, ENGINE_DIR)["cosyvoice3"]
    ).dynamic_batching
    assert batching.default_queue_policy.max_queue_size == 4
    assert batching.priority_levels == 0


@pytest.mark.parametrize(
    ("chunking", "expected"),
    [
        ({}, {"dynamic_chunk_strategy": "exponential"}),
        (
            {"firstChunkTokens": 5},
            {"dynamic_chunk_strategy": "exponential", "token_hop_len": "5"},
        ),
        ({"hopGrowth": "equal"}, {"dynamic_chunk_strategy": "equal"}),
        (
            {"firstChunkTokens": 25, "hopGrowth": "time-based"},
            {"dynamic_chunk_strategy": "time_based", "token_hop_len": "25"},
        ),
    ],
)
def test_stream_chunking_reaches_the_orchestrator(
    chunking: dict[str, Any], expected: dict[str, str]
) -> None:
    svc = service(serving={"streamChunking": chunking})
    got = params(parse_config(triton.render_repository(svc, ENGINE_DIR)["cosyvoice3"]))
    assert {k: got[k] for k in got if k in ("dynamic_chunk_strategy", "token_hop_len")} == expected


# ---- Triton and the pod with vLLM ------------------------------------------------------------


def test_vllm_cosyvoice2_has_no_tensorrt_llm_model_and_calls_the_servers() -> None:
    svc = service(
        model={
            "variant": "cosyvoice2",
            "uri": "hf://FunAudioLLM/CosyVoice2-0.5B",
            "llmRuntime": "vllm",
        },
        engine={"tensorParallelSize": 2},
        serving={"gpusPerReplica": 4},
    )
    repository = triton.render_repository(svc, ENGINE_DIR, CHECKPOINT_DIR)
    assert tuple(repository) == (
        "cosyvoice2",
        "token2wav",
        "audio_tokenizer",
        "speaker_embedding",
    )
    orchestrator = params(parse_config(repository["cosyvoice2"]))
    assert orchestrator["llm_api_base"] == "http://localhost:8010/v1/chat/completions"
    assert orchestrator["llm_api_bases"] == (
        "http://localhost:8010/v1/chat/completions,http://localhost:8011/v1/chat/completions"
    )
    assert orchestrator["llm_runtime"] == "vllm"
    assert orchestrator["llm_served_model_name"] == "cosyvoice-llm"
    # The tokenizer is the checkpoint's; the plans stay in the architecture's directory.
    assert orchestrator["llm_tokenizer_dir"] == f"{CHECKPOINT_DIR}/model/llm"
    assert params(parse_config(repository["token2wav"]))["plans_dir"] == f"{ENGINE_DIR}/plans"
    assert triton.server_environment(svc) == {}


def test_vllm_pod_runs_a_server_per_group_on_the_mounted_checkpoint() -> None:
    svc = service(
        model={"llmRuntime": "vllm"},
        engine={"precision": "float16", "kvCacheType": "fp8", "tensorParallelSize": 2},
        serving={"gpusPerReplica": 4},
    )
    body = {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {"name": "tts", "namespace": "ml", "uid": "u"},
        "spec": {},
    }
    plans, ckpt = "p" * 40, "c" * 40
    repo, deployment = workloads.render_architecture(
        body,
        svc,
        ArchServing("sm_90", plans, ("NVIDIA-H100-80GB-HBM3",), 1, ckpt),
        "ml",
        ServingSettings(),
    )
    assert f"{workloads.ENGINES_MOUNT}/{ckpt}/model/llm" in repo["data"]["cosyvoice3.pbtxt"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == ServingSettings().default_vllm_image
    args = container["args"]

    def flag(name: str) -> str:
        return str(args[args.index(name) + 1])

    assert flag("--llm-runtime") == "vllm"
    assert flag("--checkpoint-dir") == f"/engines/{ckpt}"
    assert flag("--checkpoint-key") == ckpt
    assert flag("--llm-groups") == "0,1;2,3"
    assert (flag("--llm-dtype"), flag("--llm-kv-cache-dtype")) == ("float16", "fp8")
    assert (flag("--llm-max-batch-size"), flag("--llm-max-num-tokens")) == ("16", "32768")
    assert flag("--llm-gpu-memory-utilization") == "0.4"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[f"/engines/{ckpt}"] == {
        "name": "engines",
        "mountPath": f"/engines/{ckpt}",
        "subPath": ckpt,
        "readOnly": True,
    }
    assert mounts[f"/engines/{plans}"]["subPath"] == plans
    # Each vLLM server's port is named, for its /metrics (a PodMonitor scrapes them).
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (ports["llm-0"], ports["llm-1"]) == (8010, 8011)
    assert deployment["metadata"]["annotations"][labels.CHECKPOINT_ANNOTATION] == ckpt


def test_a_tensorrt_llm_pod_is_unchanged_by_the_new_arguments() -> None:
    svc = service()
    args = workloads.serve_args(svc, "k" * 40, ServingSettings())
    assert "--llm-runtime" not in args and "--checkpoint-dir" not in args
    with pytest.raises(ValueError, match="checkpoint"):
        workloads.serve_args(service(model={"llmRuntime": "vllm"}), "k" * 40, ServingSettings())


# ---- the lifecycle of vLLM's checkpoint ------------------------------------------------------


def vllm_body() -> dict[str, Any]:
    return {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {
            "name": "svc",
            "namespace": "ml",
            "uid": "svc-uid",
            "generation": 1,
            "resourceVersion": "7",
        },
        "spec": raw_spec(model={"llmRuntime": "vllm"}, serving=L20, replicas=1),
        "status": {},
    }


def _plan() -> engine_identity.EnginePlan:
    svc = service(model={"llmRuntime": "vllm"}, serving=L20)
    return engine_identity.plan(svc, FakeWorld().gpu_nodes(), POLICY.build.default_builder_image)


def test_a_vllm_service_prefetches_its_checkpoint_beside_the_plans_build() -> None:
    step = plan_service(vllm_body(), FakeWorld(), T0, POLICY)
    jobs = [c.body for c in step.creates if isinstance(c, CreateObject)]
    assert [j["spec"]["template"]["spec"]["containers"][0]["args"][0] for j in jobs] == [
        "build",
        "prefetch",
    ]
    plan = _plan()
    assert plan.checkpoint is not None
    assert {ref.key for ref in step.wants} == {plan.targets[0].key, plan.checkpoint.key}
    assert step.status is not None
    entries = step.status.changes["engines"]
    assert [(e["gpuProduct"], e.get("artifact")) for e in entries] == [
        ("", "checkpoint"),
        ("NVIDIA-L20", None),
    ]


def test_plans_ready_but_checkpoint_not_yet_deploys_nothing() -> None:
    plan = _plan()
    assert plan.checkpoint is not None
    plans = plan.targets[0].identity
    world = FakeWorld()
    built = job(plans, 1, complete_at=T0)
    world.job_list.append(built)
    world.records[build_job.record_name(plans, CACHE)] = record(
        plans, built["metadata"]["name"], T0
    )
    world.job_list.append(job(plan.checkpoint.identity, 1))  # still fetching
    step = plan_service(vllm_body(), world, T0, POLICY)
    assert not [w for w in step.workloads if isinstance(w, ApplyObject)]
    assert step.status is not None
    ready = next(c for c in step.status.changes["conditions"] if c["type"] == "EngineReady")
    assert ready["status"] == "False"
    assert step.status.changes["engineSummary"] == "Building 1/2"


def test_with_both_ready_the_deployment_serves_from_the_checkpoint() -> None:
    plan = _plan()
    assert plan.checkpoint is not None
    world = FakeWorld()
    for ident in (plan.targets[0].identity, plan.checkpoint.identity):
        world.records[build_job.record_name(ident, CACHE)] = record(ident, "j-a1", T0)
    step = plan_service(vllm_body(), world, T0, POLICY)
    deployments = [
        w.body
        for w in step.workloads
        if isinstance(w, ApplyObject) and w.body["kind"] == "Deployment"
    ]
    assert len(deployments) == 1
    args = deployments[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--checkpoint-key") + 1] == plan.checkpoint.key
    # The cleanup keeps both while they are served.
    assert step.served_keys == {plan.targets[0].key, plan.checkpoint.key}
    assert step.status is not None
    ready = next(c for c in step.status.changes["conditions"] if c["type"] == "EngineReady")
    assert ready["status"] == "True"
    assert "the vLLM checkpoint" in ready["message"]


def test_status_summary_counts_the_checkpoint() -> None:
    plan = _plan()
    assert plan.checkpoint is not None
    states = {
        plan.targets[0].key: engine_state.EngineState("Ready", "built"),
        plan.checkpoint.key: engine_state.EngineState("Failed", "fetch failed: 401"),
    }
    new = engine_status.engine_status(plan, states, [], None, {}, 1, T0)
    assert new["engineSummary"] == "Failed 1/2"
    ready = next(c for c in new["conditions"] if c["type"] == "EngineReady")
    assert (ready["status"], ready["reason"]) == ("False", "BuildFailed")
    assert ready["message"] == "fetch failed: 401"


def test_the_kv_cache_refusal_is_a_warning_reason() -> None:
    assert "KVCacheUnsupported" in WARNING_REASONS


# ---- `render` shows each option's effect -----------------------------------------------------


def _render(tmp_path: Path, capsys: pytest.CaptureFixture[str], **sections: Any) -> list[Any]:
    doc = {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {"name": "tts"},
        "spec": raw_spec(**copy.deepcopy(sections)),
    }
    path = tmp_path / "svc.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["render", "-f", str(path), "--gpu-product", "NVIDIA-L20"]) == 0
    return list(yaml.safe_load_all(capsys.readouterr().out))


def test_render_shows_the_vllm_prefetch_job_and_pods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = _render(tmp_path, capsys, model={"llmRuntime": "vllm"})
    jobs = [d for d in docs if d["kind"] == "Job"]
    assert [j["spec"]["template"]["spec"]["containers"][0]["args"][0] for j in jobs] == [
        "build",
        "prefetch",
    ]
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--llm-runtime" in args and "--checkpoint-dir" in args


def test_render_shows_the_queue_policy_and_chunking_in_the_repository(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = _render(
        tmp_path,
        capsys,
        serving={
            "queuePolicy": {"maxQueueSize": 4, "defaultTimeoutMicroseconds": 100000},
            "streamChunking": {"firstChunkTokens": 5},
        },
        engine={"kvCacheType": "fp8"},
    )
    [repo] = [d for d in docs if d["kind"] == "ConfigMap"]
    config = parse_config(repo["data"]["cosyvoice3.pbtxt"])
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 4
    assert params(config)["token_hop_len"] == "5"
    [build] = [d for d in docs if d["kind"] == "Job"]
    args = build["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--kv-cache-type") + 1] == "fp8"
