"""Issue 21 M6: the engine record carries the digest of the manifest its build wrote, and the
serving pods are told it (``--manifest-sha256``), so a manifest or file changed afterwards on
the shared cache claim is refused at the pod's start (tests/engine_builder/
test_manifest_digest.py checks the refusal itself)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from cosyvoice_engine_builder.serving.options import ServeOptions, build_parser
from cosyvoice_operator.api import engine_identity
from cosyvoice_operator.api.effects import ApplyObject, CreateObject
from cosyvoice_operator.plan import engine_state, serving
from cosyvoice_operator.plan.service import Policy, plan_service
from cosyvoice_operator.render import build_job
from tests.unit.objects import CACHE, T0, job, pod, raw_spec, record, service
from tests.unit.world import FakeWorld

DIGEST = hashlib.sha256(b"the manifest a build wrote").hexdigest()
L20 = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L20"}}


def _body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {"name": "svc", "namespace": "ml", "uid": "u", "generation": 1},
        "spec": raw_spec(**{"serving": L20, **spec}),
        "status": {},
    }


def _targets(b: dict[str, Any], world: FakeWorld) -> list[engine_identity.EngineTarget]:
    svc = service(**{k: v for k, v in b["spec"].items() if k != "replicas"})
    return list(
        engine_identity.plan(svc, world.gpu_nodes(), Policy().build.default_builder_image).targets
    )


def _finished(message: dict[str, Any]) -> dict[str, Any]:
    return pod(phase="Succeeded", termination_message=json.dumps(message), exit_code=0)


def _ok(digest: object) -> dict[str, Any]:
    return {"result": "ok", "key": "k", "engineDir": "/engines/k", "manifestSha256": digest}


def _serve_args(step_effects: tuple[Any, ...]) -> list[str]:
    (deployment,) = [
        dict(e.body)
        for e in step_effects
        if isinstance(e, ApplyObject)
        and e.body["kind"] == "Deployment"
        and not serving.is_router(e.body)
    ]
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_the_record_keeps_the_digest_the_builder_reported_and_the_pods_are_given_it() -> None:
    b, world = _body(), FakeWorld()
    (target,) = _targets(b, world)
    finished = job(target.identity, 1, complete_at=T0)
    world.job_list.append(finished)
    world.pod_list[finished["metadata"]["name"]] = [_finished(_ok(DIGEST))]

    step = plan_service(b, world, T0, Policy())
    (created,) = [dict(c.body) for c in step.creates if isinstance(c, CreateObject)]
    assert created["kind"] == "ConfigMap"
    assert created["data"]["manifestSha256"] == DIGEST

    # The next pass reads the record (the Job may be gone by then) and renders serving.
    world.job_list.clear()
    world.records[created["metadata"]["name"]] = created
    args = _serve_args(plan_service(b, world, T0, Policy()).workloads)
    assert args[args.index("--manifest-sha256") + 1] == DIGEST
    # The serving entry point's own parser reads it as the digest to check.
    options = ServeOptions.from_args(build_parser().parse_args(args))
    assert options.manifest_sha256 == DIGEST and options.key == target.key


def test_a_record_without_a_digest_serves_as_before_and_a_forged_one_is_ignored() -> None:
    b = _body()
    for data in ({}, {"manifestSha256": "$(curl evil)"}, {"manifestSha256": DIGEST.upper()}):
        world = FakeWorld()
        (target,) = _targets(b, world)
        rec = record(target.identity, "job-1", T0)
        rec["data"].update(data)
        world.records[build_job.record_name(target.identity, CACHE)] = rec
        args = _serve_args(plan_service(b, world, T0, Policy()).workloads)
        assert "--manifest-sha256" not in args, data


def test_only_a_successful_builders_well_formed_digest_is_taken() -> None:
    assert engine_state.built_manifest_sha256([_finished(_ok(DIGEST))]) == DIGEST
    for message in (
        _ok("not-a-digest"),
        _ok(12),
        {"result": "failed", "step": "publish", "manifestSha256": DIGEST},
        {"result": "ok", "key": "k"},  # a builder from before the digest
    ):
        assert engine_state.built_manifest_sha256([_finished(message)]) == "", message
    # The log tail Kubernetes falls back to is not JSON: no digest, no error.
    assert engine_state.built_manifest_sha256([_finished({})]) == ""
    fallback = pod(phase="Failed", termination_message="Traceback ...")
    assert engine_state.built_manifest_sha256([fallback]) == ""
