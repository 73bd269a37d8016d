"""The Helm chart: it lints and renders, it installs and uninstalls on a real control plane, its
RBAC is both enough and no more than enough, and its image allowlist is enforced by the API
server.

Enough is shown for real: there is no kubelet here (kwok plays the pods), so the operator runs
as a local process that authenticates with a token of the chart's ServiceAccount, and must take
a service to EngineReady without a single Forbidden. No more than enough: the rendered rules
are compared with the list of calls the operator makes, the API server's own account of what
the ServiceAccount may do (a SelfSubjectRulesReview) is compared with the same list, and
`kubectl auth can-i --as` checks what it may and may not do (never a Secret, never a pod
created).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cosyvoice_operator.devtools.localcluster import binaries
from tests.conftest import CRD_DIR, REPO, Cluster
from tests.integration.operator_process import OperatorProcess, cache_claim, get_json, wait_for

CHART = REPO / "charts" / "cosyvoice-operator"
KUBE_VERSION = binaries.KUBERNETES_VERSION.lstrip("v")
L20 = {"nvidia.com/gpu.product": "NVIDIA-L20"}

Rule = tuple[str, str, frozenset[str]]  # (apiGroup, resource, verbs)

# What the operator (operator/cosyvoice_operator/kube.py) and kopf call, rule by rule. A change
# to the chart's RBAC must show up here as a readable diff. The operator observes everything
# through list+watch informers (never a get), creates, deletes and patches what it owns, patches
# services' status only, posts core/v1 Events, and reads no Secret at all; kopf lists and
# watches CRDs (and namespaces and its peering objects, below).
NAMESPACED_RULES: set[Rule] = {
    ("tts.cosyvoice.dev", "cosyvoiceservices", frozenset({"list", "watch"})),
    ("tts.cosyvoice.dev", "cosyvoiceservices/status", frozenset({"patch"})),
    ("", "events", frozenset({"create"})),
    ("batch", "jobs", frozenset({"list", "watch", "create", "delete"})),
    ("", "pods", frozenset({"list", "watch"})),
    ("", "configmaps", frozenset({"list", "watch", "create", "patch", "delete"})),
    ("", "persistentvolumeclaims", frozenset({"list", "watch"})),
    ("apps", "deployments", frozenset({"list", "watch", "patch", "delete"})),
    ("", "services", frozenset({"list", "watch", "patch"})),
    ("policy", "poddisruptionbudgets", frozenset({"list", "watch", "patch"})),
    ("networking.k8s.io", "networkpolicies", frozenset({"list", "watch", "patch"})),
    ("autoscaling", "horizontalpodautoscalers", frozenset({"list", "watch"})),
}
CLUSTER_RULES: set[Rule] = {
    ("", "nodes", frozenset({"list", "watch"})),
    ("apiextensions.k8s.io", "customresourcedefinitions", frozenset({"list", "watch"})),
}
# kopf follows the namespaces it serves only when it serves named ones.
NAMESPACES_RULE: Rule = ("", "namespaces", frozenset({"list", "watch"}))
PEERING_VERBS = frozenset({"list", "watch", "patch"})

# imagePolicy.allowedPrefixes by default, and as the operator gets them.
DEFAULT_PREFIXES = ["ghcr.io/cosyvoice-operator/", "nvcr.io/nvidia/"]
DEFAULT_PREFIXES_ENV = "ghcr.io/cosyvoice-operator/,nvcr.io/nvidia/"


# ---- helpers -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def helm() -> Path:
    """The pinned helm (the same binary the cluster links into its bin/), no cluster needed."""
    return binaries.build(binaries.BINARIES["helm"])


def run_helm(
    helm: Path, *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=180, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def render(helm: Path, *values: str, namespace: str = "cosyvoice-system") -> list[dict[str, Any]]:
    """`helm template` of the chart; each of `values` is a `--set-json` argument."""
    sets = [a for v in values for a in ("--set-json", v)]
    out = run_helm(
        helm,
        "template",
        "cvo",
        str(CHART),
        "--namespace",
        namespace,
        "--kube-version",
        KUBE_VERSION,
        *sets,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def rules_of(role: dict[str, Any]) -> set[Rule]:
    found: set[Rule] = set()
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                found.add((group, resource, frozenset(rule["verbs"])))
    return found


def container_args(docs: list[dict[str, Any]]) -> list[str]:
    [deployment] = of_kind(docs, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def env_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    [deployment] = of_kind(docs, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container.get("env", []) if "value" in e}


# ---- no cluster needed ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "copy",
    ["charts/cosyvoice-operator/crds", "operator/cosyvoice_operator/cli/crds"],
    ids=["chart", "render"],
)
def test_crd_copies_are_byte_copies_of_the_top_level_crds(copy: str) -> None:
    """The chart installs a copy; `render` checks manifests against a copy in the package."""
    top = {p.name: p.read_bytes() for p in sorted(CRD_DIR.glob("*.yaml"))}
    copied = {p.name: p.read_bytes() for p in sorted((REPO / copy).glob("*.yaml"))}
    assert top, f"no CRD in {CRD_DIR}"
    assert set(copied) == set(top), f"{copy}/ and crds/ list other files"
    for name, data in top.items():
        assert copied[name] == data, (
            f"{copy}/{name} differs from crds/{name}: cp crds/{name} {copy}/"
        )


@pytest.mark.parametrize(
    "values",
    [
        (),
        ('watchNamespaces=["tts-a","tts-b"]',),
        ('peering={"enabled":true}', "replicaCount=2"),
        ('watchNamespaces=["tts-a"]', 'peering={"enabled":true}'),
        ('imagePolicy={"enabled":false}',),
    ],
    ids=["defaults", "namespaced", "peering", "namespaced-peering", "no-image-policy"],
)
def test_lint_and_template(helm: Path, values: tuple[str, ...]) -> None:
    sets = [a for v in values for a in ("--set-json", v)]
    lint = run_helm(helm, "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, *sets)
    assert "0 chart(s) failed" in lint.stdout
    docs = render(helm, *values)
    kinds = {d["kind"] for d in docs}
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"} <= kinds
    for role in of_kind(docs, "ClusterRole") + of_kind(docs, "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"{role['metadata']['name']}: wildcard {field}"
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule
    # The operator serves no metrics (they come with the autoscaling work): no scrape target,
    # no metrics port, nothing a Prometheus could be pointed at in vain.
    assert not kinds & {"ServiceMonitor", "PodMonitor", "Service"}
    policy_kinds = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    assert policy_kinds <= kinds  # the operator's own policy is there in every case
    if 'imagePolicy={"enabled":false}' in values:
        assert not image_policies(docs)
    else:
        assert len(image_policies(docs)) == 2
    [deployment] = of_kind(docs, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert [port["name"] for port in container["ports"]] == ["health"]


def test_default_render_is_one_least_privilege_cluster_role(helm: Path) -> None:
    docs = render(helm)
    [role] = of_kind(docs, "ClusterRole")
    assert rules_of(role) == CLUSTER_RULES | NAMESPACED_RULES
    assert not of_kind(docs, "Role") and not of_kind(docs, "RoleBinding")
    [binding] = of_kind(docs, "ClusterRoleBinding")
    [sa] = of_kind(docs, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "cosyvoice-system"}
    ]

    [deployment] = of_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert container["image"] == "ghcr.io/cosyvoice-operator/cosyvoice-operator:0.1.0"
    assert container["args"] == ["run", "--liveness", "http://0.0.0.0:8080/healthz"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] and sc["runAsUser"] == 1000 and sc["readOnlyRootFilesystem"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    # Unset settings leave the operator's defaults alone; only the image allowlist is passed.
    assert {k: v for k, v in env_of(docs).items() if k.startswith("COSYVOICE_")} == {
        "COSYVOICE_ALLOWED_IMAGE_PREFIXES": DEFAULT_PREFIXES_ENV
    }


def test_the_operator_image_can_be_pinned_by_digest(helm: Path) -> None:
    """Issue 21 L6: a tag can be pushed again; a digest names the bytes."""
    digest = "sha256:" + "a" * 64
    [deployment] = of_kind(render(helm, f'image={{"digest":"{digest}"}}'), "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"ghcr.io/cosyvoice-operator/cosyvoice-operator@{digest}"
    proc = run_helm(
        helm, "template", "cvo", str(CHART), "--set", "image.digest=latest", check=False
    )
    assert proc.returncode != 0 and "/image/digest" in proc.stderr


def test_network_policy_values_become_the_operators_settings(helm: Path) -> None:
    """Issue 21 H1: on by default (the operator's own default, nothing passed); off and the
    scraper's namespaces as settings."""
    assert "COSYVOICE_NETWORK_POLICY" not in env_of(render(helm))
    docs = render(
        helm,
        'networkPolicy={"enabled":false,"scraperNamespaceLabels":{"team":"monitoring"}}',
    )
    env = env_of(docs)
    assert env["COSYVOICE_NETWORK_POLICY"] == "false"
    assert env["COSYVOICE_NETWORK_POLICY_SCRAPER_NAMESPACE_LABELS"] == '{"team":"monitoring"}'
    from cosyvoice_operator.shell import config

    serving = config.load(env).serving
    assert serving.network_policy is False
    assert serving.scraper_namespace_labels == (("team", "monitoring"),)
    assert config.load(env_of(render(helm))).serving.network_policy is True


def test_watch_namespaces_render_roles_per_namespace(helm: Path) -> None:
    docs = render(helm, 'watchNamespaces=["tts-a","tts-b"]')
    roles = {r["metadata"]["namespace"]: r for r in of_kind(docs, "Role")}
    assert set(roles) == {"tts-a", "tts-b"}
    for role in roles.values():
        assert rules_of(role) == NAMESPACED_RULES
    bindings = {b["metadata"]["namespace"]: b for b in of_kind(docs, "RoleBinding")}
    assert set(bindings) == {"tts-a", "tts-b"}
    for ns, binding in bindings.items():
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": roles[ns]["metadata"]["name"],
        }
        assert binding["subjects"][0]["namespace"] == "cosyvoice-system"
    # Only what is cluster-scoped stays cluster-wide.
    [cluster_role] = of_kind(docs, "ClusterRole")
    assert rules_of(cluster_role) == CLUSTER_RULES | {NAMESPACES_RULE}
    args = container_args(docs)
    assert args[:5] == ["run", "--namespace", "tts-a", "--namespace", "tts-b"]
    assert "--liveness" in args


