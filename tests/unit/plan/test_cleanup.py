"""cleanup.plan_cleanup: superseded builds are stopped, unused engines removed, used ones never."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from cosyvoice_operator.api import conditions, engine_identity, labels
from cosyvoice_operator.api.effects import CreateObject, DeleteObject, PatchObject
from cosyvoice_operator.plan import cleanup
from cosyvoice_operator.plan.cleanup import CleanupSettings, plan_cleanup
from cosyvoice_operator.plan.service import Policy
from cosyvoice_operator.render.build_job import job_name
from tests.unit.objects import CACHE, T0, job, raw_spec, record, service
from tests.unit.world import FakeWorld

POLICY = Policy()
SETTINGS = CleanupSettings(retention_seconds=3600, superseded_grace_seconds=30)
L20 = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L20"}}
DAY = dt.timedelta(days=1)


def svc_body(name: str = "svc", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml"},
        "spec": raw_spec(**{"serving": L20, **spec}),
    }


def ident(arch: str = "sm_89", **spec: Any) -> engine_identity.EngineIdentity:
    svc = service(**{"serving": L20, **spec})
    return engine_identity.identity(svc, arch, POLICY.build.default_builder_image)


def build_job(identity: engine_identity.EngineIdentity, uid: str, **kw: Any) -> dict[str, Any]:
    j = job(identity, 1, **kw)
    j["metadata"]["uid"] = uid
    j["metadata"]["labels"][labels.CLAIM_LABEL] = CACHE.tag
    j["metadata"]["labels"]["app.kubernetes.io/component"] = "engine-build"
    j["metadata"]["annotations"] = {
        labels.IDENTITY_ANNOTATION: json.dumps(engine_identity.identity_to_dict(identity))
    }
    return j


def rec(identity: engine_identity.EngineIdentity, **annotations: str) -> dict[str, Any]:
    r = record(identity, job_name(identity, 1, CACHE), T0)
    r["metadata"]["uid"] = f"rec-{identity.key[:6]}"
    r["metadata"]["annotations"].update(annotations)
    return r


def plan(
    services: list[dict[str, Any]],
    jobs: Sequence[dict[str, Any]] = (),
    records: Sequence[dict[str, Any]] = (),
    now: dt.datetime = T0,
    since: Mapping[str, dt.datetime] | None = None,
    world: FakeWorld | None = None,
) -> cleanup.CleanupPlan:
    return plan_cleanup(
        "ml",
        services,
        list(jobs),
        list(records),
        world or FakeWorld(),
        now,
        POLICY,
        SETTINGS,
        since or {},
    )


def test_a_build_no_service_asks_for_is_deleted_after_the_grace_period_only() -> None:
    old = build_job(ident(engine={"precision": "float16"}), "job-uid")
    services = [svc_body()]  # now asks for bfloat16
    first = plan(services, [old])
    assert first.effects == ()
    assert first.superseded == {"job-uid": T0}
    assert first.requeue_after is not None and 30 <= first.requeue_after <= 31
    later = plan(services, [old], now=T0 + dt.timedelta(seconds=31), since=first.superseded)
    [delete] = later.effects
    assert isinstance(delete, DeleteObject)
    assert (delete.kind, delete.name, delete.uid) == ("Job", old["metadata"]["name"], "job-uid")


def test_a_build_for_another_architecture_of_the_same_inputs_is_kept() -> None:
    # The service's L20 nodes went NotReady for a minute: its sm_89 build must go on.
    running = build_job(ident("sm_89"), "job-uid")
    world = FakeWorld(nodes=[])
    result = plan([svc_body()], [running], now=T0 + DAY, since={"job-uid": T0}, world=world)
    assert result.effects == () and result.superseded == {}


def test_finished_builds_are_left_to_their_ttl() -> None:
    done = build_job(ident(engine={"precision": "float16"}), "job-uid", complete_at=T0)
    assert plan([svc_body()], [done], now=T0 + DAY, since={"job-uid": T0}).effects == ()


def test_an_unused_engine_is_marked_then_removed_by_a_cleanup_job_then_its_record_deleted() -> None:
    unused = ident(engine={"precision": "float16"})
    # 1. marked with the time it became unreferenced
    [mark] = plan([svc_body()], records=[rec(unused)]).effects
    assert isinstance(mark, PatchObject)
    assert mark.patch == {
        "metadata": {"annotations": {labels.UNREFERENCED_ANNOTATION: conditions.timestamp(T0)}}
    }
    marked = rec(unused, **{labels.UNREFERENCED_ANNOTATION: conditions.timestamp(T0)})
    # 2. kept during the retention period, with a wake-up at its end
    kept = plan([svc_body()], records=[marked], now=T0 + dt.timedelta(minutes=30))
    assert kept.effects == ()
    assert kept.requeue_after is not None and 1800 <= kept.requeue_after <= 1801
    # 3. after it: its finished build Jobs deleted, and marked as being removed
    built = build_job(unused, "built-uid", complete_at=T0)
    delete_job, removing = plan(
        [svc_body()], [built], [marked], now=T0 + dt.timedelta(hours=2)
    ).effects
    assert delete_job == DeleteObject(
        "Job", "ml", built["metadata"]["name"], "built-uid", f"engine {unused.key} is being removed"
    )
    assert isinstance(removing, PatchObject)
    assert labels.REMOVING_ANNOTATION in removing.patch["metadata"]["annotations"]
    being_removed = rec(
        unused,
        **{
            labels.UNREFERENCED_ANNOTATION: conditions.timestamp(T0),
            labels.REMOVING_ANNOTATION: conditions.timestamp(T0 + dt.timedelta(hours=2)),
        },
    )
    # 4. a cleanup Job for that key in that claim
    [create] = plan([svc_body()], records=[being_removed]).effects
    assert isinstance(create, CreateObject)
    assert create.body["kind"] == "Job"
    assert create.body["spec"]["template"]["spec"]["containers"][0]["args"][:3] == [
        "remove",
        "--key",
        unused.key,
    ]
    # 5. the record goes only once that Job succeeded
    cleaner = dict(create.body)
    cleaner["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    [delete] = plan([svc_body()], [cleaner], [being_removed]).effects
    assert isinstance(delete, DeleteObject) and delete.kind == "ConfigMap"
    failed = dict(create.body)
    failed["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    assert plan([svc_body()], [failed], [being_removed]).effects == ()


def test_an_engine_a_service_uses_is_never_touched_and_its_mark_is_cleared() -> None:
    used = ident()
    assert plan([svc_body()], records=[rec(used)], now=T0 + 30 * DAY).effects == ()
    marked = rec(used, **{labels.UNREFERENCED_ANNOTATION: conditions.timestamp(T0)})
    [clear] = plan([svc_body()], records=[marked], now=T0 + 30 * DAY).effects
    assert clear == PatchObject(
        "ConfigMap",
        "ml",
        marked["metadata"]["name"],
        {"metadata": {"annotations": {labels.UNREFERENCED_ANNOTATION: None}}},
    )


def test_an_engine_whose_claim_is_gone_loses_its_record_without_a_cleanup_job() -> None:
    being_removed = rec(
        ident(engine={"precision": "float16"}),
        **{
            labels.UNREFERENCED_ANNOTATION: conditions.timestamp(T0),
            labels.REMOVING_ANNOTATION: conditions.timestamp(T0),
        },
    )
    world = FakeWorld(claims={CACHE.claim: "another-uid"})
    [delete] = plan([], records=[being_removed], world=world).effects
    assert isinstance(delete, DeleteObject) and delete.why == "its cache claim is gone"


# ---- the levers' identities (KV cache, SmoothQuant) ------------------------------------------


def test_running_builds_of_the_new_identities_are_not_superseded() -> None:
    """The identity annotation round-trips the new fields: a build of an int8 KV cache or a
    SmoothQuant engine is still wanted by its service."""
    cases: list[dict[str, Any]] = [
        {"engine": {"kvCacheType": "int8"}},
        {"engine": {"precision": "int8-smoothquant", "smoothQuant": {"alpha": 0.7}}},
    ]
    for spec in cases:
        body = svc_body(**spec)
        svc = service(**{"serving": L20, **spec})
        built = engine_identity.plan(
            svc, FakeWorld().gpu_nodes(), POLICY.build.default_builder_image
        )
        jobs = [build_job(t.identity, f"uid-{i}") for i, t in enumerate(built.targets)]
        result = plan(
            [body], jobs=jobs, now=T0 + DAY, since={j["metadata"]["uid"]: T0 for j in jobs}
        )
        assert not [e for e in result.effects if isinstance(e, DeleteObject)], spec
        assert result.superseded == {}, spec


# ---- vLLM's artifacts made before llmRuntime vllm was refused (issue 19, item 9) -----------

OLD_CHECKPOINT_KEY = "c" * 40


def _old_vllm_identity(artifact: str, arch: str) -> dict[str, Any]:
    """An identity as the operator recorded vLLM's plans and checkpoint before the refusal."""
    return {
        **engine_identity.identity_to_dict(ident(arch or "sm_89")),
        "precision": "none",
        "tensorParallelSize": 1 if artifact == "plans" else 0,
        "maxBatchSize": 0,
        "maxNumTokens": 0,
        "gpuArch": arch,
        "llmRuntime": "vllm",
        "artifact": artifact,
    }


