"""Issue 21 L7 on a real API server: the chart's NetworkPolicy for the operator's /metrics is
accepted as rendered and selects the operator's pods. (Whether a network plugin enforces it
cannot be seen here: kwok runs no pod network; tests/helm/test_chart_hardening.py checks what
it admits.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chart_tools import install, uninstall
from tests.conftest import Cluster


@pytest.mark.cluster
def test_the_metrics_network_policy_is_accepted_and_selects_the_operator(
    cluster: Cluster, helm: Path
) -> None:
    release = install(
        cluster,
        helm,
        'metrics={"enabled":true}',
        'networkPolicy={"scraperNamespaceLabels":{"kubernetes.io/metadata.name":"monitoring"}}',
    )
    try:
        name = f"{release.service_account}-metrics"
        policy = json.loads(
            cluster.kubectl(
                "get", "networkpolicy", name, "-n", release.namespace, "-o", "json"
            ).stdout
        )
        deployment = json.loads(
            cluster.kubectl(
                "get", "deployment", release.service_account, "-n", release.namespace, "-o", "json"
            ).stdout
        )
        selector = policy["spec"]["podSelector"]["matchLabels"]
        assert selector == deployment["spec"]["selector"]["matchLabels"]
        [rule] = policy["spec"]["ingress"]
        assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
        assert rule["from"] == [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ]
        # The operator's pods (by the API server's own label selection) are what it selects.
        labels = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        pods = json.loads(
            cluster.kubectl(
                "get", "pods", "-n", release.namespace, "-l", labels, "-o", "json"
            ).stdout
        )
        for pod in pods["items"]:
            assert pod["metadata"]["name"].startswith(release.service_account)
    finally:
        uninstall(cluster, helm, release)
