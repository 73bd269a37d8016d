"""Issue 21 in the pure planners: images checked where they are rendered, the operator's
limits, status read within bounds, autoscaler leftovers, and the per-service NetworkPolicy."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from cosyvoice_operator.api import engine_identity
from cosyvoice_operator.api.effects import ApplyObject, PatchObject
from cosyvoice_operator.autoscaling.evaluation import desired_replicas
from cosyvoice_operator.plan.service import Limits, Policy, Step, instances_per_pod, plan_service
from cosyvoice_operator.render import build_job, workloads
from cosyvoice_operator.render.workloads import ServingSettings
from tests.unit.objects import CACHE, T0, raw_spec, record, service
from tests.unit.world import FakeWorld

L20 = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L20"}}
ALLOWED = ("registry.corp.example/",)
IMAGES = ServingSettings(default_image="registry.corp.example/triton:1")
BUILDER = "registry.corp.example/builder:1"


def body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {"name": "svc", "namespace": "ml", "uid": "u", "generation": 2},
        "spec": raw_spec(**{"serving": L20, **spec}),
        "status": {},
    }


def built_world(b: dict[str, Any], builder_image: str = BUILDER) -> FakeWorld:
    """A world where every engine the service wants is recorded Ready."""
    svc = service(**{k: v for k, v in b["spec"].items() if k != "replicas"})
    world = FakeWorld()
    plan = engine_identity.plan(svc, world.gpu_nodes(), builder_image)
    for target in plan.targets:
        name = build_job.record_name(target.identity, CACHE)
        world.records[name] = record(target.identity, f"job-{target.key[:6]}", T0)
    return world


def policy(**kw: Any) -> Policy:
    from cosyvoice_operator.render.build_job import BuildSettings

    return Policy(
        build=BuildSettings(default_builder_image=BUILDER),
        serving=kw.pop("serving", IMAGES),
        allowed_image_prefixes=ALLOWED,
        **kw,
    )


def condition(step: Step, kind: str) -> dict[str, Any]:
    assert step.status is not None
    return next(c for c in step.status.changes["conditions"] if c["type"] == kind)


def applied(step: Step, kind: str) -> list[dict[str, Any]]:
    return [
        dict(e.body)
        for e in step.workloads
        if isinstance(e, ApplyObject) and e.body["kind"] == kind
    ]


# ---- images (M1, H3) -----------------------------------------------------------------------


def test_a_serving_image_outside_the_allowlist_gets_no_deployment_even_with_built_engines() -> None:
    """The review's case: `serving.image: evil.example/miner` and Ready engines got a
    Deployment running that image, with EngineReady True and no ImageNotAllowed."""
    b = body(serving={**L20, "image": "evil.example/miner:latest"})
    step = plan_service(b, built_world(b), T0, policy())
    assert applied(step, "Deployment") == []
    progressing = condition(step, "Progressing")
    assert progressing["reason"] == "ImageNotAllowed" and progressing["status"] == "False"
    assert "evil.example/miner:latest" in progressing["message"]
    assert step.creates == ()  # and no build Job either


def test_an_allowed_serving_image_is_deployed() -> None:
    b = body(serving={**L20, "image": "registry.corp.example/mine:2"})
    [deployment] = applied(plan_service(b, built_world(b), T0, policy()), "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.corp.example/mine:2"


def test_a_deployment_made_before_keeps_serving_with_only_its_replicas_following() -> None:
    good = body()
    world = built_world(good)
    [deployment] = applied(plan_service(good, world, T0, policy()), "Deployment")
    world.objects[("Deployment", deployment["metadata"]["name"])] = deployment
    bad = copy.deepcopy(good)
    bad["spec"]["serving"]["image"] = "evil.example/miner:latest"
    bad["spec"]["replicas"] = 3
    step = plan_service(bad, world, T0, policy())
    assert applied(step, "Deployment") == []
    [scale] = [e for e in step.workloads if isinstance(e, PatchObject)]
    assert scale.patch == {"spec": {"replicas": 3}}
    assert condition(step, "Progressing")["reason"] == "ImageNotAllowed"


# ---- limits (M3) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "limits", "field", "words"),
    [
        ({"replicas": 11}, Limits(max_replicas=10), "spec.replicas", "COSYVOICE_MAX_REPLICAS"),
        (
            {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 50}},
            Limits(max_replicas=10),
            "spec.autoscaling.maxReplicas",
            "50 replicas",
        ),
        (
            {"replicas": 10, "serving": {**L20, "gpusPerReplica": 8}},
            Limits(max_gpus_per_service=64),
            "spec.replicas",
            "80 GPUs",
        ),
        (
            {
                "model": {"variant": "cosyvoice2", "uri": "hf://FunAudioLLM/CosyVoice2-0.5B"},
                "engine": {"maxBatchSize": 256},
                "serving": {
                    **L20,
                    "gpusPerReplica": 8,
                    "instancesPerGpu": 8,
                    "dynamicBatching": {"preferredBatchSizes": [64]},
                },
            },
            Limits(),
            "spec.serving",
            "COSYVOICE_MAX_INSTANCES_PER_POD",
        ),
        (
            {
                "serving": {
                    **L20,
                    "resources": {
                        "requests": {
                            f"x.example/a-rather-long-resource-name-{i}": "1" for i in range(30)
                        }
                    },
                }
            },
            Limits(max_spec_bytes=1024),
            "spec",
            "COSYVOICE_MAX_SPEC_BYTES",
        ),
    ],
)
def test_a_service_over_an_operator_limit_gets_limit_exceeded_and_no_objects(
    spec: dict[str, Any], limits: Limits, field: str, words: str
) -> None:
    b = body(**spec)
    step = plan_service(b, built_world(b), T0, policy(limits=limits))
    assert step.creates == () and step.workloads == ()
    cond = condition(step, "EngineReady")
    assert cond["reason"] == "LimitExceeded", cond
    assert cond["message"].startswith(f"{field}: ") and words in cond["message"]
    assert [e.reason for e in step.events] == ["LimitExceeded"]


def test_the_defaults_fit_the_largest_upstream_shapes() -> None:
    # CosyVoice2 at maxBatchSize 64 on 8 GPUs (upstream publishes 16), and 100 replicas.
    svc = service(
        model={"variant": "cosyvoice2", "uri": "hf://FunAudioLLM/CosyVoice2-0.5B"},
        engine={"maxBatchSize": 64},
        serving={**L20, "gpusPerReplica": 8},
    )
    assert instances_per_pod(svc) <= Limits().max_instances_per_pod
    # The review's 2048-process pod is over them.
    worst = service(
        model={"variant": "cosyvoice2", "uri": "hf://FunAudioLLM/CosyVoice2-0.5B"},
        engine={"maxBatchSize": 256},
        serving={
            **L20,
            "gpusPerReplica": 8,
            "instancesPerGpu": 8,
            "dynamicBatching": {"preferredBatchSizes": [64]},
        },
    )
    assert instances_per_pod(worst) > Limits().max_instances_per_pod


# ---- status read within bounds (L3) --------------------------------------------------------


@pytest.mark.parametrize(
    ("decided", "expected"), [(2**31 - 1, 4), (-5, 1), (3, 3), (True, 2), ("7", 2)]
)
def test_desired_replicas_from_status_are_clamped_to_the_spec(decided: Any, expected: int) -> None:
    svc = service(replicas=2, autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 4})
    assert desired_replicas(svc, {"autoscaling": {"desiredReplicas": decided}}) == expected


def test_a_huge_replica_count_is_split_without_a_loop() -> None:
    started = time.monotonic()
    shares = workloads.split_replicas(2**31 - 1, [("sm_89", 8), ("sm_90", 16)])
    assert time.monotonic() - started < 0.1
    assert shares == {"sm_90": 2**30, "sm_89": 2**30 - 1}
    assert workloads.split_replicas(3, [("sm_89", 8), ("sm_90", 16)]) == {"sm_90": 2, "sm_89": 1}
    assert workloads.split_replicas(-1, [("sm_89", 8)]) == {"sm_89": 0}
    assert workloads.split_replicas(5, []) == {}


# ---- a disabled autoscaler leaves nothing behind --------------------------------------------


def test_turning_autoscaling_off_removes_its_status_and_conditions() -> None:
    b = body()
    b["status"] = {
        "autoscaling": {"desiredReplicas": 3, "lastQueueLatencyMilliseconds": 12.0},
        "conditions": [
            {"type": c, "status": "True", "reason": "R", "message": "", "lastTransitionTime": "x"}
            for c in ("ScalingActive", "MetricsAvailable", "ScalingConflict")
        ],
    }
    step = plan_service(b, built_world(b), T0, policy())
    assert step.status is not None
    assert step.status.changes["autoscaling"] is None
    kinds = {c["type"] for c in step.status.changes["conditions"]}
    assert not kinds & {"ScalingActive", "MetricsAvailable", "ScalingConflict"}
    # On, they stay (the autoscaler's own pass owns them).
    on = copy.deepcopy(b)
    on["spec"]["autoscaling"] = {"enabled": True}
    step = plan_service(on, built_world(on), T0, policy())
    assert step.status is not None and "autoscaling" not in step.status.changes


# ---- the NetworkPolicy (H1) ------------------------------------------------------------------


def test_a_network_policy_admits_labelled_clients_and_the_scraper_only() -> None:
    settings = ServingSettings(
        default_image=IMAGES.default_image,
        network_policy=True,
        scraper_namespace_labels=(("kubernetes.io/metadata.name", "monitoring"),),
    )
    b = body()
    b["spec"]["routing"] = {"mode": "Service"}  # mode Router: tests/unit/render/test_front.py
    step = plan_service(b, built_world(b), T0, policy(serving=settings))
    [netpol] = applied(step, "NetworkPolicy")
    assert netpol["metadata"]["name"] == "cvs-svc"
    assert netpol["metadata"]["ownerReferences"][0]["uid"] == "u"
    spec = netpol["spec"]
    assert spec["podSelector"] == {"matchLabels": {"tts.cosyvoice.dev/service": "svc"}}
    assert spec["policyTypes"] == ["Ingress"]
    clients, scraper = spec["ingress"]
    assert clients["from"] == [
        {"podSelector": {"matchLabels": {"tts.cosyvoice.dev/client": "svc"}}}
    ]
    assert [p["port"] for p in clients["ports"]] == [8000, 8001]
    assert scraper["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    # Triton's metrics and cosyvoice-serve's health port (its stub-health counters, issue 19)
    assert [p["port"] for p in scraper["ports"]] == [8002, 8003]
    # It selects exactly the serving pods.
    [deployment] = applied(step, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in spec["podSelector"]["matchLabels"].items())
    # Off, none is rendered.
    off = ServingSettings(default_image=IMAGES.default_image, network_policy=False)
    assert applied(plan_service(b, built_world(b), T0, policy(serving=off)), "NetworkPolicy") == []


def test_without_scraper_labels_the_metrics_port_is_open_to_every_namespace_only() -> None:
    settings = ServingSettings(default_image=IMAGES.default_image, network_policy=True)
    netpol = workloads.render_network_policy(body(), "ml", settings)
    _, scraper = netpol["spec"]["ingress"]
    assert scraper == {
        "from": [{"namespaceSelector": {}}],
        "ports": [{"port": 8002, "protocol": "TCP"}, {"port": 8003, "protocol": "TCP"}],
    }


# ---- companion pins in the engine key (M5) --------------------------------------------------

CV3 = "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"
LLM_HF = "hf://yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF"
PINS = ((CV3, LLM_HF, "a" * 40), ("hf://FunAudioLLM/CosyVoice2-0.5B", "hf://yuekai/x", "b" * 40))


def test_companion_pins_enter_the_key_of_their_release_only() -> None:
    from cosyvoice_operator.render.build_job import builder_args

    cv3 = service(serving=L20)
    plain = engine_identity.identity(cv3, "sm_89", BUILDER)
    pinned = engine_identity.identity(cv3, "sm_89", BUILDER, PINS)
    assert pinned.companion_revisions == f"{LLM_HF}={'a' * 40}"
    assert pinned.key != plain.key
    # Without pins, the key is what it always was (no rebuild on upgrade).
    assert "companion_revisions" not in plain.canonical()
    # Another release's pins change nothing.
    other = service(serving=L20, model={"uri": "s3://bucket/model"})
    assert (
        engine_identity.identity(other, "sm_89", BUILDER, PINS).key
        == engine_identity.identity(other, "sm_89", BUILDER).key
    )
    # The record and the Job annotation carry them, and the builder gets them.
    again = engine_identity.identity_from_dict(engine_identity.identity_to_dict(pinned))
    assert again == pinned
    args = builder_args(pinned)
    assert args[args.index("--companion-revision") + 1] == f"{LLM_HF}={'a' * 40}"
    assert "--companion-revision" not in builder_args(plain)
    # The builder's own parser takes them.
    from cosyvoice_engine_builder import cli

    parsed = cli.build_parser().parse_args(args)
    assert parsed.companion_revision == [f"{LLM_HF}={'a' * 40}"]
