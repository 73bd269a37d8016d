"""plan.service.plan_service: one service's pass, as data in and data out."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from cosyvoice_operator.api import engine_identity, labels
from cosyvoice_operator.api.effects import ApplyObject, PostEvent
from cosyvoice_operator.plan.service import EngineRef, Policy, Step, plan_service, transitions
from cosyvoice_operator.render import build_job
from tests.unit.objects import CACHE, T0, job, pod, raw_spec, record, service
from tests.unit.world import FakeWorld

POLICY = Policy()
L20 = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L20"}}


def body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {
            "name": "svc",
            "namespace": "ml",
            "uid": "svc-uid",
            "generation": 1,
            "resourceVersion": "41",
        },
        "spec": raw_spec(**{"serving": L20, **spec}),
        "status": {},
    }


def ident(**spec: Any) -> engine_identity.EngineIdentity:
    svc = service(serving=L20, **spec)
    return engine_identity.identity(svc, "sm_89", POLICY.build.default_builder_image)


def after(b: dict[str, Any], step: Step) -> dict[str, Any]:
    """The service once the step's status patch is applied (a merge patch)."""
    out = copy.deepcopy(b)
    assert step.status is not None
    for key, value in step.status.changes.items():
        if value is None:
            out["status"].pop(key, None)
        else:
            out["status"][key] = value
    return out


def reasons(step: Step) -> list[str]:
    return [e.reason for e in step.events]


def engine_ready(step: Step, b: dict[str, Any]) -> dict[str, Any]:
    new = after(b, step)["status"]
    return next(c for c in new["conditions"] if c["type"] == "EngineReady")


def test_a_new_service_creates_its_build_job_says_so_once_and_wants_the_engine() -> None:
    world = FakeWorld()
    b = body()
    step = plan_service(b, world, T0, POLICY)
    [create] = step.creates
    assert create.body["kind"] == "Job"
    assert create.name == build_job.job_name(ident(), 1, CACHE)
    assert step.status is not None and step.status.resource_version == "41"
    assert step.status.changes["phase"] == "BuildingEngine"
    assert step.status.changes["observedGeneration"] == 1
    # A first build posts no Event (issue 18, item 7: the status and the Job say it): its
    # writes are the Job, this status, the record and the EngineReady status.
    assert reasons(step) == []
    assert step.wants == frozenset({EngineRef("ml", CACHE.tag, ident().key)})

    # The same pass again on the written status, the Job now in the cache: nothing to do.
    world.job_list.append(job(ident(), 1) | {})
    world.job_list[0]["metadata"]["labels"][labels.CLAIM_LABEL] = CACHE.tag
    again = plan_service(after(b, step), world, T0, POLICY)
    assert again.creates == () and again.status is None and again.events == ()


def test_a_pass_repeated_before_the_status_is_seen_posts_nothing_twice() -> None:
    # The status write conflicted (another writer): the controller redoes the pass, and the
    # events come only with a status write that is accepted.
    world = FakeWorld()
    b = body()
    first = plan_service(b, world, T0, POLICY)
    second = plan_service(b, world, T0, POLICY)
    assert first == second  # deterministic: the retry carries the same patch and events
    assert plan_service(after(b, first), world, T0, POLICY).events == ()


def test_a_finished_job_is_recorded_and_the_engine_is_ready() -> None:
    world = FakeWorld(job_list=[job(ident(), 1, complete_at=T0)])
    b = body()
    step = plan_service(b, world, T0 + dt.timedelta(seconds=5), POLICY)
    [create] = step.creates
    assert create.body["kind"] == "ConfigMap"
    assert create.body["data"]["state"] == "Ready"
    assert step.status is not None and step.status.changes["phase"] == "Deploying"
    assert engine_ready(step, b)["status"] == "True"
    assert reasons(step) == []  # a first build that just works: no Event
    # Serving starts from the record, in the next pass: this one writes nothing for it.
    assert step.workloads == ()
    recorded = FakeWorld(records={create.name: create.body})
    later = plan_service(after(b, step), recorded, T0 + dt.timedelta(seconds=6), POLICY)
    assert {e.body["kind"] for e in later.workloads if isinstance(e, ApplyObject)} >= {
        "ConfigMap",
        "Deployment",
    }


def test_a_retried_build_says_it_started_again_and_when_its_engine_is_ready() -> None:
    failed = job(ident(), 1, failed_at=T0)
    b = body()
    later = T0 + dt.timedelta(minutes=10)  # past the retry's backoff
    step = plan_service(b, FakeWorld(job_list=[failed]), later, POLICY)
    assert [c.name for c in step.creates] == [build_job.job_name(ident(), 2, CACHE)]
    assert reasons(step) == ["EngineBuildStarted"]
    second = job(ident(), 2, complete_at=later)
    second["metadata"]["labels"][labels.CLAIM_LABEL] = CACHE.tag
    done = plan_service(after(b, step), FakeWorld(job_list=[failed, second]), later, POLICY)
    assert reasons(done) == ["EngineReady"]


