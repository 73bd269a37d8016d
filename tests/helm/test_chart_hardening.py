"""Issue 21 in the chart: the operator's /metrics admits only the scraper (L7), and every
default image the chart or the operator names is under the chart's default allowlist (H3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cosyvoice_operator.render.build_job import BuildSettings
from cosyvoice_operator.render.workloads import ServingSettings
from tests.chart_tools import CHART, DEFAULT_PREFIXES, of_kind, render

METRICS_ON = 'metrics={"enabled":true}'


def _operator_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [deployment] = of_kind(docs, "Deployment")
    template: dict[str, Any] = deployment["spec"]["template"]
    return template


def test_the_operators_metrics_port_admits_only_the_scraper(helm: Path) -> None:
    docs = render(
        helm,
        'networkPolicy={"scraperNamespaceLabels":{"kubernetes.io/metadata.name":"monitoring"}}',
        'metrics={"enabled":true,'
        '"networkPolicy":{"scraperPodLabels":{"app.kubernetes.io/name":"prometheus"}}}',
    )
    [policy] = of_kind(docs, "NetworkPolicy")
    pod = _operator_pod(docs)
    # It selects the operator's pods (and, by the chart's selector labels, only them).
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    [deployment] = of_kind(docs, "Deployment")
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    # Ingress only: one rule, the metrics port, from the scraper's pods in its namespaces.
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]
    # The named port is the container's metrics port (a NetworkPolicy with a port name the
    # pod lacks admits nothing).
    [container] = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == 9090 and set(ports) == {"health", "metrics"}


def test_without_scraper_labels_any_namespace_may_scrape_but_nothing_else(helm: Path) -> None:
    [policy] = of_kind(render(helm, METRICS_ON), "NetworkPolicy")
    [rule] = policy["spec"]["ingress"]
    assert rule == {
        "from": [{"namespaceSelector": {}}],
        "ports": [{"port": "metrics", "protocol": "TCP"}],
    }


def test_no_metrics_or_turned_off_renders_no_operator_policy(helm: Path) -> None:
    assert of_kind(render(helm), "NetworkPolicy") == []  # metrics off: no port to protect
    off = 'metrics={"enabled":true,"networkPolicy":{"enabled":false}}'
    assert of_kind(render(helm, off), "NetworkPolicy") == []
    # The ServiceMonitor turns metrics on, and with it the policy.
    monitored = render(
        helm,
        'monitoring={"requireCRDs":false,"serviceMonitor":{"enabled":true}}',
    )
    assert len(of_kind(monitored, "NetworkPolicy")) == 1


def test_every_default_image_is_under_the_default_allowlist() -> None:
    """H3: the chart's defaults and the operator's are one registry, which the default
    allowlist admits (the README says the project publishes nothing there yet)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["imagePolicy"]["allowedPrefixes"] == DEFAULT_PREFIXES
    registry = DEFAULT_PREFIXES[0]
    defaults = [
        values["image"]["repository"],
        BuildSettings().default_builder_image,
        ServingSettings().default_image,
    ]
    for image in defaults:
        assert image.startswith(registry), image
    # The router's HAProxy (issue 30) is the official image, which the list admits too.
    router = ServingSettings().router_image
    assert router.startswith(tuple(DEFAULT_PREFIXES)) and not router.startswith(registry)
    # The chart leaves the operator's defaults in place (empty values), and its comments name
    # the defaults they stand for.
    config = values["config"]
    assert (config["builderImage"], config["servingImage"], config["routerImage"]) == ("", "", "")
    assert "vllmImage" not in config  # vLLM is refused (issue 19, item 9)
    text = (CHART / "values.yaml").read_text()
    for image in [*defaults[1:], router]:
        assert f"[{image}]" in text, image