def test_peering_grants_the_peering_resource_of_its_mode(helm: Path) -> None:
    clusterwide = render(helm, 'peering={"enabled":true}', "replicaCount=2")
    [role] = of_kind(clusterwide, "ClusterRole")
    assert ("kopf.dev", "clusterkopfpeerings", PEERING_VERBS) in rules_of(role)
    assert not any(r[1] == "kopfpeerings" for r in rules_of(role))
    [peering] = of_kind(clusterwide, "ClusterKopfPeering")
    args = container_args(clusterwide)
    assert args[args.index("--peering") + 1] == peering["metadata"]["name"]
    [deployment] = of_kind(clusterwide, "Deployment")
    assert deployment["spec"]["replicas"] == 2

    namespaced = render(helm, 'watchNamespaces=["tts-a"]', 'peering={"enabled":true}')
    [role] = of_kind(namespaced, "Role")
    assert ("kopf.dev", "kopfpeerings", PEERING_VERBS) in rules_of(role)
    [cluster_role] = of_kind(namespaced, "ClusterRole")
    assert rules_of(cluster_role) == CLUSTER_RULES | {NAMESPACES_RULE}
    [peering] = of_kind(namespaced, "KopfPeering")
    assert peering["metadata"]["namespace"] == "tts-a"

    # Without peering there is no peering rule at all.
    for doc in of_kind(render(helm), "ClusterRole"):
        assert not any(r[0] == "kopf.dev" for r in rules_of(doc))