def test_a_blocker_stops_new_jobs_but_never_the_recording_of_a_finished_build() -> None:
    # The model is on a claim that went away while the build ran.
    spec = {"model": {"uri": "pvc://models/cosyvoice3"}}
    done = job(ident(**spec), 1, complete_at=T0)
    world = FakeWorld(job_list=[done])
    step = plan_service(body(**spec), world, T0, POLICY)
    assert [c.body["kind"] for c in step.creates] == ["ConfigMap"]

    # No Job yet: the blocker holds and nothing is created.
    step = plan_service(body(**spec), FakeWorld(), T0, POLICY)
    assert step.creates == ()
    cond = engine_ready(step, body(**spec))
    assert cond["reason"] == "ModelClaimMissing" and "models" in cond["message"]
    assert reasons(step) == ["ModelClaimMissing"]


def test_an_image_outside_the_allowlist_makes_no_job_and_says_which_field() -> None:
    policy = Policy(allowed_image_prefixes=("ghcr.io/cosyvoice-operator/",))
    b = body(engine={"builderImage": "docker.io/evil/builder:1"})
    step = plan_service(b, FakeWorld(), T0, policy)
    assert step.creates == ()
    cond = engine_ready(step, b)
    assert cond["reason"] == "ImageNotAllowed"
    assert (
        "spec.engine.builderImage" in cond["message"]
        and "ghcr.io/cosyvoice-operator/" in (cond["message"])
    )
    # The serving image is checked too; the default (empty) images always pass.
    b = body(serving={**L20, "image": "quay.io/x/triton:1"})
    assert engine_ready(plan_service(b, FakeWorld(), T0, policy), b)["reason"] == (
        "ImageNotAllowed"
    )
    assert plan_service(body(), FakeWorld(), T0, policy).creates


def test_an_invalid_spec_removes_the_engines_it_no_longer_has() -> None:
    good = body()
    built = after(good, plan_service(good, FakeWorld(), T0, POLICY))
    assert built["status"]["engines"]
    bad = copy.deepcopy(built)
    bad["metadata"]["generation"] = 2
    bad["spec"]["engine"] = {"tensorParallelSize": 3}
    step = plan_service(bad, FakeWorld(), T0, POLICY)
    assert step.creates == ()
    assert step.status is not None
    assert step.status.changes["engines"] is None  # removed by the merge patch
    assert step.status.changes["phase"] == "Failed"
    assert reasons(step) == ["InvalidSpec"]


def test_a_refused_job_is_reported_with_the_api_servers_words_and_not_created_again() -> None:
    name = build_job.job_name(ident(), 1, CACHE)
    b = body()
    step = plan_service(b, FakeWorld(), T0, POLICY, refused={name: "403 Forbidden: exceeded quota"})
    assert step.creates == ()
    cond = engine_ready(step, b)
    assert cond["reason"] == "JobCreateFailed" and "exceeded quota" in cond["message"]
    assert reasons(step) == ["JobCreateFailed"]


def test_a_missing_credentials_secret_is_read_from_the_build_pods_status() -> None:
    spec = {"model": {"credentialsSecret": "hf"}}
    running = job(ident(**spec), 1)
    name = running["metadata"]["name"]
    waiting = pod(f"{name}-x")
    waiting["status"]["containerStatuses"][0]["state"] = {
        "waiting": {
            "reason": "CreateContainerConfigError",
            "message": 'secret "hf" not found',
        }
    }
    world = FakeWorld(job_list=[running], pod_list={name: [waiting]})
    b = body(**spec)
    step = plan_service(b, world, T0, POLICY)
    assert step.creates == ()
    cond = engine_ready(step, b)
    assert cond["reason"] == "CredentialsSecretMissing"
    assert "hf" in cond["message"]


def test_a_failed_attempt_waits_for_its_retry_time_and_asks_to_be_woken_then() -> None:
    failed = job(ident(), 1, failed_at=T0)
    world = FakeWorld(job_list=[failed])
    step = plan_service(body(), world, T0 + dt.timedelta(seconds=20), POLICY)
    assert step.creates == ()
    assert step.requeue_after is not None and 40 <= step.requeue_after <= 41
    later = plan_service(body(), world, T0 + dt.timedelta(seconds=61), POLICY)
    [create] = later.creates
    assert create.name == build_job.job_name(ident(), 2, CACHE)


def test_an_engine_being_removed_is_waited_for_then_built_again() -> None:
    rec = record(ident(), build_job.job_name(ident(), 1, CACHE), T0)
    rec["metadata"]["annotations"][labels.REMOVING_ANNOTATION] = "2025-03-01T12:00:00Z"
    world = FakeWorld(records={rec["metadata"]["name"]: rec})
    b = body()
    step = plan_service(b, world, T0, POLICY)
    assert step.creates == ()
    new = after(b, step)["status"]
    assert new["engines"][0]["state"] == "Pending"
    assert "being removed" in new["engines"][0]["message"]


def test_transitions_name_each_change_once() -> None:
    prev = {"engines": [{"key": "k", "gpuArch": "sm_89", "state": "Building", "job": "j-a1"}]}
    new = {
        "engines": [
            {
                "key": "k",
                "gpuArch": "sm_89",
                "state": "Failed",
                "job": "j-a1",
                "attempts": 1,
                "message": "attempt 1/3 failed",
            },
        ]
    }
    assert transitions(prev, new) == [
        PostEvent("Warning", "EngineBuildFailed", "engine k (sm_89): attempt 1/3 failed")
    ]
    assert transitions(new, new) == []
