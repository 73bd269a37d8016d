"""The chart's monitoring rendered, no cluster: `helm lint` with monitoring on; `values.schema.json`
refuses typos; the monitors select what the chart and the operator really render; promtool checks
the rules and runs their unit tests (tests/monitoring/alerts.test.yaml: every alert firing and
not firing). Installed and in a real run: ``tests/cluster/test_monitoring.py``."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from cosyvoice_operator.cli import render_command
from cosyvoice_operator.render import triton
from cosyvoice_operator.shell import config
from tests.conftest import REPO
from tests.monitoring_tools import (
    ALERT_TESTS,
    ALL_MONITORING,
    CHART,
    KUBE_VERSION,
    NO_CRD_CHECK,
    RUNBOOK,
    alerts,
    dashboard_of,
    dashboard_queries,
    one,
    promtool,
    render_chart,
    rule_groups,
    run_helm,
    sanitize,
)

# ---- no cluster needed ---------------------------------------------------------------------


def test_lint_with_everything_on(helm: Path) -> None:
    for values in (
        (
            ALL_MONITORING,
            NO_CRD_CHECK,
            'peering={"enabled":true,"installCRDs":true}',
            'logFormat="json"',
        ),
        (
            ALL_MONITORING,
            NO_CRD_CHECK,
            'watchNamespaces=["tts-a"]',
            'metrics={"enabled":true,"port":9100}',
        ),
    ):
        sets = [a for v in values for a in ("--set-json", v)]
        lint = run_helm(helm, "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, *sets)
        assert "0 chart(s) failed" in lint.stdout, lint.stdout


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('monitoring={"serviceMonitr":{"enabled":true}}', "'serviceMonitr' not allowed"),
        ('monitoring={"prometheusRule":{"enabled":"yes"}}', "want boolean"),
        ('monitoring={"prometheusRule":{"alerts":{"requestFailures":{"ratio":5}}}}', "maximum"),
        ('monitoring={"prometheusRule":{"rateWindow":"5 minutes"}}', "does not match pattern"),
        ('monitoring={"dashboard":{"labels":{"grafana_dashboard":1}}}', "want string"),
        ('metrics={"port":"9090"}', "want integer"),
        ('config={"wrokers":8}', "'wrokers' not allowed"),
        ('imag={"tag":"1"}', "'imag' not allowed"),
        ('logFormat="yaml"', "logFormat"),
        ('peering={"installCRD":true}', "'installCRD' not allowed"),
    ],
)
def test_a_typo_in_values_fails_before_anything_is_installed(
    helm: Path, value: str, message: str
) -> None:
    proc = run_helm(helm, "template", "cvo", str(CHART), "--set-json", value, check=False)
    assert proc.returncode != 0, f"{value} rendered:\n{proc.stdout[:500]}"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "value",
    [
        "monitoring.serviceMonitor.enabled",
        "monitoring.podMonitor.enabled",
        "monitoring.prometheusRule.enabled",
    ],
)
def test_monitoring_without_the_prometheus_operator_says_what_to_install(
    helm: Path, value: str
) -> None:
    """A cluster without monitoring.coreos.com/v1 (helm template without --api-versions is
    one): the chart refuses with what to install, not the API server's "no matches for kind"."""
    proc = run_helm(
        helm, "template", "cvo", str(CHART), "--kube-version", KUBE_VERSION,
        "--set", f"{value}=true", check=False,
    )  # fmt: skip
    assert proc.returncode != 0, f"{value} rendered without the CRDs:\n{proc.stdout[:300]}"
    assert f"{value}=true needs the Prometheus Operator's CRDs" in proc.stderr, proc.stderr
    assert "kube-prometheus-stack" in proc.stderr and "--api-versions" in proc.stderr
    # The dashboard is a ConfigMap: it needs no CRD.
    docs = run_helm(
        helm, "template", "cvo", str(CHART), "--kube-version", KUBE_VERSION,
        "--set", "monitoring.dashboard.enabled=true",
    ).stdout  # fmt: skip
    assert "kind: ConfigMap" in docs


def test_every_alert_links_its_runbook_section(helm: Path) -> None:
    found = alerts(render_chart(helm, 'monitoring={"prometheusRule":{"enabled":true}}'))
    home = yaml.safe_load((CHART / "Chart.yaml").read_text())["home"]
    sections = {
        line[3:].strip().lower() for line in RUNBOOK.read_text().splitlines() if line[:3] == "## "
    }
    for name, rule in found.items():
        url = rule["annotations"]["runbook_url"]
        assert url == f"{home}/blob/main/docs/operations/runbook.md#{name.lower()}", url
        assert name.lower() in sections, f"docs/operations/runbook.md has no section {name}"
    assert len(sections) == len(found), "a runbook section without its alert"
    moved = alerts(
        render_chart(
            helm,
            'monitoring={"prometheusRule":{"enabled":true,'
            '"runbookUrl":"https://wiki.example/tts/runbook"}}',
        )
    )
    assert {r["annotations"]["runbook_url"] for r in moved.values()} == {
        f"https://wiki.example/tts/runbook#{name.lower()}" for name in moved
    }