def test_config_values_become_the_operator_environment(helm: Path) -> None:
    docs = render(
        helm,
        "config="
        + json.dumps(
            {
                "builderImage": "registry.example/builder:1",
                "buildBackoffLimit": 0,
                "buildDeadlineSeconds": 1000000,
                "buildTtlSeconds": 600,
                "buildMaxAttempts": 5,
                "buildRetryBaseSeconds": 2.5,
                "buildServiceAccount": "builder",
                "buildPodAnnotations": {"example.com/team": "tts"},
                "imagePullSecrets": ["regcred", "other"],
                "buildScratchSize": "100Gi",
                "engineRetentionSeconds": 86400,
                "supersededGraceSeconds": 5,
                "workers": 8,
                "peeringLifetimeSeconds": 20,
                "prometheusUrl": "http://prometheus:9090",
                "servingImage": "registry.example/triton:1",
                "metricsWindowSeconds": 30,
                "allowedPrometheusUrls": ["https://thanos.example/q", "http://p2:9090"],
                "vllmImage": "registry.example/triton:1-vllm",
                "maxReplicas": 8,
                "maxGpusPerService": 16,
                "maxInstancesPerPod": 64,
                "maxSpecBytes": 8192,
                "companionRevisions": {"hf://o/release": {"hf://o/companion": "c" * 40}},
            }
        ),
        'nodeSelector={"role":"ops"}',
        'tolerations=[{"key":"ops","operator":"Exists"}]',
        'imagePolicy={"allowedPrefixes":["registry.example/","nvcr.io/nvidia/tritonserver:"]}',
    )
    env = env_of(docs)
    assert {k: v for k, v in env.items() if k.startswith("COSYVOICE_")} == {
        "COSYVOICE_BUILDER_IMAGE": "registry.example/builder:1",
        "COSYVOICE_BUILD_BACKOFF_LIMIT": "0",
        "COSYVOICE_BUILD_DEADLINE_SECONDS": "1000000",
        "COSYVOICE_BUILD_TTL_SECONDS": "600",
        "COSYVOICE_BUILD_MAX_ATTEMPTS": "5",
        "COSYVOICE_BUILD_RETRY_BASE_SECONDS": "2.5",
        "COSYVOICE_BUILD_SERVICE_ACCOUNT": "builder",
        "COSYVOICE_BUILD_POD_ANNOTATIONS": '{"example.com/team":"tts"}',
        "COSYVOICE_IMAGE_PULL_SECRETS": "regcred,other",
        "COSYVOICE_BUILD_SCRATCH_SIZE": "100Gi",
        "COSYVOICE_ENGINE_RETENTION_SECONDS": "86400",
        "COSYVOICE_SUPERSEDED_GRACE_SECONDS": "5",
        "COSYVOICE_WORKERS": "8",
        "COSYVOICE_PEERING_LIFETIME_SECONDS": "20",
        "COSYVOICE_PROMETHEUS_URL": "http://prometheus:9090",
        "COSYVOICE_SERVING_IMAGE": "registry.example/triton:1",
        "COSYVOICE_METRICS_WINDOW_SECONDS": "30",
        "COSYVOICE_ALLOWED_PROMETHEUS_URLS": "https://thanos.example/q,http://p2:9090",
        "COSYVOICE_VLLM_IMAGE": "registry.example/triton:1-vllm",
        "COSYVOICE_MAX_REPLICAS": "8",
        "COSYVOICE_MAX_GPUS_PER_SERVICE": "16",
        "COSYVOICE_MAX_INSTANCES_PER_POD": "64",
        "COSYVOICE_MAX_SPEC_BYTES": "8192",
        "COSYVOICE_COMPANION_REVISIONS": json.dumps(
            {"hf://o/release": {"hf://o/companion": "c" * 40}}, separators=(",", ":")
        ),
        "COSYVOICE_ALLOWED_IMAGE_PREFIXES": "registry.example/,nvcr.io/nvidia/tritonserver:",
    }
    # And the operator accepts them as they are.
    from cosyvoice_operator.shell import config

    loaded = config.load(env)
    assert loaded.build.backoff_limit == 0 and loaded.build.active_deadline_seconds == 1000000
    assert loaded.build.pod_annotations == {"example.com/team": "tts"}
    assert loaded.build.image_pull_secrets == ("regcred", "other")
    assert loaded.peering_lifetime_seconds == 20
    assert loaded.prometheus_urls == (
        "http://prometheus:9090",
        "https://thanos.example/q",
        "http://p2:9090",
    )
    assert (loaded.limits.max_replicas, loaded.limits.max_spec_bytes) == (8, 8192)
    [deployment] = of_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "ops"}
    assert pod["tolerations"] == [{"key": "ops", "operator": "Exists"}]


def image_policies(docs: list[dict[str, Any]], suffix: str = "-images") -> list[dict[str, Any]]:
    """The chart's admission policy and binding of that name (images: services' images;
    operator: what the operator's own ServiceAccount writes)."""
    return [
        d
        for d in docs
        if d["kind"].startswith("ValidatingAdmissionPolicy")
        and d["metadata"]["name"].endswith(suffix)
    ]


def of_policy(docs: list[dict[str, Any]], kind: str, suffix: str = "-images") -> list[Any]:
    return [d for d in image_policies(docs, suffix) if d["kind"] == kind]


def cel_prefixes(policy: dict[str, Any]) -> list[str]:
    """The prefixes embedded in the policy's CEL (a JSON list is a CEL list of strings)."""
    [variable] = [v for v in policy["spec"]["variables"] if v["name"] == "allowedPrefixes"]
    found = json.loads(variable["expression"])
    assert isinstance(found, list)
    return [str(p) for p in found]


