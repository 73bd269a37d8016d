"""The chart's monitoring as the tests see it: rendering it, its rules, alerts and dashboard
queries, and promtool. Shared by ``tests/helm/test_monitoring.py`` (rendered) and
``tests/cluster/test_monitoring.py`` (installed, and a real run)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from cosyvoice_operator.devtools.localcluster import binaries
from tests.conftest import REPO

CHART = REPO / "charts" / "cosyvoice-operator"
PEERING_CRDS = CHART / "charts" / "kopf-peering-crds" / "crds" / "kopf-peering.yaml"
ALERT_TESTS = REPO / "tests" / "monitoring" / "alerts.test.yaml"
KUBE_VERSION = binaries.KUBERNETES_VERSION.lstrip("v")
L20 = {"nvidia.com/gpu.product": "NVIDIA-L20"}

# The Prometheus Operator's CRDs: the module zip the Go proxy serves for this version (its
# example/prometheus-operator-crd/ folder), checked against this digest of the zip.
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
PROMETHEUS_OPERATOR_ZIP_SHA256 = "0bdb88ed823d0f2e86cf909638439b6ad1da744a228172c7411d9987527dc5d1"
PROMETHEUS_OPERATOR_CRDS = ("servicemonitors", "podmonitors", "prometheusrules")

# What a cluster with the Prometheus Operator's CRDs serves; `helm template` knows no cluster,
# so it is told (`helm lint` cannot be: it gets monitoring.requireCRDs=false instead).
MONITORING_API = "monitoring.coreos.com/v1"
NO_CRD_CHECK = "monitoring.requireCRDs=false"
RUNBOOK = REPO / "docs" / "operations" / "runbook.md"

ALL_MONITORING = (
    'monitoring={"serviceMonitor":{"enabled":true},"podMonitor":{"enabled":true},'
    '"prometheusRule":{"enabled":true},"dashboard":{"enabled":true}}'
)


# ---- helpers -------------------------------------------------------------------------------


def run_helm(
    helm: Path, *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=180, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def render_chart(
    helm: Path, *values: str, release: str = "cvo", namespace: str = "cosyvoice-system"
) -> list[dict[str, Any]]:
    sets = [a for v in values for a in ("--set-json", v)]
    out = run_helm(
        helm, "template", release, str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION,
        "--api-versions", MONITORING_API, *sets,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[dict[str, Any]], kind: str, component: str | None = None) -> dict[str, Any]:
    found = [
        d
        for d in docs
        if d["kind"] == kind
        and (
            component is None
            or d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
        )
    ]
    assert len(found) == 1, f"{len(found)} {kind} rendered"
    return found[0]


def sanitize(label: str) -> str:
    """A Kubernetes label name as Prometheus' Kubernetes discovery names it."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def dashboard_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    cm = one(docs, "ConfigMap")
    found: dict[str, Any] = json.loads(cm["data"]["cosyvoice.json"])
    return found


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel."""
    return [
        (p["title"], t["expr"])
        for p in dashboard["panels"]
        if p["type"] != "row"
        for t in p["targets"]
    ]


def grafana_to_promql(expr: str, rate_interval: str) -> str:
    """What Grafana sends to Prometheus for "All" of both variables and a rate interval."""
    return (
        expr.replace("$__rate_interval", rate_interval)
        .replace("$namespace", ".*")
        .replace("$service", ".*")
    )


def rule_groups(docs: list[dict[str, Any]]) -> dict[str, Any]:
    rule = one(docs, "PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def alerts(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule_groups(docs)["groups"] for r in g["rules"]}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is not on PATH: run scripts/setup.sh (Debian's prometheus package)"
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)