def _old_checkpoint_record(**annotations: str) -> dict[str, Any]:
    r = rec(ident())
    r["metadata"]["name"] = f"cvs-engine-ckpt-{OLD_CHECKPOINT_KEY[:20]}-{CACHE.tag}"
    r["metadata"]["uid"] = "rec-ckpt"
    r["metadata"]["labels"][labels.KEY_LABEL] = OLD_CHECKPOINT_KEY
    r["metadata"]["labels"][labels.ARCH_LABEL] = ""
    r["data"]["key"] = OLD_CHECKPOINT_KEY
    r["data"]["identity"] = json.dumps(_old_vllm_identity("checkpoint", ""))
    r["metadata"]["annotations"].update(annotations)
    return r


def test_an_old_vllm_checkpoint_in_the_cache_is_still_removed() -> None:
    """Its record has no architecture and no service wants it: marked, then removed by a
    cleanup Job, like any unused engine (the cleanup still recognises such records)."""
    [mark] = plan([svc_body()], records=[_old_checkpoint_record()]).effects
    assert isinstance(mark, PatchObject)
    assert mark.name == f"cvs-engine-ckpt-{OLD_CHECKPOINT_KEY[:20]}-{CACHE.tag}"
    assert labels.UNREFERENCED_ANNOTATION in mark.patch["metadata"]["annotations"]
    being_removed = _old_checkpoint_record(
        **{
            labels.UNREFERENCED_ANNOTATION: conditions.timestamp(T0),
            labels.REMOVING_ANNOTATION: conditions.timestamp(T0),
        }
    )
    [create] = plan([svc_body()], records=[being_removed]).effects
    assert isinstance(create, CreateObject)
    assert create.body["metadata"]["name"].startswith("cvs-engine-gc-ckpt-")
    args = create.body["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["remove", "--key", OLD_CHECKPOINT_KEY]


def test_an_old_vllm_checkpoint_a_deployment_still_names_is_kept() -> None:
    """A Deployment rendered before the refusal names its checkpoint: never removed under it."""
    deployed = frozenset({OLD_CHECKPOINT_KEY})
    result = plan_cleanup(
        "ml",
        [svc_body()],
        [],
        [_old_checkpoint_record()],
        FakeWorld(),
        T0 + DAY,
        POLICY,
        SETTINGS,
        {},
        deployed,
    )
    assert result.effects == ()


def test_a_running_old_vllm_build_is_stopped_as_superseded() -> None:
    """Its identity (plans, precision none) is no engine a service wants any more."""
    for artifact, arch in (("plans", "sm_89"), ("checkpoint", "")):
        old = build_job(ident(), f"{artifact}-uid")
        old["metadata"]["annotations"][labels.IDENTITY_ANNOTATION] = json.dumps(
            _old_vllm_identity(artifact, arch)
        )
        first = plan([svc_body()], [old])
        assert first.superseded == {f"{artifact}-uid": T0}, artifact
        later = plan([svc_body()], [old], now=T0 + DAY, since=first.superseded)
        [delete] = later.effects
        assert isinstance(delete, DeleteObject) and delete.uid == f"{artifact}-uid"


# ---- issue 21: forged records, malformed services -----------------------------------------


def _removing(identity: engine_identity.EngineIdentity) -> dict[str, Any]:
    return rec(
        identity,
        **{
            labels.UNREFERENCED_ANNOTATION: conditions.timestamp(T0),
            labels.REMOVING_ANNOTATION: conditions.timestamp(T0),
        },
    )


def test_the_cleanup_job_runs_the_operators_builder_image_never_the_records() -> None:
    """M1: a record is a ConfigMap anyone in the namespace may forge; the image it names
    would run with the whole cache claim mounted read-write."""
    unused = ident(engine={"precision": "float16"})
    forged = _removing(unused)
    data = json.loads(forged["data"]["identity"])
    data["builderImage"] = "evil.example/anything:latest"
    forged["data"]["identity"] = json.dumps(data)
    [create] = plan([svc_body()], records=[forged]).effects
    assert isinstance(create, CreateObject)
    [container] = create.body["spec"]["template"]["spec"]["containers"]
    assert container["image"] == POLICY.build.default_builder_image


def test_a_record_with_a_key_or_architecture_the_operator_never_makes_is_left_alone() -> None:
    """A forged gpu-arch label ('x' * 80 + '!') made a 123-character Job name the API server
    refused on every pass; a forged key made the renderer raise."""
    unused = ident(engine={"precision": "float16"})
    bad_arch = _removing(unused)
    bad_arch["metadata"]["labels"][labels.ARCH_LABEL] = "x" * 80 + "!"
    bad_key = _removing(unused)
    bad_key["metadata"]["labels"][labels.KEY_LABEL] = "../../etc"
    assert plan([svc_body()], records=[bad_arch, bad_key]).effects == ()


def test_an_invalid_service_does_not_stop_the_namespaces_cleanup() -> None:
    """M2: a CRD-valid but malformed affinity raised AttributeError out of the whole
    namespace's cleanup; now it is an invalid spec, which wants nothing."""
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}}
    bad = svc_body("bad", serving={**L20, "affinity": affinity})
    unused = ident(engine={"precision": "float16"})
    [mark] = plan([bad, svc_body()], records=[rec(unused)]).effects
    assert isinstance(mark, PatchObject)


def test_a_service_that_cannot_be_planned_makes_the_pass_conservative_not_fail(
    monkeypatch: Any,
) -> None:
    real = engine_identity.plan

    def plan_or_fail(svc: Any, *args: Any) -> Any:
        if svc.replicas == 7:
            raise RuntimeError("a bug in planning one service")
        return real(svc, *args)

    monkeypatch.setattr(engine_identity, "plan", plan_or_fail)
    odd = svc_body("odd", replicas=7)
    unused = ident(engine={"precision": "float16"})
    old_build = build_job(ident(engine={"precision": "int8-weight-only"}), "job-uid")
    later = T0 + dt.timedelta(hours=1)
    result = plan([odd, svc_body()], [old_build], [rec(unused)], now=later, since={"job-uid": T0})
    # What the odd service wants is unknown: nothing is marked, no build stopped ...
    assert result.effects == ()
    # ... while a removal already decided goes on.
    [create] = plan([odd, svc_body()], records=[_removing(unused)]).effects
    assert isinstance(create, CreateObject)