def test_image_policy_renders_an_admission_policy_and_its_binding(helm: Path) -> None:
    docs = render(helm)
    [policy] = of_policy(docs, "ValidatingAdmissionPolicy")
    [binding] = of_policy(docs, "ValidatingAdmissionPolicyBinding")
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["tts.cosyvoice.dev"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["cosyvoiceservices"],
        }
    ]
    assert cel_prefixes(policy) == DEFAULT_PREFIXES
    # Every field the CEL reads is guarded with has(), and each validation names its field.
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    for name, field in (
        ("builderImage", "object.spec.engine.builderImage"),
        ("servingImage", "object.spec.serving.image"),
    ):
        expression = variables[name]
        for part in ("object.spec", field.rsplit(".", 1)[0], field):
            assert f"has({part})" in expression, (name, part, expression)
    messages = [v["messageExpression"] for v in spec["validations"]]
    assert any("spec.engine.builderImage" in m for m in messages)
    assert any("spec.serving.image" in m for m in messages)
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    # Serving every namespace, the binding covers every namespace.
    assert "matchResources" not in binding["spec"]


def test_image_policy_binding_is_scoped_to_the_served_namespaces(helm: Path) -> None:
    docs = render(helm, 'watchNamespaces=["tts-a","tts-b"]')
    [binding] = of_policy(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"] == {
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "In",
                    "values": ["tts-a", "tts-b"],
                }
            ]
        }
    }


def test_image_policy_prefixes_are_quoted_safely(helm: Path) -> None:
    # Characters that mean something in YAML, CEL or JSON reach the CEL list as they are.
    odd = ['registry.example/a"b\\c/', "registry.example/x'||true||'/", "r.example/#:"]
    docs = render(helm, "imagePolicy=" + json.dumps({"allowedPrefixes": odd}))
    [policy] = of_policy(docs, "ValidatingAdmissionPolicy")
    assert cel_prefixes(policy) == odd
    [operator] = of_policy(docs, "ValidatingAdmissionPolicy", "-operator")
    assert cel_prefixes(operator) == odd
    assert env_of(docs)["COSYVOICE_ALLOWED_IMAGE_PREFIXES"] == ",".join(odd)


def test_image_policy_disabled_renders_no_policy_and_no_allowlist(helm: Path) -> None:
    docs = render(helm, 'imagePolicy={"enabled":false,"allowedPrefixes":[]}')
    assert not image_policies(docs)
    assert "COSYVOICE_ALLOWED_IMAGE_PREFIXES" not in env_of(docs)
    # The operator's own policy stays, without an image list.
    [operator] = of_policy(docs, "ValidatingAdmissionPolicy", "-operator")
    assert cel_prefixes(operator) == []


def test_the_operator_policy_matches_only_the_operators_service_account(helm: Path) -> None:
    """Issue 21 M7 (the API server's side: tests/integration/test_operator_policy.py)."""
    docs = render(helm, 'config={"buildServiceAccount":"engine-builder"}')
    [policy] = of_policy(docs, "ValidatingAdmissionPolicy", "-operator")
    [binding] = of_policy(docs, "ValidatingAdmissionPolicyBinding", "-operator")
    [condition] = policy["spec"]["matchConditions"]
    account = "system:serviceaccount:cosyvoice-system:cvo-cosyvoice-operator"
    assert condition["expression"] == f"request.userInfo.username == '{account}'"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert json.loads(variables["allowedAccounts"]) == ["", "default", "engine-builder"]
    assert cel_prefixes(policy) == DEFAULT_PREFIXES
    kinds = {
        (rule["apiGroups"][0], resource)
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
        for resource in rule["resources"]
    }
    # Every kind the operator may create, patch or delete (NAMESPACED_RULES).
    writable = {
        (group, resource)
        for group, resource, verbs in NAMESPACED_RULES
        if verbs & {"create", "patch", "delete"} and "/" not in resource and resource != "events"
    }
    assert writable <= kinds
    assert not image_policies(render(helm, 'operatorPolicy={"enabled":false}'), "-operator")


@pytest.mark.parametrize(
    ("prefixes", "message"),
    [
        (["ghcr.io/cosy"], 'imagePolicy.allowedPrefixes: "ghcr.io/cosy" must end in "/", ":" or'),
        (["nvcr.io/nvidia/", "nvcr.io/nvidia/tritonserver"], '"nvcr.io/nvidia/tritonserver" must'),
        ([], "imagePolicy.allowedPrefixes is empty"),
        ([""], "an empty prefix would admit every image"),
        (["a.example/,b.example/"], "contains a comma or a space"),
        ("ghcr.io/", "imagePolicy.allowedPrefixes must be a list"),
    ],
    ids=["no-separator", "one-of-two", "empty-list", "empty-prefix", "comma", "not-a-list"],
)
def test_image_policy_refuses_prefixes_that_would_admit_lookalikes(
    helm: Path, prefixes: Any, message: str
) -> None:
    value = "imagePolicy=" + json.dumps({"enabled": True, "allowedPrefixes": prefixes})
    proc = run_helm(helm, "template", "cvo", str(CHART), "--set-json", value, check=False)
    assert proc.returncode != 0, f"rendered {prefixes!r}:\n{proc.stdout[:2000]}"
    assert message in proc.stderr, proc.stderr


def test_the_default_builder_image_must_be_on_the_allowlist(helm: Path) -> None:
    # The operator refuses to start with COSYVOICE_BUILDER_IMAGE outside its allowlist.
    proc = run_helm(
        helm,
        "template",
        "cvo",
        str(CHART),
        "--set-json",
        'config={"builderImage":"registry.example/builder:1"}',
        check=False,
    )
    assert proc.returncode != 0, proc.stdout[:2000]
    assert 'config.builderImage "registry.example/builder:1" starts with none of' in proc.stderr
    docs = render(helm, 'config={"builderImage":"nvcr.io/nvidia/builder:1"}')
    assert env_of(docs)["COSYVOICE_BUILDER_IMAGE"] == "nvcr.io/nvidia/builder:1"
    # So does the default serving image.
    proc = run_helm(
        helm,
        "template",
        "cvo",
        str(CHART),
        "--set-json",
        'config={"servingImage":"quay.io/me/triton:1"}',
        check=False,
    )
    assert proc.returncode != 0, proc.stdout[:2000]
    assert 'config.servingImage "quay.io/me/triton:1" starts with none of' in proc.stderr


