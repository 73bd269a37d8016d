"""The Helm chart as the tests see it: where it is, how to render it, the rules the operator needs
(the RBAC the chart must grant, no more), and a release on the local cluster. Shared by
``tests/helm`` (rendering only) and ``tests/cluster`` (installed); the ``helm`` fixture is in
``tests/conftest.py``."""

from __future__ import annotations

import json
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cosyvoice_operator.devtools.localcluster import binaries
from tests.conftest import REPO, Cluster

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
    # Server-side applied; the first apply creates, which the API server authorizes as create.
    ("apps", "deployments", frozenset({"list", "watch", "create", "patch", "delete"})),
    ("", "services", frozenset({"list", "watch", "create", "patch", "delete"})),
    ("policy", "poddisruptionbudgets", frozenset({"list", "watch", "create", "patch", "delete"})),
    (
        "networking.k8s.io",
        "networkpolicies",
        frozenset({"list", "watch", "create", "patch", "delete"}),
    ),
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
DEFAULT_PREFIXES = ["ghcr.io/cosyvoice-operator/", "nvcr.io/nvidia/", "docker.io/library/haproxy:"]
DEFAULT_PREFIXES_ENV = "ghcr.io/cosyvoice-operator/,nvcr.io/nvidia/,docker.io/library/haproxy:"


# ---- helpers -------------------------------------------------------------------------------


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


# ---- against the cluster -------------------------------------------------------------------


@dataclass
class Release:
    name: str
    namespace: str
    service_account: str


def install(cluster: Cluster, helm: Path, *values: str, chart: Path = CHART) -> Release:
    """`helm install` of the chart (its folder, or a packaged .tgz) into a new namespace."""
    name = f"cvo-{uuid.uuid4().hex[:6]}"
    namespace = cluster.namespace("chart")
    sets = [a for v in values for a in ("--set-json", v)]
    run_helm(helm, "install", name, str(chart), "--namespace", namespace, *sets, env=cluster.env)
    # The full name is <release>-<chart> (the release name does not contain the chart's name).
    return Release(name, namespace, f"{name}-cosyvoice-operator")


def uninstall(cluster: Cluster, helm: Path, release: Release) -> None:
    run_helm(helm, "uninstall", release.name, "--namespace", release.namespace, env=cluster.env)
    cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


def exists(cluster: Cluster, *what: str) -> bool:
    return cluster.kubectl("get", *what, "-o", "name", check=False).returncode == 0
