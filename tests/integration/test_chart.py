"""The Helm chart: it lints and renders, it installs and uninstalls on a real control plane, and
its RBAC is both enough and no more than enough.

Enough is shown for real: there is no kubelet here (kwok plays the pods), so the operator runs
as a local process that authenticates with a token of the chart's ServiceAccount, and must take
a service to EngineReady without a single Forbidden. No more than enough: the rendered rules
are compared with the list of calls the operator makes, and `kubectl auth can-i --as` checks
what the ServiceAccount may not do.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cosyvoice_operator.localcluster import binaries
from tests.conftest import CRD_DIR, REPO, Cluster
from tests.integration.operator_process import OperatorProcess, cache_claim, get_json, wait_for

CHART = REPO / "charts" / "cosyvoice-operator"
KUBE_VERSION = binaries.KUBERNETES_VERSION.lstrip("v")
L20 = {"nvidia.com/gpu.product": "NVIDIA-L20"}

Rule = tuple[str, str, frozenset[str]]  # (apiGroup, resource, verbs)

# What the operator (operator/cosyvoice_operator/kube.py, handlers.py) and kopf call, rule by
# rule. A change to the chart's RBAC must show up here as a readable diff. kopf lists, watches
# and patches (never get/update/delete) and posts core/v1 Events; the operator gets a few objects
# by name, lists, creates, and patches status.
NAMESPACED_RULES: set[Rule] = {
    ("tts.cosyvoice.dev", "cosyvoiceservices", frozenset({"get", "list", "watch", "patch"})),
    ("tts.cosyvoice.dev", "cosyvoiceservices/status", frozenset({"patch"})),
    ("", "events", frozenset({"create"})),
    ("batch", "jobs", frozenset({"list", "create"})),
    ("", "pods", frozenset({"list"})),
    ("", "configmaps", frozenset({"get", "create"})),
    ("", "persistentvolumeclaims", frozenset({"get"})),
    ("", "secrets", frozenset({"get"})),
}
CLUSTER_RULES: set[Rule] = {
    ("", "nodes", frozenset({"list"})),
    ("apiextensions.k8s.io", "customresourcedefinitions", frozenset({"list", "watch"})),
}
# kopf follows the namespaces it serves only when it serves named ones.
NAMESPACES_RULE: Rule = ("", "namespaces", frozenset({"list", "watch"}))
PEERING_VERBS = frozenset({"list", "watch", "patch"})


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


def test_chart_crds_are_byte_copies_of_the_top_level_crds() -> None:
    top = {p.name: p.read_bytes() for p in sorted(CRD_DIR.glob("*.yaml"))}
    chart = {p.name: p.read_bytes() for p in sorted((CHART / "crds").glob("*.yaml"))}
    assert top, f"no CRD in {CRD_DIR}"
    assert set(chart) == set(top), "charts/cosyvoice-operator/crds/ and crds/ list other files"
    for name, data in top.items():
        assert chart[name] == data, (
            f"charts/cosyvoice-operator/crds/{name} differs from crds/{name}: "
            f"cp crds/{name} charts/cosyvoice-operator/crds/"
        )


@pytest.mark.parametrize(
    "values",
    [
        (),
        ('watchNamespaces=["tts-a","tts-b"]',),
        ('peering={"enabled":true}', "replicaCount=2"),
        ('watchNamespaces=["tts-a"]', 'peering={"enabled":true}'),
    ],
    ids=["defaults", "namespaced", "peering", "namespaced-peering"],
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
    # Unset settings leave the operator's defaults alone.
    assert not any(name.startswith("COSYVOICE_") for name in env_of(docs))


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
                "resyncSeconds": 5,
                "peeringLifetimeSeconds": 20,
                "prometheusUrl": "http://prometheus:9090",
            }
        ),
        'nodeSelector={"role":"ops"}',
        'tolerations=[{"key":"ops","operator":"Exists"}]',
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
        "COSYVOICE_RESYNC_SECONDS": "5",
        "COSYVOICE_PEERING_LIFETIME_SECONDS": "20",
        "COSYVOICE_PROMETHEUS_URL": "http://prometheus:9090",
    }
    # And the operator accepts them as they are.
    from cosyvoice_operator import config

    loaded = config.load(env)
    assert loaded.build.backoff_limit == 0 and loaded.build.active_deadline_seconds == 1000000
    assert loaded.build.pod_annotations == {"example.com/team": "tts"}
    assert loaded.build.image_pull_secrets == ("regcred", "other")
    assert loaded.peering_lifetime_seconds == 20
    [deployment] = of_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "ops"}
    assert pod["tolerations"] == [{"key": "ops", "operator": "Exists"}]


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
    watches, and the resync loop lists, services across the cluster."""

    def start(self) -> ClusterwideOperator:
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
    release = install(cluster, helm)
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
    # The operator's own checks touch every granted kind: the cache claim (PVC get), the
    # credentials Secret (Secret get), nodes (list), the Job (list, create) and its pods (list),
    # the record ConfigMap (get, create), Events (create), the status subresource (patch), and
    # the services themselves (kopf's list, watch and patch; the resync loop's list).
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
        events = get_json(cluster, "events", "-n", served)["items"]
        reasons = {e["reason"] for e in events if e["involvedObject"]["name"] == "rbac"}
        assert {"EngineBuildStarted", "EngineReady"} <= reasons, reasons
        # A few more resyncs (1 s): a permission only a later pass needs shows up too, and the
        # resync loop's status patches leave the condition as it is.
        time.sleep(3)
        obj = get_json(cluster, "cvs", "rbac", "-n", served)
        assert condition(obj, "EngineReady").get("status") == "True", obj.get("status")
        # No finalizer (no kopf timers, no deletion handler): deletion never waits on the
        # operator, and the operator sees the deletion through without being refused anything.
        assert not obj["metadata"].get("finalizers"), obj["metadata"].get("finalizers")
        cluster.kubectl("delete", "cvs", "rbac", "-n", served, "--timeout=30s")
        assert not exists(cluster, "cvs", "rbac", "-n", served)
        time.sleep(2)  # resync passes after the deletion
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


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("verb", "resource", "scope", "allowed"),
    [
        # what it needs
        ("watch", "cosyvoiceservices.tts.cosyvoice.dev", "-A", True),
        ("list", "cosyvoiceservices.tts.cosyvoice.dev", "-A", True),
        ("patch", "cosyvoiceservices.tts.cosyvoice.dev", "-n=default", True),
        ("get", "cosyvoiceservices.tts.cosyvoice.dev", "-n=default", True),
        ("patch", "cosyvoiceservices.tts.cosyvoice.dev/status", "-n=default", True),
        ("create", "jobs.batch", "-n=default", True),
        ("list", "jobs.batch", "-n=default", True),
        ("list", "pods", "-n=default", True),
        ("get", "configmaps", "-n=default", True),
        ("create", "configmaps", "-n=default", True),
        ("get", "persistentvolumeclaims", "-n=default", True),
        ("get", "secrets", "-n=default", True),
        ("list", "nodes", "", True),
        ("create", "events", "-n=default", True),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io", "", True),
        # what it must not do
        ("delete", "nodes", "", False),
        ("patch", "nodes", "", False),
        ("get", "nodes", "", False),
        ("watch", "nodes", "", False),
        ("list", "secrets", "-A", False),
        ("list", "secrets", "-n=default", False),
        ("watch", "secrets", "-n=default", False),
        ("create", "deployments.apps", "-n=kube-system", False),
        ("create", "pods", "-n=default", False),
        ("get", "pods", "-n=default", False),
        ("watch", "pods", "-n=default", False),
        ("delete", "cosyvoiceservices.tts.cosyvoice.dev", "-n=default", False),
        ("update", "cosyvoiceservices.tts.cosyvoice.dev", "-n=default", False),
        ("update", "cosyvoiceservices.tts.cosyvoice.dev/status", "-n=default", False),
        ("patch", "cosyvoiceservices.tts.cosyvoice.dev/scale", "-n=default", False),
        ("delete", "jobs.batch", "-n=default", False),
        ("get", "jobs.batch", "-n=default", False),
        ("watch", "jobs.batch", "-n=default", False),
        ("patch", "jobs.batch", "-n=default", False),
        ("update", "configmaps", "-n=default", False),
        ("delete", "configmaps", "-n=default", False),
        ("list", "configmaps", "-n=default", False),
        ("watch", "configmaps", "-n=default", False),
        ("patch", "events", "-n=default", False),
        ("create", "events.events.k8s.io", "-n=default", False),
        ("create", "persistentvolumeclaims", "-n=default", False),
        ("list", "persistentvolumeclaims", "-n=default", False),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", "", False),
        ("escalate", "clusterroles.rbac.authorization.k8s.io", "", False),
        ("impersonate", "serviceaccounts", "-A", False),
        ("create", "serviceaccounts/token", "-A", False),
        ("patch", "customresourcedefinitions.apiextensions.k8s.io", "", False),
        ("get", "customresourcedefinitions.apiextensions.k8s.io", "", False),
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