def test_every_default_value_is_in_the_schema(helm: Path) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: Any, sch: dict[str, Any], path: str) -> None:
        if not isinstance(node, dict) or sch.get("type") != "object" or "properties" not in sch:
            return
        for key, child in node.items():
            assert key in sch["properties"], f"{path}{key} is not in values.schema.json"
            walk(child, sch["properties"][key], f"{path}{key}.")
        assert sch.get("additionalProperties") is False, f"{path or 'values'} is open to typos"

    walk(values, schema, "")


def test_monitoring_is_off_by_default(helm: Path) -> None:
    docs = render_chart(helm)
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap", "Service"}
    assert not any(d["kind"] == "CustomResourceDefinition" for d in docs)


def test_the_service_monitor_scrapes_the_operators_metrics_port(helm: Path) -> None:
    docs = render_chart(helm, 'monitoring={"serviceMonitor":{"enabled":true}}')
    monitor = one(docs, "ServiceMonitor")
    svc = one(docs, "Service")
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]
    [container] = pod["spec"]["containers"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["cosyvoice-system"]}
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    [port] = [p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]]
    [container_port] = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    args = container["args"]
    assert args[args.index("--metrics-port") + 1] == str(container_port["containerPort"])
    # The per-service series keep the CosyVoiceService's namespace and service.
    assert endpoint["honorLabels"] is True
    # Only one Service selects the operator's metrics: the Deployment's own label set, not
    # another release's (the instance label is in the selector).
    assert selector["app.kubernetes.io/instance"] == "cvo"