# ---- against the cluster -------------------------------------------------------------------


@dataclass
class Release:
    name: str
    namespace: str
    service_account: str


def install(cluster: Cluster, helm: Path, *values: str) -> Release:
    name = f"cvo-{uuid.uuid4().hex[:6]}"
    namespace = cluster.namespace("chart")
    sets = [a for v in values for a in ("--set-json", v)]
    run_helm(helm, "install", name, str(CHART), "--namespace", namespace, *sets, env=cluster.env)
    # The full name is <release>-<chart> (the release name does not contain the chart's name).
    return Release(name, namespace, f"{name}-cosyvoice-operator")


def uninstall(cluster: Cluster, helm: Path, release: Release) -> None:
    run_helm(helm, "uninstall", release.name, "--namespace", release.namespace, env=cluster.env)
    cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


def exists(cluster: Cluster, *what: str) -> bool:
    return cluster.kubectl("get", *what, "-o", "name", check=False).returncode == 0


@pytest.mark.cluster
def test_install_creates_the_objects_and_uninstall_removes_them(
    cluster: Cluster, helm: Path
) -> None:
    release = install(cluster, helm)
    full = release.service_account
    objects = [
        ("serviceaccount", full, "-n", release.namespace),
        ("deployment", full, "-n", release.namespace),
        ("clusterrole", full),
        ("clusterrolebinding", full),
        ("validatingadmissionpolicy", f"{full}-images"),
        ("validatingadmissionpolicybinding", f"{full}-images"),
        ("validatingadmissionpolicy", f"{full}-operator"),
        ("validatingadmissionpolicybinding", f"{full}-operator"),
    ]
    for obj in objects:
        assert exists(cluster, *obj), f"{obj[0]} {full} was not created"
    listed = run_helm(helm, "list", "-n", release.namespace, "-o", "json", env=cluster.env)
    [entry] = json.loads(listed.stdout)
    assert entry["status"] == "deployed" and entry["app_version"] == "0.1.0"

    uninstall(cluster, helm, release)
    for obj in objects:
        assert not exists(cluster, *obj), f"{obj[0]} {full} is left after helm uninstall"
    # The CRD (and so every user's service) survives the uninstall.
    assert exists(cluster, "crd", "cosyvoiceservices.tts.cosyvoice.dev")


def service_account_kubeconfig(cluster: Cluster, release: Release, path: Path) -> Path:
    """A kubeconfig of the same server and CA as the admin's, authenticating as the chart's SA."""
    token = cluster.kubectl(
        "create", "token", release.service_account, "-n", release.namespace, "--duration=1h"
    ).stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    [server] = admin["clusters"]
    user = f"system:serviceaccount:{release.namespace}:{release.service_account}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [server],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": server["name"], "user": user}}],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return dict(c)
    return {}


FORBIDDEN = re.compile(r"Forbidden|forbidden|\b403\b|Not enough permissions")


class ClusterwideOperator(OperatorProcess):
    """`cosyvoice-operator run` with no --namespace, as the chart runs it by default: kopf
    watches services across the cluster."""

    def start(self, liveness_port: int | None = None) -> ClusterwideOperator:
        assert liveness_port is None, "not used here"
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cosyvoice_operator", "run"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self


