"""The Helm chart rendered (no cluster): it lints and templates, its RBAC is the least the operator
needs, values become the operator's settings, and its admission policies are what they claim.
Installed on a real control plane: ``tests/cluster/test_chart.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.chart_tools import (
    CHART,
    CLUSTER_RULES,
    DEFAULT_PREFIXES,
    DEFAULT_PREFIXES_ENV,
    KUBE_VERSION,
    NAMESPACED_RULES,
    NAMESPACES_RULE,
    PEERING_VERBS,
    cel_prefixes,
    container_args,
    env_of,
    image_policies,
    of_kind,
    of_policy,
    render,
    rules_of,
    run_helm,
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
                "routerImage": "registry.example/haproxy:3.2",
                "metricsWindowSeconds": 30,
                "allowedPrometheusUrls": ["https://thanos.example/q", "http://p2:9090"],
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
        "COSYVOICE_ROUTER_IMAGE": "registry.example/haproxy:3.2",
        "COSYVOICE_METRICS_WINDOW_SECONDS": "30",
        "COSYVOICE_ALLOWED_PROMETHEUS_URLS": "https://thanos.example/q,http://p2:9090",
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
    """Issue 21 M7 (the API server's side: tests/cluster/test_operator_policy.py)."""
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