def test_the_pod_monitor_selects_the_pods_the_operator_renders(helm: Path, tmp_path: Path) -> None:
    docs = render_chart(helm, 'monitoring={"podMonitor":{"enabled":true}}')
    monitor = one(docs, "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    served = render_chart(
        helm, 'monitoring={"podMonitor":{"enabled":true}}', 'watchNamespaces=["tts-a","tts-b"]'
    )
    assert one(served, "PodMonitor")["spec"]["namespaceSelector"] == {
        "matchNames": ["tts-a", "tts-b"]
    }
    body = render_command.load_service(
        (REPO / "examples" / "cosyvoice3.yaml").read_text(), "example"
    )
    objects = render_command.render_service(body, ["NVIDIA-L20"], config.load({}), "tts")
    deployments = {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o
        for o in objects
        if o["kind"] == "Deployment"
    }
    deployment = deployments["serving"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]

    def selected(pod: dict[str, str]) -> bool:
        selector = monitor["spec"]["selector"]
        return selector["matchLabels"].items() <= pod.items() and all(
            pod.get(e["key"]) in e["values"] for e in selector["matchExpressions"]
        )

    assert selected(labels) and labels[monitor["spec"]["jobLabel"]] == "cosyvoice-triton"
    # The router pods (issue 30: mode Router by default): HAProxy's exporter on "metrics".
    router = deployments["router"]["spec"]["template"]
    assert selected(router["metadata"]["labels"])
    assert router["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "cosyvoice-router"
    [haproxy] = router["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in haproxy["ports"]}["metrics"] == 8404
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    # Triton's metrics, and cosyvoice-serve's stub-health counters on the health port.
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {e["port"]: ports[e["port"]] for e in endpoints} == {"metrics": 8002, "health": 8003}
    pod_label = {f"__meta_kubernetes_pod_label_{sanitize(k)}": v for k, v in labels.items()}
    for endpoint in endpoints:
        assert endpoint["path"] == "/metrics"
        relabeled = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
        assert pod_label[relabeled["service"][0]] == "cosyvoice3"
        assert pod_label[relabeled["gpu_arch"][0]] == "sm_89"
    # The NetworkPolicy the operator renders lets the scraper reach both ports.
    [policy] = [
        o
        for o in objects
        if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "cvs-cosyvoice3"
    ]
    scraped = {
        p["port"]
        for rule in policy["spec"]["ingress"]
        if "namespaceSelector" in rule["from"][0]
        for p in rule["ports"]
    }
    assert scraped == {8002, 8003}
    # The rules and the dashboard select Triton's series by the job the PodMonitor gives them,
    # and client requests by the orchestrator model of each variant.
    default = yaml.safe_load((CHART / "values.yaml").read_text())
    assert default["monitoring"]["tritonSelector"] == 'job="cosyvoice-triton"'
    orchestrators = "|".join(sorted(triton.orchestrator(v) for v in triton.MODEL_NAMES))
    docs = render_chart(helm, ALL_MONITORING)
    request_level = ("request_success", "request_failure", "queue_duration", "pending_request")
    exprs = [r["expr"] for r in alerts(docs).values()] + [
        e for _, e in dashboard_queries(dashboard_of(docs))
    ]
    request_selectors = [
        (selector, expr)
        for expr in exprs
        for selector in re.findall(r"nv_inference_(\w+)\{([^}]*)\}", expr)
        if selector[0].startswith(request_level)
    ]
    # Not vacuous: the alerts and the dashboard do read request-level series.
    assert len(request_selectors) >= 4, request_selectors
    for (_, labels_text), expr in request_selectors:
        assert f'model=~"{orchestrators}"' in labels_text, expr


def test_rules_pass_promtool_and_every_alert_is_tested_firing_and_not(
    helm: Path, tmp_path: Path
) -> None:
    docs = render_chart(helm, 'monitoring={"prometheusRule":{"enabled":true}}')
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(docs)))
    checked = promtool("check", "rules", str(tmp_path / "rules.yaml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alerts(docs))} rules found" in checked.stdout
    shutil.copy(ALERT_TESTS, tmp_path / "alerts.test.yaml")
    tested = promtool("test", "rules", str(tmp_path / "alerts.test.yaml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout

    firing: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert firing == set(alerts(docs)), "alerts without a firing test"
    assert quiet == set(alerts(docs)), "alerts without a test where they must not fire"


def test_thresholds_and_durations_are_values(helm: Path) -> None:
    docs = render_chart(
        helm,
        'monitoring={"prometheusRule":{"enabled":true,"rateWindow":"2m",'
        '"alertLabels":{"team":"tts"},"alerts":{'
        '"requestFailures":{"ratio":0.2,"for":"7m","severity":"page"},'
        '"queueLatencyOverTarget":{"factor":1.5},'
        '"reconcileErrors":{"enabled":false}}}}',
        release="edge",
        namespace="ops",
    )
    found = alerts(docs)
    failures = found["CosyVoiceRequestFailures"]
    assert failures["for"] == "7m" and failures["labels"] == {"severity": "page", "team": "tts"}
    assert failures["expr"].rstrip().endswith("> 0.2") and "[2m]" in failures["expr"]
    assert "* 1.5)" in found["CosyVoiceQueueLatencyOverTarget"]["expr"]
    assert (
        'job="edge-cosyvoice-operator-metrics", namespace="ops"'
        in (found["CosyVoiceOperatorDown"]["expr"])
    )
    assert "CosyVoiceReconcileErrors" not in found


def test_the_dashboard_is_a_sidecar_configmap_with_a_query_per_panel(helm: Path) -> None:
    docs = render_chart(
        helm,
        'monitoring={"dashboard":{"enabled":true,"labels":{"grafana_dashboard":"yes"},'
        '"annotations":{"grafana_folder":"TTS"},"namespace":"monitoring"},'
        '"tritonSelector":"job=\\"triton\\", cluster=\\"eu\\""}',
    )
    cm = one(docs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "yes"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "TTS"}
    assert cm["metadata"]["namespace"] == "monitoring"
    dashboard = dashboard_of(docs)
    assert "__TRITON_SELECTOR__" not in json.dumps(dashboard)
    triton = [e for _, e in dashboard_queries(dashboard) if "nv_" in e]
    assert triton and all('{job="triton", cluster="eu", ' in e for e in triton), triton
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    titles = {p["title"] for p in panels}
    for wanted in (
        "Requests per second",
        "Queue latency per request",
        "First audio p95 and request time",
        "GPU utilisation",
        "GPU memory used",
        "Replicas: desired vs ready",
        "Scale decisions",
        "Reconciles per second",
        "Engine builds finished (1h)",
        "Engine build duration, median (6h)",
        "Errors",
    ):
        assert wanted in titles
    for p in panels:
        assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
    default = dashboard_of(render_chart(helm, 'monitoring={"dashboard":{"enabled":true}}'))
    assert (
        one(render_chart(helm, 'monitoring={"dashboard":{"enabled":true}}'), "ConfigMap")[
            "metadata"
        ]["labels"]["grafana_dashboard"]
        == "1"
    )
    triton = [e for _, e in dashboard_queries(default) if "nv_" in e]
    assert triton and all('{job="cosyvoice-triton", ' in e for e in triton), triton
