"""The chart's admission policy on the operator's own ServiceAccount (issue 21 M7), as a real
kube-apiserver enforces it: whatever RBAC grants, the operator writes only objects labelled as
its own, whose pods run allowed images as no other ServiceAccount and without host access.

Requests are made as the ServiceAccount (kubectl --as) and, where nothing needs to stay,
as server-side dry runs (admission runs, nothing is stored). That the real operator's objects
pass is shown by tests/cluster/test_chart.py's build under the chart's permissions, which
installs the chart with this policy on (the default).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chart_tools import Release, install, uninstall
from tests.cluster.operator_process import wait_for
from tests.conftest import Cluster

MANAGED = {"app.kubernetes.io/managed-by": "cosyvoice-operator"}
GOOD_IMAGE = "ghcr.io/cosyvoice-operator/engine-builder:0.1.0-trtllm0.20.0"


@pytest.fixture(scope="module")
def release(cluster: Cluster, helm: Path) -> Iterator[Release]:
    # imagePolicy stays on: the operator policy takes its prefixes from it.
    installed = install(cluster, helm, 'config={"buildServiceAccount":"engine-builder"}')
    yield installed
    uninstall(cluster, helm, installed)


def as_operator(
    cluster: Cluster, release: Release, *args: str, body: Any = None, dry_run: bool = True
) -> subprocess.CompletedProcess[str]:
    who = f"--as=system:serviceaccount:{release.namespace}:{release.service_account}"
    extra = ["--dry-run=server"] if dry_run else []
    return cluster.kubectl(
        *args,
        who,
        *extra,
        input=None if body is None else json.dumps(body),
        check=False,
    )


def config_map(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels or {}},
        "data": {"x": "y"},
    }


def job(name: str, **pod: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "containers": [{"name": "build", "image": GOOD_IMAGE}],
    }
    spec.update(pod)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": dict(MANAGED)},
        "spec": {"template": {"metadata": {"labels": dict(MANAGED)}, "spec": spec}},
    }


def create(
    cluster: Cluster, release: Release, namespace: str, body: dict[str, Any], dry_run: bool = True
) -> subprocess.CompletedProcess[str]:
    return as_operator(
        cluster, release, "create", "-n", namespace, "-f", "-", body=body, dry_run=dry_run
    )


def policy(release: Release) -> str:
    return f"{release.service_account}-operator"


def refused(proc: subprocess.CompletedProcess[str], release: Release, words: str) -> None:
    assert proc.returncode != 0, f"admitted:\n{proc.stdout}"
    assert policy(release) in proc.stderr, proc.stderr
    assert words in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def served(cluster: Cluster, release: Release) -> str:
    namespace = cluster.namespace("oppol")

    def enforced() -> str | None:
        proc = create(cluster, release, namespace, config_map("probe"))
        return proc.stderr if policy(release) in proc.stderr else None

    wait_for(f"policy {policy(release)} enforced", enforced, timeout=60)
    return namespace


@pytest.mark.cluster
def test_objects_without_the_managed_by_label_are_refused(
    cluster: Cluster, release: Release, served: str
) -> None:
    refused(create(cluster, release, served, config_map("plain")), release, "managed-by")
    unlabelled = job("plain")
    # (A Job without labels takes its pod template's: both go.)
    unlabelled["metadata"]["labels"] = {}
    unlabelled["spec"]["template"]["metadata"]["labels"] = {}
    refused(create(cluster, release, served, unlabelled), release, "managed-by")
    assert create(cluster, release, served, config_map("ours", MANAGED)).returncode == 0


@pytest.mark.cluster
def test_someone_elses_object_is_neither_changed_nor_deleted(
    cluster: Cluster, release: Release, served: str
) -> None:
    cluster.kubectl("create", "-n", served, "-f", "-", input=json.dumps(config_map("victim")))
    # Labelling it as the operator's does not make it the operator's.
    # (Server-side apply, as the operator writes: a PATCH without a GET, which it may not.)
    proc = as_operator(
        cluster,
        release,
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=cosyvoice-operator",
        "-n",
        served,
        "-f",
        "-",
        body=config_map("victim", MANAGED),
    )
    refused(proc, release, "managed-by")
    proc = as_operator(cluster, release, "delete", "configmap", "victim", "-n", served)
    refused(proc, release, "managed-by")
    # Its own it deletes.
    cluster.kubectl(
        "create", "-n", served, "-f", "-", input=json.dumps(config_map("record", MANAGED))
    )
    proc = as_operator(
        cluster, release, "delete", "configmap", "record", "-n", served, dry_run=False
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.cluster
def test_a_well_formed_job_is_admitted(cluster: Cluster, release: Release, served: str) -> None:
    for pod in ({}, {"serviceAccountName": "engine-builder"}, {"serviceAccountName": "default"}):
        proc = create(cluster, release, served, job("build", **pod))
        assert proc.returncode == 0, (pod, proc.stderr)


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("case", "pod", "words"),
    [
        (
            "image",
            {"containers": [{"name": "x", "image": "docker.io/attacker/miner:latest"}]},
            "allowedPrefixes",
        ),
        (
            "lookalike-image",
            {"containers": [{"name": "x", "image": "ghcr.io/cosyvoice-operator-evil/x:1"}]},
            "allowedPrefixes",
        ),
        (
            "init-container-image",
            {"initContainers": [{"name": "x", "image": "docker.io/attacker/miner:latest"}]},
            "allowedPrefixes",
        ),
        ("service-account", {"serviceAccountName": "cluster-admin-sa"}, "ServiceAccount"),
        ("token-mounted", {"automountServiceAccountToken": True}, "automountServiceAccountToken"),
        ("host-network", {"hostNetwork": True}, "host namespace"),
        (
            "host-path",
            {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
            "hostPath",
        ),
        (
            "privileged",
            {
                "containers": [
                    {"name": "x", "image": GOOD_IMAGE, "securityContext": {"privileged": True}}
                ]
            },
            "privileged",
        ),
    ],
)
def test_a_job_the_operator_never_renders_is_refused(
    cluster: Cluster, release: Release, served: str, case: str, pod: dict[str, Any], words: str
) -> None:
    refused(create(cluster, release, served, job(f"bad-{case}", **pod)), release, words)


@pytest.mark.cluster
def test_a_job_in_kube_system_as_a_privileged_account_is_refused(
    cluster: Cluster, release: Release, served: str
) -> None:
    """The review's escalation: a compromised cluster-wide operator creating a Job in
    kube-system under a powerful ServiceAccount. RBAC lets it create the Job; the policy
    does not."""
    bad = job("escalate", serviceAccountName="clusterrole-aggregation-controller")
    refused(create(cluster, release, "kube-system", bad), release, "ServiceAccount")


@pytest.mark.cluster
def test_other_users_are_not_matched(cluster: Cluster, release: Release, served: str) -> None:
    proc = cluster.kubectl(
        "create",
        "-n",
        served,
        "-f",
        "-",
        "--dry-run=server",
        input=json.dumps(job("admins", hostNetwork=True)),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
