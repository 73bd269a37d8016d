"""build_job.render_job / render_record: the objects the operator writes for one engine build.

The golden file shows, as a readable diff in review, any change of what the operator would
write. Regenerate it with ``UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit`` (a test
that rewrites a file fails; rerun without it: ``tests/unit/golden.py``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from cosyvoice_operator.api import engine_identity, gpus, labels, spec
from cosyvoice_operator.api.engine_identity import EngineTarget
from cosyvoice_operator.render import build_job
from cosyvoice_operator.render.build_job import BuildSettings, render_job, render_record
from tests.unit import golden
from tests.unit.objects import CACHE, identity, node, service


def builder_module(name: str) -> ModuleType:
    """``cosyvoice_engine_builder.<name>``, for the operator/builder contract tests. The
    builder is part of this repository (``engine-builder/``): a test that cannot import it
    fails and says why, rather than skipping and leaving the contract unchecked."""
    try:
        return importlib.import_module(f"cosyvoice_engine_builder.{name}")
    except ImportError as exc:
        pytest.fail(
            f"cannot import cosyvoice_engine_builder.{name} ({exc}): the engine builder ships "
            "in this repository (engine-builder/) and these tests check the operator's Job "
            "args against it; install the project (pip install -e '.[test]')",
            pytrace=False,
        )


GOLDEN = Path(__file__).parent / "golden"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _to_yaml(obj: Any) -> str:
    # Through JSON first: what the API server receives, and no YAML anchors for shared dicts.
    return yaml.safe_dump(json.loads(json.dumps(obj)), sort_keys=False, width=100)


def _assert_golden(name: str, obj: Any) -> None:
    path = GOLDEN / name
    text = _to_yaml(obj)
    golden.check(path, text)


def _golden_case() -> tuple[EngineTarget, spec.ServiceSpec]:
    svc = service(
        model={
            "variant": "cosyvoice3",
            "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
            "revision": "0123abcd",
            "credentialsSecret": "hf-token",
        },
        engine={"cacheClaimName": "cosyvoice-engines"},
    )
    ident = engine_identity.identity(svc, "sm_89", BuildSettings().default_builder_image)
    return EngineTarget(ident, ("NVIDIA-L40S", "NVIDIA-L20")), svc


def test_build_job_golden() -> None:
    target, svc = _golden_case()
    _assert_golden("build-job.yaml", render_job(target, svc, "ml", 1, BuildSettings(), CACHE))


def _render(
    svc: spec.ServiceSpec | None = None,
    *,
    arch: str = "sm_89",
    products: tuple[str, ...] = ("NVIDIA-L20",),
    attempt: int = 1,
    settings: BuildSettings | None = None,
) -> dict[str, Any]:
    svc = svc or service()
    settings = settings or BuildSettings()
    ident = engine_identity.identity(svc, arch, settings.default_builder_image)
    cache = build_job.CacheClaim(svc.engine.cache_claim_name, CACHE.uid)
    return render_job(EngineTarget(ident, products), svc, "ml", attempt, settings, cache)


def _container(job: dict[str, Any]) -> dict[str, Any]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def _pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    pod_spec = job["spec"]["template"]["spec"]
    assert isinstance(pod_spec, dict)
    return pod_spec


# ---- identity of the Job ----------------------------------------------------------------


@pytest.mark.parametrize(("arch", "attempt"), [("sm_89", 1), ("sm_90", 3), ("sm_100", 12)])
def test_job_name_is_derived_from_key_and_attempt(arch: str, attempt: int) -> None:
    svc = service()
    ident = engine_identity.identity(svc, arch, BuildSettings().default_builder_image)
    job = _render(svc, arch=arch, attempt=attempt)
    name = job["metadata"]["name"]
    assert name == f"cvs-engine-{arch.replace('_', '')}-{ident.key[:20]}-{CACHE.tag}-a{attempt}"
    assert name == build_job.job_name(ident, attempt, CACHE)
    assert name.startswith(build_job.base_name(ident, CACHE))
    assert len(name) <= 63 and DNS_LABEL.match(name)  # a Job name must be a DNS-1123 label
    assert job["metadata"]["namespace"] == "ml"
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")


def test_attempts_have_distinct_names_and_same_key() -> None:
    a1, a2 = _render(attempt=1), _render(attempt=2)
    assert a1["metadata"]["name"] != a2["metadata"]["name"]
    assert a1["metadata"]["labels"][labels.KEY_LABEL] == a2["metadata"]["labels"][labels.KEY_LABEL]


def test_job_and_pod_labels_carry_key_arch_and_attempt() -> None:
    svc = service()
    ident = engine_identity.identity(svc, "sm_90", BuildSettings().default_builder_image)
    job = _render(svc, arch="sm_90", attempt=2)
    for job_labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
        assert job_labels["tts.cosyvoice.dev/engine-key"] == ident.key
        assert job_labels["tts.cosyvoice.dev/gpu-arch"] == "sm_90"
        assert job_labels["tts.cosyvoice.dev/attempt"] == "2"
        assert job_labels["app.kubernetes.io/managed-by"] == "cosyvoice-operator"
        assert all(len(v) <= 63 for v in job_labels.values())


def test_identity_annotation_describes_the_engine() -> None:
    svc = service(model={"revision": "r1"})
    job = _render(svc, products=("NVIDIA-L40S", "NVIDIA-L20"))
    ann = job["metadata"]["annotations"]
    assert ann["tts.cosyvoice.dev/model-uri"] == svc.model.uri
    assert ann["tts.cosyvoice.dev/gpu-products"] == "NVIDIA-L20,NVIDIA-L40S"
    ident = json.loads(ann["tts.cosyvoice.dev/engine-identity"])
    assert ident == {
        "modelUri": svc.model.uri,
        "revision": "r1",
        "variant": "cosyvoice3",
        "precision": "bfloat16",
        "tensorParallelSize": 1,
        "maxBatchSize": 16,
        "maxNumTokens": 32768,
        "builderImage": BuildSettings().default_builder_image,
        "gpuArch": "sm_89",
    }


def test_job_has_no_owner_references() -> None:
    """Engines are shared and outlive any one service: nothing may garbage-collect the Job."""
    job = _render(service())
    assert "ownerReferences" not in job["metadata"]
    assert "ownerReferences" not in job["spec"]["template"]["metadata"]


# ---- placement and resources --------------------------------------------------------------


@pytest.mark.parametrize(
    "products",
    [("NVIDIA-L20",), ("NVIDIA-L40S", "NVIDIA-L20", "NVIDIA-L4")],
)
def test_job_is_pinned_to_exactly_the_targets_products(products: tuple[str, ...]) -> None:
    job = _render(products=products)
    required = _pod_spec(job)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    (term,) = required["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": sorted(products)}
    ]
    assert "nodeSelector" not in _pod_spec(job)


def test_job_pinning_admits_target_nodes_and_no_other_arch() -> None:
    """Read the rendered affinity with the operator's own scheduler predicate."""
    job = _render(products=("NVIDIA-L20", "NVIDIA-L40S"))
    pod_spec = _pod_spec(job)

    def lands_on(product: str) -> bool:
        n = gpus.GPUNode.from_node(
            node(product=product, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
        )
        assert n is not None
        return gpus.eligible(n, {}, pod_spec["tolerations"], pod_spec["affinity"], 1)

    assert lands_on("NVIDIA-L20") and lands_on("NVIDIA-L40S")
    assert not lands_on("NVIDIA-L4")  # same arch but not a product of the target
    assert not lands_on("NVIDIA-H100-80GB-HBM3")


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_gpu_request_is_the_tensor_parallel_size(tp: int) -> None:
    job = _render(service(engine={"tensorParallelSize": tp}, serving={"gpusPerReplica": 8}))
    resources = _container(job)["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == str(tp)
    assert resources["limits"]["nvidia.com/gpu"] == str(tp)


def test_cpu_and_memory_come_from_settings() -> None:
    settings = BuildSettings(cpu_request="2", memory_request="8Gi", memory_limit="16Gi")
    resources = _container(_render(settings=settings))["resources"]
    assert resources["requests"]["cpu"] == "2"
    assert resources["requests"]["memory"] == "8Gi"
    assert resources["limits"]["memory"] == "16Gi"


# ---- volumes --------------------------------------------------------------------------------


def _volumes(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in _pod_spec(job)["volumes"]}


def _mounts(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in _container(job)["volumeMounts"]}


@pytest.mark.parametrize("claim", ["cosyvoice-engines", "team-a-engines"])
def test_cache_claim_is_mounted_read_write_at_engines(claim: str) -> None:
    job = _render(service(engine={"cacheClaimName": claim}))
    mount = _mounts(job)["/engines"]
    assert not mount.get("readOnly", False)
    volume = _volumes(job)[mount["name"]]
    assert volume["persistentVolumeClaim"]["claimName"] == claim
    assert not volume["persistentVolumeClaim"].get("readOnly", False)


def test_pvc_model_claim_is_mounted_read_only_under_models() -> None:
    job = _render(service(model={"uri": "pvc://model-store/cosyvoice3/0.5B"}))
    mount = _mounts(job)["/models/model-store"]
    assert mount["readOnly"] is True
    volume = _volumes(job)[mount["name"]]
    assert volume["persistentVolumeClaim"] == {"claimName": "model-store", "readOnly": True}
    args = _container(job)["args"]
    assert args[args.index("--pvc-root") + 1] == "/models"


@pytest.mark.parametrize("uri", ["hf://FunAudioLLM/CosyVoice2-0.5B", "s3://models/cv/"])
def test_no_model_volume_without_pvc_uri(uri: str) -> None:
    job = _render(service(model={"uri": uri}))
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in _pod_spec(job)["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["cosyvoice-engines"]
    assert not any(p.startswith("/models") for p in _mounts(job))


def test_every_mount_has_a_volume() -> None:
    job = _render(service(model={"uri": "pvc://model-store/cv3"}))
    names = set(_volumes(job))
    assert {m["name"] for m in _container(job)["volumeMounts"]} <= names
    assert "/tmp" in _mounts(job)  # writable scratch under a read-only-friendly HOME


# ---- credentials ----------------------------------------------------------------------------


def _secret_refs(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Environment variable -> its secretKeyRef, for the entries taken from a Secret."""
    return {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in container["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }


def test_hf_model_gets_only_hf_token_from_the_secret_and_requires_it() -> None:
    secret = "hf-token-zq7"  # a name that cannot appear by accident
    job = _render(service(model={"uri": "hf://org/model", "credentialsSecret": secret}))
    container = _container(job)
    assert "envFrom" not in container  # never the whole Secret
    # Required (no `optional`): a missing Secret or key shows in the pod's own status.
    assert _secret_refs(container) == {"HF_TOKEN": {"name": secret, "key": "HF_TOKEN"}}
    assert json.dumps(job).count(secret) == 1


def test_s3_model_gets_the_aws_keys_two_required_three_optional() -> None:
    secret = "s3-creds-q81"
    job = _render(service(model={"uri": "s3://models/cv3/", "credentialsSecret": secret}))
    container = _container(job)
    assert "envFrom" not in container
    assert _secret_refs(container) == {
        "AWS_ACCESS_KEY_ID": {"name": secret, "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": secret, "key": "AWS_SECRET_ACCESS_KEY"},
        "AWS_SESSION_TOKEN": {"name": secret, "key": "AWS_SESSION_TOKEN", "optional": True},
        "AWS_REGION": {"name": secret, "key": "AWS_REGION", "optional": True},
        "AWS_ENDPOINT_URL": {"name": secret, "key": "AWS_ENDPOINT_URL", "optional": True},
    }
    assert json.dumps(job).count(secret) == 5  # once per key, nowhere else


def test_pvc_model_gets_no_key_of_the_secret() -> None:
    job = _render(
        service(model={"uri": "pvc://model-store/cv3", "credentialsSecret": "unused-creds-7k"})
    )
    container = _container(job)
    assert "envFrom" not in container
    assert _secret_refs(container) == {}
    assert "unused-creds-7k" not in json.dumps(job)


@pytest.mark.parametrize("uri", ["hf://org/model", "s3://models/cv3/", "pvc://store/cv3"])
def test_no_secret_reference_without_credentials_secret(uri: str) -> None:
    container = _container(_render(service(model={"uri": uri})))
    assert "envFrom" not in container
    assert _secret_refs(container) == {}


def test_every_secret_value_passed_is_one_the_builder_masks() -> None:
    # The builder masks the values of its SECRET_ENV_VARS in everything it prints; a key
    # taken from the Secret that it does not know would reach the logs in clear. Region and
    # endpoint are settings, not secrets.
    redaction = builder_module("redaction")
    passed = {key for keys in build_job.CREDENTIAL_KEYS.values() for key, _ in keys}
    assert passed - {"AWS_REGION", "AWS_ENDPOINT_URL"} <= set(redaction.SECRET_ENV_VARS)
    assert set(build_job.CREDENTIAL_KEYS) == {"hf", "s3", "pvc"}  # every scheme of spec.py


# ---- security -----------------------------------------------------------------------------


def test_restricted_security_context() -> None:
    job = _render(service())
    pod_spec = _pod_spec(job)
    csc = _container(job)["securityContext"]
    assert csc["runAsNonRoot"] is True
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"] == {"drop": ["ALL"]}
    assert csc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not csc.get("privileged", False)
    psc = pod_spec["securityContext"]
    assert psc["runAsNonRoot"] is True
    assert psc["runAsUser"] != 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod_spec["automountServiceAccountToken"] is False
    assert not pod_spec.get("hostNetwork") and not pod_spec.get("hostPID")
    assert not any("hostPath" in v for v in pod_spec["volumes"])


def test_root_filesystem_is_read_only_and_every_writable_path_is_a_volume() -> None:
    job = _render(service(model={"uri": "pvc://model-store/cv3"}))
    container = _container(job)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/engines", "/tmp"}
    # Whatever a tool writes by default (HOME: ~/.cache, ~/.triton; HF_HOME) lands on /tmp.
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    for name in ("HOME", "HF_HOME"):
        assert env[name] == "/tmp" or env[name].startswith("/tmp/"), name
    # The builder's work dir is on the cache volume, which is writable.
    assert _flag(container["args"], "--cache-dir") == "/engines"


def test_scratch_is_an_empty_dir_with_the_configured_size_limit() -> None:
    mount = _mounts(_render())["/tmp"]
    assert _volumes(_render())[mount["name"]] == {
        "name": mount["name"],
        "emptyDir": {"sizeLimit": "64Gi"},
    }
    small = _render(settings=BuildSettings(scratch_size="10Gi"))
    assert _volumes(small)[mount["name"]]["emptyDir"] == {"sizeLimit": "10Gi"}
    assert BuildSettings().scratch_size == "64Gi"


# ---- Job policy ---------------------------------------------------------------------------


def test_job_policy_comes_from_settings() -> None:
    settings = BuildSettings(
        backoff_limit=5, active_deadline_seconds=1234, ttl_seconds_after_finished=99
    )
    job = _render(settings=settings)
    assert job["spec"]["backoffLimit"] == 5
    pod = job["spec"]["template"]["spec"]
    assert pod["activeDeadlineSeconds"] == 1234
    assert "activeDeadlineSeconds" not in job["spec"]  # waiting for a GPU node never counts
    assert job["spec"]["ttlSecondsAfterFinished"] == 99


def test_default_job_policy() -> None:
    job = _render()
    assert job["spec"]["backoffLimit"] == 2
    assert job["spec"]["template"]["spec"]["activeDeadlineSeconds"] == 4 * 3600
    assert job["spec"]["ttlSecondsAfterFinished"] == 24 * 3600


def test_pod_failure_policy_fails_the_job_on_exit_2() -> None:
    job = _render()
    rules = job["spec"]["podFailurePolicy"]["rules"]
    fail = [r for r in rules if r["action"] == "FailJob"]
    assert fail == [
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": "builder", "operator": "In", "values": [2]},
        }
    ]
    assert _container(job)["name"] == "builder"
    # podFailurePolicy is only valid with restartPolicy Never
    assert _pod_spec(job)["restartPolicy"] == "Never"
    ignore = [r for r in rules if r["action"] == "Ignore"]
    assert ignore == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    ]


def test_termination_message_falls_back_to_logs() -> None:
    container = _container(_render())
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TERMINATION_MESSAGE_PATH"] == container["terminationMessagePath"]


def test_optional_settings_service_account_pull_secrets_annotations() -> None:
    plain = _pod_spec(_render())
    assert "serviceAccountName" not in plain
    assert "imagePullSecrets" not in plain

    settings = BuildSettings(
        service_account="engine-builder",
        image_pull_secrets=("regcred", "mirror"),
        pod_annotations={"sidecar.istio.io/inject": "false"},
    )
    job = _render(settings=settings)
    pod_spec = _pod_spec(job)
    assert pod_spec["serviceAccountName"] == "engine-builder"
    assert pod_spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations["sidecar.istio.io/inject"] == "false"
    assert annotations["tts.cosyvoice.dev/model-uri"] == service().model.uri


# ---- the builder's command line -----------------------------------------------------------


def _flag(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, f"{flag} not exactly once in {args}"
    return args[args.index(flag) + 1]


def test_builder_args_contain_every_identity_field() -> None:
    svc = service(
        model={"variant": "cosyvoice2", "uri": "s3://models/cv2/", "revision": "v7"},
        engine={
            "precision": "int4-weight-only",
            "tensorParallelSize": 2,
            "maxBatchSize": 48,
            "maxNumTokens": 8192,
            "builderImage": "reg/builder:9",
        },
        serving={"gpusPerReplica": 2},
    )
    job = _render(svc, arch="sm_90")
    container = _container(job)
    args = container["args"]
    ident = engine_identity.identity(svc, "sm_90", "unused")
    assert args[0] == "build"
    assert _flag(args, "--key") == ident.key
    assert _flag(args, "--cache-dir") == "/engines"
    assert _flag(args, "--variant") == "cosyvoice2"
    assert _flag(args, "--model-uri") == "s3://models/cv2/"
    assert _flag(args, "--revision") == "v7"
    assert _flag(args, "--precision") == "int4-weight-only"
    assert _flag(args, "--tensor-parallel-size") == "2"
    assert _flag(args, "--max-batch-size") == "48"
    assert _flag(args, "--max-num-tokens") == "8192"
    assert _flag(args, "--gpu-arch") == "sm_90"
    assert container["image"] == "reg/builder:9"  # the builder image is the container image
    assert all(isinstance(a, str) for a in args)


def test_builder_args_cover_every_identity_field_by_name() -> None:
    """A new EngineIdentity field must reach the builder (or be the image)."""
    ident = identity()
    args = build_job.builder_args(ident)
    # The later fields are written only where not at their defaults (next tests).
    later = {
        "kv_cache_type",
        "smooth_quant",
        "companion_revisions",
        "speaker_audio_uri",
        "speaker_transcript",
    }
    assert "--kv-cache-type" not in args and "--llm-runtime" not in args
    assert not any(a.startswith("--smoothquant") for a in args)
    for f in dataclasses.fields(ident):
        if f.name == "builder_image" or f.name in later:
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.name == "model_uri":
            flag = "--model-uri"
        assert _flag(args, flag) == str(getattr(ident, f.name))


@pytest.mark.parametrize("variant", spec.VARIANTS)
@pytest.mark.parametrize("precision", spec.PRECISIONS)
def test_builder_cli_accepts_the_rendered_args(variant: str, precision: str) -> None:
    """The operator's args against the engine builder's own argument parser."""
    cli = builder_module("cli")
    ident = identity(variant=variant, precision=precision, revision="")
    args = cli.build_parser().parse_args(build_job.builder_args(ident))
    assert args.command == "build"
    assert args.key == ident.key
    assert args.variant == variant
    assert args.precision == precision
    assert args.revision == ""
    assert str(args.cache_dir) == "/engines"
    assert str(args.pvc_root) == "/models"
    assert args.tensor_parallel_size == ident.tensor_parallel_size
    assert args.gpu_arch == ident.gpu_arch


# ---- bugs ---------------------------------------------------------------------------------


def test_build_pod_can_land_on_the_nodes_the_service_was_planned_for() -> None:
    taint = {"key": "dedicated", "value": "tts", "effect": "NoSchedule"}
    svc = service(serving={"tolerations": [{"key": "dedicated", "operator": "Exists"}]})
    n = gpus.GPUNode.from_node(node(product="NVIDIA-L20", taints=[taint]))
    assert n is not None
    p = engine_identity.plan(svc, [n], BuildSettings().default_builder_image)
    (target,) = p.targets  # the service may run on the tainted L20 node
    job = render_job(target, svc, "ml", 1, BuildSettings(), CACHE)
    pod_spec = _pod_spec(job)
    assert gpus.eligible(n, {}, pod_spec["tolerations"], pod_spec["affinity"], 1)


def test_services_with_different_cache_claims_do_not_share_a_build() -> None:
    a = service(engine={"cacheClaimName": "cache-a"})
    b = service(engine={"cacheClaimName": "cache-b"})
    job_a, job_b = _render(a), _render(b)
    claims = [
        {
            v["persistentVolumeClaim"]["claimName"]
            for v in _pod_spec(j)["volumes"]
            if "persistentVolumeClaim" in v
        }
        for j in (job_a, job_b)
    ]
    assert claims == [{"cache-a"}, {"cache-b"}]  # they write to different claims...
    assert job_a["metadata"]["name"] != job_b["metadata"]["name"]  # ...so must not be joined


# ---- render_record ------------------------------------------------------------------------


def test_record_marks_an_engine_as_built() -> None:
    ident = identity(gpu_arch="sm_90")
    built = dt.datetime(2025, 3, 1, 20, 30, 5, tzinfo=dt.timezone(dt.timedelta(hours=8)))
    job = build_job.job_name(ident, 2, CACHE)
    rec = render_record(ident, "ml", job, "step publish: done", built, CACHE)
    assert (rec["apiVersion"], rec["kind"]) == ("v1", "ConfigMap")
    assert rec["metadata"]["name"] == build_job.base_name(ident, CACHE)
    assert rec["metadata"]["name"] == build_job.record_name(ident, CACHE)
    assert rec["metadata"]["annotations"] == {
        "tts.cosyvoice.dev/cache-claim": "cosyvoice-engines",
        "tts.cosyvoice.dev/cache-claim-uid": CACHE.uid,
    }
    assert rec["metadata"]["namespace"] == "ml"
    assert "ownerReferences" not in rec["metadata"]
    labels = rec["metadata"]["labels"]
    assert labels["tts.cosyvoice.dev/engine-key"] == ident.key
    assert labels["tts.cosyvoice.dev/gpu-arch"] == "sm_90"
    assert "tts.cosyvoice.dev/attempt" not in labels  # one record per key, whatever the attempt
    data = rec["data"]
    assert data["key"] == ident.key
    assert data["engineDir"] == f"/engines/{ident.key}"
    assert data["job"] == job
    assert data["builtAt"] == "2025-03-01T12:30:05Z"  # converted to UTC
    assert data["result"] == "step publish: done"
    assert json.loads(data["identity"])["gpuArch"] == "sm_90"
    assert json.loads(data["identity"])["modelUri"] == ident.model_uri
    assert all(isinstance(v, str) for v in data.values())  # ConfigMap data is strings only


def test_record_result_is_capped() -> None:
    when = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    rec = render_record(identity(), "ml", "j", "x" * 10_000, when, CACHE)
    assert len(rec["data"]["result"]) == build_job.TERMINATION_MESSAGE_LIMIT


def test_record_name_is_the_job_name_without_attempt() -> None:
    ident = identity()
    assert build_job.job_name(ident, 1, CACHE) == f"{build_job.record_name(ident, CACHE)}-a1"


def test_a_claim_made_again_under_the_same_name_is_another_cache() -> None:
    # Deleted and created again, a claim is empty: what the old one held must not count.
    ident = identity()
    again = build_job.CacheClaim(CACHE.claim, "another-uid")
    assert build_job.record_name(ident, again) != build_job.record_name(ident, CACHE)
    assert build_job.job_name(ident, 1, again) != build_job.job_name(ident, 1, CACHE)
    assert again.tag != CACHE.tag  # the claim label: its Jobs and records are told apart


def test_rendering_into_another_claim_than_the_services_is_refused() -> None:
    svc = service()
    ident = engine_identity.identity(svc, "sm_89", BuildSettings().default_builder_image)
    other = build_job.CacheClaim("other-claim", CACHE.uid)
    with pytest.raises(ValueError, match="other-claim"):
        render_job(EngineTarget(ident, ("NVIDIA-L20",)), svc, "ml", 1, BuildSettings(), other)


# ---- render_cleanup_job -------------------------------------------------------------------

GC_KEY = identity(gpu_arch="sm_90").key


def _cleanup(
    key: str = GC_KEY,
    arch: str = "sm_90",
    settings: BuildSettings | None = None,
    cache: build_job.CacheClaim = CACHE,
) -> dict[str, Any]:
    return build_job.render_cleanup_job(
        key, arch, "reg/builder:9", "ml", cache, settings or BuildSettings()
    )


def test_cleanup_job_golden() -> None:
    _assert_golden("cleanup-job.yaml", _cleanup())


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100"])
def test_cleanup_job_name_mirrors_the_engines_base_name(arch: str) -> None:
    ident = identity(gpu_arch=arch)
    job = _cleanup(ident.key, arch)
    name = job["metadata"]["name"]
    assert name == f"cvs-engine-gc-{arch.replace('_', '')}-{ident.key[:20]}-{CACHE.tag}"
    assert name == build_job.base_name(ident, CACHE).replace("cvs-engine-", "cvs-engine-gc-", 1)
    assert len(name) <= 63 and DNS_LABEL.match(name)
    assert not name.startswith(build_job.base_name(ident, CACHE))  # never taken for a build
    assert job["metadata"]["namespace"] == "ml"
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")


def test_cleanup_job_labels_and_annotations() -> None:
    job = _cleanup()
    for job_labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
        assert job_labels == {
            "app.kubernetes.io/name": "cosyvoice-engine",
            "app.kubernetes.io/component": "engine-cleanup",
            "app.kubernetes.io/managed-by": "cosyvoice-operator",
            "tts.cosyvoice.dev/engine-key": GC_KEY,
            "tts.cosyvoice.dev/gpu-arch": "sm_90",
            "tts.cosyvoice.dev/cache-claim-hash": CACHE.tag,
        }
    claim = {
        "tts.cosyvoice.dev/cache-claim": "cosyvoice-engines",
        "tts.cosyvoice.dev/cache-claim-uid": CACHE.uid,
    }
    assert job["metadata"]["annotations"] == claim
    assert job["spec"]["template"]["metadata"]["annotations"] == claim
    assert "ownerReferences" not in job["metadata"]
    # A selector for the build Jobs of the key does not pick up the cleanup Job, and
    # "delete the engine-build Jobs" (README) leaves it alone.
    assert (
        job["metadata"]["labels"]["app.kubernetes.io/component"]
        != (labels.COMPONENT_LABELS["app.kubernetes.io/component"])
    )


def test_cleanup_job_runs_remove_on_the_cache_claim() -> None:
    claim = build_job.CacheClaim("team-a-engines", "uid-a")
    job = _cleanup(cache=claim)
    container = _container(job)
    assert container["image"] == "reg/builder:9"
    assert container["args"] == ["remove", "--key", GC_KEY, "--cache-dir", "/engines"]
    assert container["volumeMounts"] == [{"name": "engines", "mountPath": "/engines"}]
    assert _pod_spec(job)["volumes"] == [
        {"name": "engines", "persistentVolumeClaim": {"claimName": "team-a-engines"}}
    ]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TERMINATION_MESSAGE_PATH"] == container["terminationMessagePath"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "envFrom" not in container
    assert not any("valueFrom" in e for e in container["env"])  # no credentials needed


def test_cleanup_job_args_are_accepted_by_the_builders_parser() -> None:
    cli = builder_module("cli")
    args = cli.build_parser().parse_args(_container(_cleanup())["args"])
    assert args.command == "remove"
    assert args.key == GC_KEY
    assert str(args.cache_dir) == "/engines"


def test_cleanup_job_needs_no_gpu_and_lands_on_any_node() -> None:
    job = _cleanup()
    pod_spec = _pod_spec(job)
    resources = _container(job)["resources"]
    assert resources == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "256Mi"},
    }
    assert "affinity" not in pod_spec and "nodeSelector" not in pod_spec
    assert pod_spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    taint = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
    for product in ("NVIDIA-L20", "NVIDIA-H100-80GB-HBM3"):
        n = gpus.GPUNode.from_node(node(product=product, taints=[taint]))
        assert n is not None
        assert gpus.eligible(n, {}, pod_spec["tolerations"], {}, 0)


def test_cleanup_job_policy() -> None:
    job = _cleanup(settings=BuildSettings(ttl_seconds_after_finished=321, backoff_limit=9))
    assert job["spec"]["backoffLimit"] == 3  # not the build's
    assert job["spec"]["ttlSecondsAfterFinished"] == 321
    assert "activeDeadlineSeconds" not in job["spec"]
    assert _pod_spec(job)["activeDeadlineSeconds"] == 600
    assert _pod_spec(job)["restartPolicy"] == "Never"
    (fail,) = [r for r in job["spec"]["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    assert fail["onExitCodes"] == {
        "containerName": _container(job)["name"],
        "operator": "In",
        "values": [2],
    }


def test_cleanup_job_security_matches_build_pods() -> None:
    cleanup, build = _cleanup(), _render()
    assert _container(cleanup)["securityContext"] == _container(build)["securityContext"]
    assert _pod_spec(cleanup)["securityContext"] == _pod_spec(build)["securityContext"]
    csc = _container(cleanup)["securityContext"]
    assert csc == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert _pod_spec(cleanup)["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert _pod_spec(cleanup)["automountServiceAccountToken"] is False


def test_cleanup_job_takes_account_pull_secrets_and_annotations_from_settings() -> None:
    plain = _pod_spec(_cleanup())
    assert "serviceAccountName" not in plain and "imagePullSecrets" not in plain
    settings = BuildSettings(
        service_account="engine-builder",
        image_pull_secrets=("regcred",),
        pod_annotations={"sidecar.istio.io/inject": "false"},
    )
    job = _cleanup(settings=settings)
    assert _pod_spec(job)["serviceAccountName"] == "engine-builder"
    assert _pod_spec(job)["imagePullSecrets"] == [{"name": "regcred"}]
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations["sidecar.istio.io/inject"] == "false"


@pytest.mark.parametrize(
    "key",
    ["", GC_KEY[:20], GC_KEY.upper(), GC_KEY + "0", "../" + GC_KEY[3:], GC_KEY[:39] + "g"],
)
def test_cleanup_job_refuses_a_key_that_is_not_a_content_key(key: str) -> None:
    with pytest.raises(ValueError, match="40 lowercase hex"):
        _cleanup(key)


# ---- the levers: KV cache, SmoothQuant -------------------------------------------------------


def test_builder_args_carry_the_kv_cache_and_smoothquant_options() -> None:
    cli = builder_module("cli")
    svc = service(
        engine={
            "precision": "int8-smoothquant",
            "kvCacheType": "int8",
            "smoothQuant": {"alpha": 0.75, "perToken": True, "perChannel": False},
        }
    )
    args = _container(_render(svc, arch="sm_90"))["args"]
    assert _flag(args, "--precision") == "int8-smoothquant"
    assert _flag(args, "--kv-cache-type") == "int8"
    assert _flag(args, "--smoothquant-alpha") == "0.75"
    assert "--smoothquant-per-token" in args and "--smoothquant-per-channel" not in args
    parsed = cli.build_parser().parse_args(args)
    request = cli._request(parsed)
    assert request.kv_cache_type.value == "int8"
    assert request.smooth_quant is not None
    assert (request.smooth_quant.alpha, request.smooth_quant.per_token) == (0.75, True)
    assert request.smooth_quant.per_channel is False