@pytest.fixture(scope="module")
def clusterwide_release(cluster: Cluster, helm: Path) -> Iterator[Release]:
    # Without the image policy: it is cluster-scoped and would stay for the whole module, and
    # the API server names only one refusing policy, so the image tests could not tell theirs.
    release = install(cluster, helm, 'imagePolicy={"enabled":false}')
    yield release
    uninstall(cluster, helm, release)


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["clusterwide", "namespaced"])
def test_the_operator_builds_an_engine_with_only_the_charts_permissions(
    cluster: Cluster, helm: Path, tmp_path: Path, mode: str
) -> None:
    served = cluster.namespace("chart-svc")
    if mode == "clusterwide":
        release = install(cluster, helm)
    else:
        release = install(cluster, helm, f"watchNamespaces={json.dumps([served])}")
        assert exists(cluster, "role", release.service_account, "-n", served)
    kubeconfig = service_account_kubeconfig(cluster, release, tmp_path / "kubeconfig")
    whoami = cluster.kubectl("--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json")
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == (
        f"system:serviceaccount:{release.namespace}:{release.service_account}"
    )
    # A build touches every granted kind: the cache claim, nodes, the Job and its pods, and the
    # services themselves (the informers' list and watch), the record ConfigMap (create, patch),
    # the Job (create), Events (create) and the status subresource (patch). The credentials
    # Secret is for the build pod (envFrom): the operator never reads it, and may not.
    cluster.apply(served, cache_claim())
    cluster.kubectl(
        "create", "secret", "generic", "hf-token", "-n", served, "--from-literal=HF_TOKEN=x"
    )
    operator = ClusterwideOperator if mode == "clusterwide" else OperatorProcess
    if mode == "clusterwide":
        # A cluster-wide operator acts on every service of the cluster; another test's would
        # make this one's log (and that test) a mix of two operators.
        others = get_json(cluster, "cvs", "-A")["items"]
        assert not others, "services left by other tests: " + ", ".join(
            f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in others
        )
    op = operator(cluster, served, tmp_path, KUBECONFIG=str(kubeconfig)).start()
    try:
        body = {
            "apiVersion": "tts.cosyvoice.dev/v1alpha1",
            "kind": "CosyVoiceService",
            "metadata": {"name": "rbac"},
            "spec": {
                "model": {
                    "variant": "cosyvoice3",
                    "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
                    "credentialsSecret": "hf-token",
                },
                "serving": {"nodeSelector": L20},
            },
        }
        cluster.apply(served, json.dumps(body))

        def ready() -> dict[str, Any] | None:
            obj: dict[str, Any] = get_json(cluster, "cvs", "rbac", "-n", served)
            return obj if condition(obj, "EngineReady").get("status") == "True" else None

        try:
            obj = wait_for("EngineReady under the chart's ServiceAccount", ready, timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\noperator log:\n{op.log()}") from None
        [entry] = obj["status"]["engines"]
        records = get_json(
            cluster, "configmap", "-n", served, "-l", f"tts.cosyvoice.dev/engine-key={entry['key']}"
        )
        assert len(records["items"]) == 1, "the engine record ConfigMap was not created"
        # A build that just works posts no Event (issue 18, item 7); a problem does: a service
        # naming a cache claim that does not exist, for the chart's Event permission.
        blocked = json.loads(json.dumps(body))
        blocked["metadata"]["name"] = "rbac-blocked"
        blocked["spec"]["engine"] = {"cacheClaimName": "no-such-claim"}
        cluster.apply(served, json.dumps(blocked))

        def warned() -> set[str] | None:
            events = get_json(cluster, "events", "-n", served)["items"]
            found = {e["reason"] for e in events if e["involvedObject"]["name"] == "rbac-blocked"}
            return found if "CacheClaimMissing" in found else None

        wait_for("the operator's Warning Event", warned, timeout=60)
        # A permission only a later pass needs (the record, the Events) has been used by now;
        # the condition stays as it is.
        obj = get_json(cluster, "cvs", "rbac", "-n", served)
        assert condition(obj, "EngineReady").get("status") == "True", obj.get("status")
        # No finalizer (no kopf timers, no deletion handler): deletion never waits on the
        # operator, and the operator sees the deletion through without being refused anything.
        assert not obj["metadata"].get("finalizers"), obj["metadata"].get("finalizers")
        cluster.kubectl("delete", "cvs", "rbac", "rbac-blocked", "-n", served, "--timeout=30s")
        assert not exists(cluster, "cvs", "rbac", "-n", served)
    finally:
        op.stop()
        uninstall(cluster, helm, release)
        cluster.kubectl("delete", "namespace", served, "--wait=false", check=False)
    log = op.log_path.read_text(errors="replace")
    bad = [line for line in log.splitlines() if FORBIDDEN.search(line)]
    assert not bad, "the operator was refused something:\n" + "\n".join(bad[:20])


def can_i(cluster: Cluster, release: Release, *what: str) -> bool:
    who = f"--as=system:serviceaccount:{release.namespace}:{release.service_account}"
    proc = cluster.kubectl("auth", "can-i", *what, who, check=False)
    return proc.stdout.strip() == "yes"


Grant = tuple[str, str, str]  # (apiGroup, resource, verb)


def grants(rules: set[Rule]) -> set[Grant]:
    return {(group, resource, verb) for group, resource, verbs in rules for verb in verbs}


# What every authenticated user may do (system:basic-user): ask what it may do, and who it is.
SELF_REVIEWS = {"authorization.k8s.io", "authentication.k8s.io"}


def granted(cluster: Cluster, release: Release, namespace: str) -> set[Grant]:
    """The API server's own account (a SelfSubjectRulesReview, made as the ServiceAccount with
    its groups) of what the ServiceAccount may do in `namespace`, cluster-wide grants included,
    less the self-reviews every authenticated user may make."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace},
    }
    proc = cluster.kubectl(
        "create",
        "-f",
        "-",
        "-o",
        "json",
        f"--as=system:serviceaccount:{release.namespace}:{release.service_account}",
        "--as-group=system:serviceaccounts",
        f"--as-group=system:serviceaccounts:{release.namespace}",
        "--as-group=system:authenticated",
        input=json.dumps(review),
    )
    status = json.loads(proc.stdout)["status"]
    assert not status.get("incomplete"), status
    found: set[Grant] = set()
    for rule in status.get("resourceRules", []):
        assert not rule.get("resourceNames"), rule
        for group in rule.get("apiGroups", []):
            if group in SELF_REVIEWS:
                continue
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    found.add((group, resource, verb))
    return found


def qualified(group: str, resource: str) -> list[str]:
    """`kubectl auth can-i` arguments for a resource, a subresource asked for with
    --subresource (what follows a slash would be read as an object's name)."""
    kind, _, sub = resource.partition("/")
    return [f"{kind}.{group}" if group else kind, *([f"--subresource={sub}"] if sub else [])]


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("verb", "resource", "scope", "allowed"),
    [
        # what it needs
        ("watch", "cosyvoiceservices.tts.cosyvoice.dev", "-A", True),
        ("list", "cosyvoiceservices.tts.cosyvoice.dev", "-A", True),
        ("patch", "cosyvoiceservices.tts.cosyvoice.dev/status", "-n=default", True),
        ("create", "jobs.batch", "-n=default", True),
        ("list", "jobs.batch", "-A", True),
        ("watch", "jobs.batch", "-A", True),
        ("delete", "jobs.batch", "-n=default", True),
        ("list", "pods", "-A", True),
        ("watch", "pods", "-A", True),
        ("list", "configmaps", "-A", True),
        ("watch", "configmaps", "-A", True),
        ("create", "configmaps", "-n=default", True),
        ("patch", "configmaps", "-n=default", True),
        ("delete", "configmaps", "-n=default", True),
        ("list", "persistentvolumeclaims", "-A", True),
        ("watch", "persistentvolumeclaims", "-A", True),
        ("list", "nodes", "", True),
        ("watch", "nodes", "", True),
        ("create", "events", "-n=default", True),
        ("list", "deployments.apps", "-A", True),
        ("patch", "deployments.apps", "-n=default", True),
        ("delete", "deployments.apps", "-n=default", True),
        ("patch", "services", "-n=default", True),
        ("patch", "poddisruptionbudgets.policy", "-n=default", True),
        ("list", "customresourcedefinitions.apiextensions.k8s.io", "", True),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io", "", True),
        # what it must not do: no get of anything (informers only), no Secret at all, no pod
        # created, nothing updated, nothing else deleted or patched
        ("get", "cosyvoiceservices.tts.cosyvoice.dev", "-n=default", False),
        ("patch", "cosyvoiceservices.tts.cosyvoice.dev", "-n=default", False),
        ("update", "cosyvoiceservices.tts.cosyvoice.dev", "-n=default", False),
        ("delete", "cosyvoiceservices.tts.cosyvoice.dev", "-n=default", False),
        ("create", "cosyvoiceservices.tts.cosyvoice.dev", "-n=default", False),
        ("update", "cosyvoiceservices.tts.cosyvoice.dev/status", "-n=default", False),
        ("patch", "cosyvoiceservices.tts.cosyvoice.dev/scale", "-n=default", False),
        ("get", "secrets", "-n=default", False),
        ("list", "secrets", "-A", False),
        ("watch", "secrets", "-A", False),
        ("create", "secrets", "-n=default", False),
        ("create", "pods", "-n=default", False),
        ("get", "pods", "-n=default", False),
        ("delete", "pods", "-n=default", False),
        ("create", "pods/exec", "-n=default", False),
        ("get", "pods/log", "-n=default", False),
        ("get", "jobs.batch", "-n=default", False),
        ("patch", "jobs.batch", "-n=default", False),
        ("update", "jobs.batch", "-n=default", False),
        ("get", "configmaps", "-n=default", False),
        ("update", "configmaps", "-n=default", False),
        ("get", "persistentvolumeclaims", "-n=default", False),
        ("create", "persistentvolumeclaims", "-n=default", False),
        ("delete", "persistentvolumeclaims", "-n=default", False),
        ("get", "nodes", "", False),
        ("patch", "nodes", "", False),
        ("delete", "nodes", "", False),
        ("patch", "events", "-n=default", False),
        ("list", "events", "-n=default", False),
        ("create", "events.events.k8s.io", "-n=default", False),
        ("create", "deployments.apps", "-n=kube-system", False),
        ("get", "deployments.apps", "-n=default", False),
        ("update", "deployments.apps", "-n=default", False),
        ("delete", "services", "-n=default", False),
        ("patch", "deployments.apps/scale", "-n=default", False),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", "", False),
        ("escalate", "clusterroles.rbac.authorization.k8s.io", "", False),
        ("impersonate", "serviceaccounts", "-A", False),
        ("create", "serviceaccounts/token", "-A", False),
        ("patch", "customresourcedefinitions.apiextensions.k8s.io", "", False),
        ("get", "customresourcedefinitions.apiextensions.k8s.io", "", False),
        ("delete", "validatingadmissionpolicies.admissionregistration.k8s.io", "", False),
        # serving every namespace, kopf never looks at namespaces
        ("list", "namespaces", "", False),
        ("delete", "namespaces", "", False),
        ("get", "clusterkopfpeerings.kopf.dev", "", False),
    ],
)
def test_the_service_account_can_do_no_more(
    cluster: Cluster,
    clusterwide_release: Release,
    verb: str,
    resource: str,
    scope: str,
    allowed: bool,
) -> None:
    # `can-i VERB TYPE/NAME` reads what follows the slash as an object's name; a subresource
    # has to be asked for with --subresource.
    kind, _, sub = resource.partition("/")
    args = [verb, kind, *([f"--subresource={sub}"] if sub else []), *([scope] if scope else [])]
    assert can_i(cluster, clusterwide_release, *args) is allowed, (
        f"can-i {' '.join(args)} should be {'yes' if allowed else 'no'}"
    )


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["clusterwide", "namespaced"])
def test_the_service_account_reads_no_secret_and_creates_no_pod_anywhere(
    cluster: Cluster, helm: Path, mode: str
) -> None:
    """Never a Secret (get, list or watch) and never a pod created, in any namespace or
    cluster-wide; and, by the API server's own account, exactly the listed verbs where it
    serves and only the cluster-scoped ones elsewhere."""
    served = cluster.namespace("chart-svc")
    other = cluster.namespace("chart-other")
    if mode == "clusterwide":
        release = install(cluster, helm)
        serving = {served, other}
    else:
        release = install(cluster, helm, f"watchNamespaces={json.dumps([served])}")
        serving = {served}
    cluster_rules = CLUSTER_RULES | ({NAMESPACES_RULE} if mode == "namespaced" else set())
    try:
        scopes = [
            "-A",
            *(f"-n={ns}" for ns in ("default", "kube-system", release.namespace, served, other)),
        ]
        for scope in scopes:
            for verb in ("get", "list", "watch"):
                assert not can_i(cluster, release, verb, "secrets", scope), (verb, scope)
            assert not can_i(cluster, release, "create", "pods", scope), scope
        # Exactly the listed verbs, each one asked for on its own...
        for group, resource, verb in sorted(grants(NAMESPACED_RULES)):
            what = qualified(group, resource)
            for ns in (served, other):
                assert can_i(cluster, release, verb, *what, f"-n={ns}") is (ns in serving), (
                    f"can-i {verb} {' '.join(what)} -n {ns}"
                )
            if verb in ("list", "watch"):
                assert can_i(cluster, release, verb, *what, "-A") is (mode == "clusterwide")
        for group, resource, verb in sorted(grants(cluster_rules)):
            assert can_i(cluster, release, verb, *qualified(group, resource)), (verb, resource)
        # ... and all together, as the API server sums up every binding of the ServiceAccount.
        for ns in (served, other, "default"):
            expected = grants(cluster_rules)
            if ns in serving or mode == "clusterwide":
                expected |= grants(NAMESPACED_RULES)
            assert granted(cluster, release, ns) == expected, ns
    finally:
        uninstall(cluster, helm, release)
        for ns in (served, other):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.cluster
