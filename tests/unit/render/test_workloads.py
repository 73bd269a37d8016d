"""workloads (the Deployment, Service, PDB and repository ConfigMap of a service) and serving
(which engine each architecture serves, the replica split, what is applied, the status).

Golden files show what the operator would write; regenerate them with
``UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit`` (each test that rewrites a file fails;
rerun without it: ``tests/unit/golden.py``).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cosyvoice_operator.api import engine_identity, labels
from cosyvoice_operator.api.effects import ApplyObject, DeleteObject, PatchObject
from cosyvoice_operator.plan import serving
from cosyvoice_operator.plan.engine_state import EngineState
from cosyvoice_operator.render import workloads
from cosyvoice_operator.render.workloads import ArchServing, ServingSettings
from tests.unit import golden as golden_files
from tests.unit.objects import node, service
from tests.unit.world import FakeWorld

GOLDEN = Path(__file__).parent / "golden"
SETTINGS = ServingSettings()
KEY = "a" * 40
NEW_KEY = "b" * 40


def golden(name: str, obj: Any) -> None:
    path = GOLDEN / name
    text = yaml.safe_dump(json.loads(json.dumps(obj)), sort_keys=False, width=100)
    golden_files.check(path, text)


def body(name: str = "tts", replicas: int = 3, **spec: Any) -> dict[str, Any]:
    raw = {
        "model": {"variant": "cosyvoice3", "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"},
        "replicas": replicas,
        **spec,
    }
    return {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {"name": name, "namespace": "ml", "uid": "svc-uid", "generation": 1},
        "spec": raw,
    }


def test_the_deployment_as_rendered() -> None:
    svc = service(serving={"gpusPerReplica": 2, "resources": {"requests": {"cpu": "8"}}})
    target = ArchServing("sm_90", KEY, ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"), 2)
    golden(
        "serving-deployment.yaml",
        workloads.render_deployment(body(), svc, target, "ml", SETTINGS, "r1"),
    )
    golden("serving-service.yaml", workloads.render_service(body(), "ml"))
    golden("serving-pdb.yaml", workloads.render_disruption_budget(body(), "ml"))
    # Issue 21: who may reach the pods (new on purpose).
    golden("serving-networkpolicy.yaml", workloads.render_network_policy(body(), "ml", SETTINGS))


def test_the_grace_period_covers_prestop_drain_and_the_servers_stop() -> None:
    """Issue 19 item 6: preStop (out of the endpoints), then cosyvoice-serve's drain (the
    streams in flight end), then Triton's and the LLM servers' stop all fit in the grace."""
    settings = ServingSettings(drain_seconds=300)
    dep = workloads.render_deployment(
        body(), service(), ArchServing("sm_90", KEY, ("NVIDIA-H100",), 1), "ml", settings, "r"
    )
    pod = dep["spec"]["template"]["spec"]
    [c] = pod["containers"]
    args = c["args"]

    def arg(name: str) -> int:
        return int(args[args.index(name) + 1])

    prestop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert arg("--drain-seconds") == 300
    assert pod["terminationGracePeriodSeconds"] == (
        prestop + arg("--drain-seconds") + arg("--exit-timeout-seconds") + 15
    )  # 15: cosyvoice-serve's stop grace for the LLM servers (supervisor)
    assert (prestop, arg("--exit-timeout-seconds"), pod["terminationGracePeriodSeconds"]) == (
        10, 30, 355,
    )  # fmt: skip
    # Ready only on cosyvoice-serve's /ready (not draining, every stub alive); live on Triton's.
    health = {"httpGet": {"path": "/ready", "port": "health"}, "timeoutSeconds": 5}
    assert {**c["readinessProbe"], **health} == c["readinessProbe"]
    assert {**c["startupProbe"], **health} == c["startupProbe"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert {"name": "health", "containerPort": arg("--health-port"), "protocol": "TCP"} in c[
        "ports"
    ]


def test_the_pod_is_restricted_sized_and_pinned_to_its_architecture() -> None:
    user_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                ]
            }
        }
    }
    svc = service(serving={"gpusPerReplica": 4, "affinity": user_affinity})
    dep = workloads.render_deployment(
        body(), svc, ArchServing("sm_89", KEY, ("NVIDIA-L20",), 1), "ml", SETTINGS, "r"
    )
    pod = dep["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    # Every OR-ed term of the user's affinity also requires the architecture's products.
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert len(terms) == 2
    for term in terms:
        assert {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L20"]} in (
            term["matchExpressions"]
        )
    # Only this engine's directory, read-only.
    [engines] = [m for m in c["volumeMounts"] if m["name"] == "engines"]
    assert engines == {
        "name": "engines", "mountPath": f"/engines/{KEY}", "subPath": KEY, "readOnly": True,
    }  # fmt: skip
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert "--llm-groups" in c["args"] and c["args"][c["args"].index("--llm-groups") + 1] == (
        "0;1;2;3"
    )


@pytest.mark.parametrize(
    ("total", "archs", "expected"),
    [
        (3, [("sm_89", 16), ("sm_90", 32)], {"sm_90": 2, "sm_89": 1}),
        (4, [("sm_89", 16), ("sm_90", 16)], {"sm_89": 2, "sm_90": 2}),
        (1, [("sm_89", 16), ("sm_90", 16)], {"sm_89": 1, "sm_90": 0}),
        (0, [("sm_89", 16)], {"sm_89": 0}),
        (5, [], {}),
    ],
)
def test_replicas_are_dealt_over_architectures_and_add_up(
    total: int, archs: list[tuple[str, int]], expected: dict[str, int]
) -> None:
    shares = workloads.split_replicas(total, archs)
    assert shares == expected
    if archs:
        assert sum(shares.values()) == total


def test_long_service_names_still_make_valid_object_names() -> None:
    name = "x" * 100
    for made in (workloads.service_name(name), workloads.deployment_name(name, "sm_100")):
        assert len(made) <= 63 and made.startswith("cvs-x")
    assert workloads.service_name(name) != workloads.service_name(name[:-1])


# ---- serving.plan_serving ---------------------------------------------------------------


def plan_of(b: dict[str, Any], world: FakeWorld, states: dict[str, str]) -> serving.ServingPlan:
    svc = service(**{k: v for k, v in b["spec"].items() if k != "model"})
    eplan = engine_identity.plan(svc, world.gpu_nodes(), "builder:1")
    by_key = {
        t.key: EngineState(states.get(t.identity.gpu_arch, "Ready"), "m") for t in eplan.targets
    }
    return serving.plan_serving(b, svc, eplan, by_key, world, SETTINGS)


def two_arch_world() -> FakeWorld:
    return FakeWorld(nodes=[node("l20-0", "NVIDIA-L20"), node("h100-0", "NVIDIA-H100-80GB-HBM3")])


def settle(world: FakeWorld, plan: serving.ServingPlan, ready: bool = True) -> None:
    """Apply a plan to the fake world as the API server and the controllers would."""
    for effect in plan.effects:
        assert isinstance(effect, ApplyObject)
        obj = copy.deepcopy(dict(effect.body))
        if obj["kind"] == "Deployment":
            n = obj["spec"]["replicas"]
            obj["status"] = {
                "replicas": n,
                "readyReplicas": n if ready else 0,
                "updatedReplicas": n,
            }
        world.objects[(obj["kind"], obj["metadata"]["name"])] = obj


def test_a_service_gets_one_deployment_per_ready_architecture_then_nothing_to_do() -> None:
    world = two_arch_world()
    b = body(replicas=3)
    first = plan_of(b, world, {})
    kinds = sorted(e.body["kind"] for e in first.effects if isinstance(e, ApplyObject))
    assert kinds == [
        "ConfigMap",
        "ConfigMap",
        "ConfigMap",  # the router's (spec.routing.mode Router by default: issue 30)
        "Deployment",
        "Deployment",
        "Deployment",  # the router's
        "NetworkPolicy",  # issue 21: on by default
        "NetworkPolicy",  # the router's
        "PodDisruptionBudget",
        "PodDisruptionBudget",  # the router's
        "Service",  # cvs-tts, to the router
        "Service",  # cvs-tts-pods, headless: the router finds the Triton pods by it
    ]
    assert first.status["readySummary"] == "0/3"
    settle(world, first)
    second = plan_of(b, world, {})
    assert second.effects == ()  # the hashes match: zero writes
    assert second.ready and second.status["readyReplicas"] == 3
    assert {e["gpuArch"]: e["desiredReplicas"] for e in second.status["serving"]} == {
        "sm_89": 2,
        "sm_90": 1,
    }
    # the Triton pods only (the router's carry the service label too)
    assert second.status["selector"] == (
        "tts.cosyvoice.dev/service=tts,app.kubernetes.io/component=serving"
    )


def test_a_new_engine_not_ready_leaves_the_old_deployment_serving_and_scales_it() -> None:
    world = FakeWorld()
    b = body(replicas=2)
    settle(world, plan_of(b, world, {}))
    changed = body(replicas=3, engine={"precision": "float16"})
    during = plan_of(changed, world, {"sm_89": "Building"})
    [patch] = during.effects  # the replica count only: the old engine keeps serving
    assert isinstance(patch, PatchObject) and patch.patch == {"spec": {"replicas": 3}}
    [progressing] = [c for c in during.conditions if c["type"] == "Progressing"]
    assert progressing["reason"] == "WaitingForEngine"
    assert not during.ready
    old_key = next(iter(during.served_keys))
    failed = plan_of(changed, world, {"sm_89": "Failed"})
    [progressing] = [c for c in failed.conditions if c["type"] == "Progressing"]
    assert (progressing["status"], progressing["reason"]) == ("False", "NewEngineFailed")
    after = plan_of(changed, world, {})
    deployments = [
        e for e in after.effects if isinstance(e, ApplyObject) and e.body["kind"] == "Deployment"
    ]
    [deployment] = deployments
    assert deployment.body["metadata"]["annotations"][labels.SERVED_KEY_ANNOTATION] != old_key


def test_a_batching_change_rolls_the_pods_and_a_replicas_change_does_not() -> None:
    world = FakeWorld()
    settle(world, plan_of(body(replicas=1), world, {}))
    [before] = [
        o for (k, _), o in world.objects.items() if k == "Deployment" and not serving.is_router(o)
    ]
    scaled = plan_of(body(replicas=4), world, {})
    [dep] = [e.body for e in scaled.effects if isinstance(e, ApplyObject)]
    assert dep["spec"]["template"] == before["spec"]["template"]
    batching = {"dynamicBatching": {"maxQueueDelayMicroseconds": 900}}
    rolled = plan_of(body(replicas=1, serving=batching), world, {})
    [dep2] = [
        e.body
        for e in rolled.effects
        if isinstance(e, ApplyObject) and e.body["kind"] == "Deployment"
    ]
    assert dep2["spec"]["template"] != before["spec"]["template"]


def test_an_unschedulable_pod_is_reported_with_the_schedulers_words() -> None:
    world = FakeWorld()
    settle(world, plan_of(body(replicas=2), world, {}), ready=False)
    world.serving_pod_list = [
        {
            "metadata": {"name": "cvs-tts-sm89-1"},
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                    }
                ]
            },
        }
    ]
    plan = plan_of(body(replicas=2), world, {})
    conds = {c["type"]: c for c in plan.conditions}
    assert conds["Progressing"]["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in conds["Progressing"]["message"]
    assert conds["Available"]["status"] == "False"


def test_an_architecture_the_service_leaves_loses_its_deployment() -> None:
    world = two_arch_world()
    settle(world, plan_of(body(), world, {}))
    only_l20 = body(serving={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L20"}})
    plan = plan_of(only_l20, world, {})
    deletes = [e for e in plan.effects if isinstance(e, DeleteObject)]
    assert [d.name for d in deletes] == ["cvs-tts-sm90"]


def test_a_node_going_notready_or_cordoned_never_deletes_its_architectures_fleet() -> None:
    world = two_arch_world()
    settle(world, plan_of(body(), world, {}))
    world.nodes = [
        node("l20-0", "NVIDIA-L20"),
        node("h100-0", "NVIDIA-H100-80GB-HBM3", ready="False"),
    ]
    plan = plan_of(body(), world, {})
    assert not [e for e in plan.effects if isinstance(e, DeleteObject)]
    assert len(plan.served_keys) == 2  # its engine is still served: the cleanup keeps it
    world.nodes = [node("l20-0", "NVIDIA-L20")]  # the last sm_90 node left the cluster
    assert [e.name for e in plan_of(body(), world, {}).effects if isinstance(e, DeleteObject)] == [
        "cvs-tts-sm90"
    ]


def test_a_replica_count_changed_behind_the_operators_back_is_set_again() -> None:
    world = FakeWorld()
    settle(world, plan_of(body(replicas=2), world, {}))
    [dep] = [
        o for (k, _), o in world.objects.items() if k == "Deployment" and not serving.is_router(o)
    ]
    dep["spec"]["replicas"] = 7  # kubectl scale deploy, or a merge patch while frozen
    [effect] = plan_of(body(replicas=2), world, {}).effects
    assert isinstance(effect, ApplyObject) and effect.body["spec"]["replicas"] == 2


@pytest.mark.parametrize(
    "model",
    [
        {"variant": "cosyvoice2"},
        {"variant": "cosyvoice3"},
    ],
    ids=["cosyvoice2", "cosyvoice3"],
)
def test_the_pod_parses_the_rendered_arguments_as_the_operator_means_them(
    model: dict[str, str],
) -> None:
    """The contract between operator and pod: the serving entry point's own parser reads the
    arguments the operator renders, and the model view it assembles is the ``model_dir`` every
    rendered Python model opens."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from cosyvoice_engine_builder.serving.options import ServeOptions, build_parser
    from cosyvoice_operator.render import triton

    svc = service(model=model)
    args = workloads.serve_args(svc, "k" * 40, ServingSettings())
    options = ServeOptions.from_args(build_parser().parse_args(args))
    assert str(options.model_view) == triton.MODEL_VIEW
    assert options.variant == svc.model.variant
    assert str(options.engine_dir) == f"{workloads.ENGINES_MOUNT}/{'k' * 40}"
    assert str(options.repository_config) == workloads.REPO_MOUNT
    assert (options.http_port, options.grpc_port, options.metrics_port) == (
        workloads.HTTP_PORT,
        workloads.GRPC_PORT,
        workloads.METRICS_PORT,
    )
    model_dirs = set()
    for text in triton.render_repository(svc, str(options.engine_dir)).values():
        config = text_format.Parse(text, mc.ModelConfig())
        if "model_dir" in config.parameters:
            model_dirs.add(config.parameters["model_dir"].string_value)
    assert model_dirs == {triton.MODEL_VIEW}