def test_namespaced_install_grants_nothing_outside_its_namespaces(
    cluster: Cluster, helm: Path
) -> None:
    served = cluster.namespace("chart-svc")
    other = cluster.namespace("chart-other")
    release = install(cluster, helm, f"watchNamespaces={json.dumps([served])}")
    try:
        assert can_i(cluster, release, "create", "jobs.batch", f"-n={served}")
        assert can_i(
            cluster, release, "watch", "cosyvoiceservices.tts.cosyvoice.dev", f"-n={served}"
        )
        assert can_i(cluster, release, "list", "nodes")
        # kopf follows the named namespaces it serves.
        assert can_i(cluster, release, "watch", "namespaces")
        assert not can_i(cluster, release, "create", "jobs.batch", f"-n={other}")
        assert not can_i(cluster, release, "list", "configmaps", f"-n={other}")
        assert not can_i(cluster, release, "get", "secrets", f"-n={other}")
        assert not can_i(cluster, release, "list", "cosyvoiceservices.tts.cosyvoice.dev", "-A")
        args = get_json(cluster, "deployment", release.service_account, "-n", release.namespace)[
            "spec"
        ]["template"]["spec"]["containers"][0]["args"]
        assert ["--namespace", served] == args[1:3]
    finally:
        uninstall(cluster, helm, release)
        for ns in (served, other):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# ---- the image allowlist, enforced by the API server ----------------------------------------

GOOD_BUILDER = "ghcr.io/cosyvoice-operator/engine-builder:0.1.0-trtllm0.20.0"
GOOD_SERVING = "nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3"


def image_service(
    name: str, builder_image: str | None = None, serving_image: str | None = None
) -> str:
    spec: dict[str, Any] = {
        "model": {"variant": "cosyvoice3", "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"},
    }
    if builder_image is not None:
        spec["engine"] = {"builderImage": builder_image}
    if serving_image is not None:
        spec["serving"] = {"image": serving_image}
    body = {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {"name": name},
        "spec": spec,
    }
    return json.dumps(body)


def apply_service(
    cluster: Cluster, namespace: str, manifest: str, *args: str
) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", *args, input=manifest, check=False)


def policy_name(release: Release) -> str:
    return f"{release.service_account}-images"


def wait_until_enforced(cluster: Cluster, release: Release, namespace: str) -> None:
    """A new ValidatingAdmissionPolicy is enforced once the API server's informers have it:
    ask (server-side dry runs, nothing is stored) until it refuses, bounded."""
    bad = image_service("probe", builder_image="docker.io/attacker/builder:1")

    def refused() -> str | None:
        proc = apply_service(cluster, namespace, bad, "--dry-run=server")
        return proc.stderr if policy_name(release) in proc.stderr else None

    wait_for(f"policy {policy_name(release)} enforced in {namespace}", refused, timeout=60)


def assert_refused(
    cluster: Cluster, release: Release, namespace: str, manifest: str, field: str, image: str
) -> None:
    proc = apply_service(cluster, namespace, manifest)
    assert proc.returncode != 0, f"{field}={image!r} was admitted in {namespace}"
    error = proc.stderr
    assert policy_name(release) in error, error
    assert f'{field} "{image}" is not allowed' in error, error
    for prefix in DEFAULT_PREFIXES:
        assert f'"{prefix}"' in error, error


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["clusterwide", "namespaced"])
def test_the_api_server_refuses_images_outside_the_allowlist(
    cluster: Cluster, helm: Path, mode: str
) -> None:
    served = cluster.namespace("chart-img")
    other = cluster.namespace("chart-img-other")
    if mode == "clusterwide":
        release = install(cluster, helm)
    else:
        release = install(cluster, helm, f"watchNamespaces={json.dumps([served])}")
    try:
        wait_until_enforced(cluster, release, served)
        field_b, field_s = "spec.engine.builderImage", "spec.serving.image"
        for image in (
            "docker.io/attacker/builder:1",
            # A look-alike of an allowed prefix: the trailing "/" of the prefix keeps it out.
            "ghcr.io/cosyvoice-operator-evil/engine-builder:1",
            "nvcr.io/nvidia",
        ):
            manifest = image_service("bad-builder", builder_image=image)
            assert_refused(cluster, release, served, manifest, field_b, image)
        assert_refused(
            cluster,
            release,
            served,
            image_service("bad-serving", GOOD_BUILDER, "docker.io/library/tritonserver:1"),
            field_s,
            "docker.io/library/tritonserver:1",
        )
        assert not get_json(cluster, "cvs", "-n", served)["items"], "a refused service was stored"

        # Inside the allowlist, and empty (the operator's defaults), is admitted.
        for name, manifest in (
            ("good", image_service("good", GOOD_BUILDER, GOOD_SERVING)),
            ("empty", image_service("empty", "", "")),
            ("unset", image_service("unset")),
        ):
            proc = apply_service(cluster, served, manifest)
            assert proc.returncode == 0, f"{name}: {proc.stderr}"
        stored = get_json(cluster, "cvs", "good", "-n", served)["spec"]
        assert stored["engine"]["builderImage"] == GOOD_BUILDER
        assert stored["serving"]["image"] == GOOD_SERVING

        # Updates are checked too: the stored service keeps its image.
        assert_refused(
            cluster,
            release,
            served,
            image_service("good", GOOD_BUILDER, "docker.io/library/tritonserver:1"),
            field_s,
            "docker.io/library/tritonserver:1",
        )
        stored = get_json(cluster, "cvs", "good", "-n", served)["spec"]
        assert stored["serving"]["image"] == GOOD_SERVING

        # The binding covers the namespaces the operator serves, and only those.
        bad = image_service("bad-builder", builder_image="docker.io/attacker/builder:1")
        proc = apply_service(cluster, other, bad, "--dry-run=server")
        if mode == "clusterwide":
            assert proc.returncode != 0 and policy_name(release) in proc.stderr, proc.stderr
        else:
            assert policy_name(release) not in proc.stderr, proc.stderr
    finally:
        # Services first (no finalizer: gone at once), so that no test that wants the cluster
        # to itself finds them; then the release, and with it the cluster-wide policy.
        for ns in (served, other):
            cluster.kubectl("delete", "cvs", "--all", "-n", ns, check=False)
        uninstall(cluster, helm, release)
        for ns in (served, other):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    assert not exists(cluster, "validatingadmissionpolicy", policy_name(release))
    assert not exists(cluster, "validatingadmissionpolicybinding", policy_name(release))
