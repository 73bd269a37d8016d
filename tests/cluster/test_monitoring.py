"""Observability, proven with real parts: the chart's ServiceMonitor, PodMonitor, PrometheusRule
and Grafana dashboard; the operator's metrics and logs.

Rendered only (no cluster): ``tests/helm/test_monitoring.py``.

On the local cluster: the Prometheus Operator's CRDs (from the Go module proxy's zip of
github.com/prometheus-operator/prometheus-operator, pinned by version and checksum, cached
outside the repository) installed, the chart installed with everything on, upgraded with a
values change, uninstalled: nothing is left but CRDs.

The closed run: the operator as a process (JSON logs, peering through the chart's own peering
CRDs and object), three services (one autoscaled and loaded, whose Ready pods each get a real
CPU tritonserver; one whose pods have no Triton and an HPA on them; one whose build gives up),
and Debian's Prometheus scraping the operator and the Tritons with the labels the chart's
monitors give them, and evaluating the chart's rules. Every expression of the dashboard and of
the rules is then evaluated by that Prometheus and must return data; the PNG of the dashboard
is drawn from the same answers.

How the scrape configs stand in for the Prometheus Operator: there is no kubelet and no
Prometheus Operator here, so the test writes the scrape configs that the Prometheus Operator
generates from the rendered ServiceMonitor and PodMonitor (target labels namespace, pod,
container, endpoint, job; the PodMonitor's keep rules on the pod's labels and port name; its
relabelings copied as rendered), over targets on loopback that carry the real pods' labels as
`__meta_kubernetes_*` labels.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import signal
import time
import urllib.parse
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cosyvoice_operator.api.spec import parse
from cosyvoice_operator.devtools.closedloop.harness import PodServers, ready_pods
from cosyvoice_operator.devtools.closedloop.load import LoadGenerator
from cosyvoice_operator.devtools.closedloop.prometheus import Prometheus
from cosyvoice_operator.devtools.localcluster import binaries
from tests.cluster.operator_process import (
    OperatorProcess,
    cache_claim,
    free_port,
    get_json,
    service,
    wait_for,
)
from tests.conftest import Cluster
from tests.monitoring_tools import (
    ALL_MONITORING,
    CHART,
    L20,
    PEERING_CRDS,
    PROMETHEUS_OPERATOR_CRDS,
    PROMETHEUS_OPERATOR_VERSION,
    PROMETHEUS_OPERATOR_ZIP_SHA256,
    alerts,
    dashboard_of,
    dashboard_queries,
    grafana_to_promql,
    one,
    render_chart,
    rule_groups,
    run_helm,
    sanitize,
)

# ---- the Prometheus Operator's CRDs --------------------------------------------------------


def _go_proxy() -> str:
    for entry in re.split(r"[,|]", os.environ.get("GOPROXY", "")):
        if entry.startswith(("http://", "https://")):
            return entry.rstrip("/")
    return "https://proxy.golang.org"


@pytest.fixture(scope="session")
def prometheus_operator_crds() -> list[Path]:
    """The CRDs of ServiceMonitor, PodMonitor and PrometheusRule, from the Go module proxy,
    verified, cached in ~/.cache/cosyvoice-operator (fetched once per machine)."""
    cache = binaries.cache_root() / f"prometheus-operator-crds-{PROMETHEUS_OPERATOR_VERSION}"
    wanted = [cache / f"monitoring.coreos.com_{name}.yaml" for name in PROMETHEUS_OPERATOR_CRDS]
    if all(p.exists() for p in wanted):
        return wanted
    module = "github.com/prometheus-operator/prometheus-operator"
    url = f"{_go_proxy()}/{module}/@v/{PROMETHEUS_OPERATOR_VERSION}.zip"
    with urllib.request.urlopen(url, timeout=120) as r:
        data = r.read()
    digest = hashlib.sha256(data).hexdigest()
    assert digest == PROMETHEUS_OPERATOR_ZIP_SHA256, f"{url}: sha256 {digest}, not the pinned one"
    cache.mkdir(parents=True, exist_ok=True)
    prefix = f"{module}@{PROMETHEUS_OPERATOR_VERSION}/example/prometheus-operator-crd/"
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for path in wanted:
            partial = path.with_suffix(".tmp")
            partial.write_bytes(z.read(prefix + path.name))
            os.replace(partial, path)
    return wanted


def install_crds(cluster: Cluster, crds: list[Path]) -> None:
    for path in [*crds, PEERING_CRDS]:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    cluster.local.wait_established(
        *(f"{name}.monitoring.coreos.com" for name in PROMETHEUS_OPERATOR_CRDS)
    )


def labelled(cluster: Cluster, release: str) -> list[str]:
    """Every object of any listable kind, in any namespace, labelled as the release's."""
    kinds = cluster.kubectl("api-resources", "--verbs=list", "-o", "name").stdout.split()
    kinds = [k for k in kinds if k not in ("events", "events.events.k8s.io")]
    out = cluster.kubectl(
        "get", ",".join(kinds), "-A", "-l", f"app.kubernetes.io/instance={release}",
        "-o", "name", timeout=180,
    ).stdout  # fmt: skip
    return sorted(line for line in out.splitlines() if line.strip())


@pytest.mark.cluster
def test_monitoring_objects_are_accepted_upgraded_and_removed(
    cluster: Cluster, helm: Path, prometheus_operator_crds: list[Path]
) -> None:
    install_crds(cluster, prometheus_operator_crds)
    release = f"obs-{uuid.uuid4().hex[:5]}"
    ns = cluster.namespace("obs-chart")
    full = f"{release}-cosyvoice-operator"
    values = [ALL_MONITORING, 'peering={"enabled":true,"installCRDs":true}', "replicaCount=2"]
    sets = [a for v in values for a in ("--set-json", v)]
    env = cluster.env
    run_helm(helm, "install", release, str(CHART), "-n", ns, *sets, "--wait=false", env=env)
    try:
        # The API server accepted every object as the chart rendered it.
        rendered = render_chart(helm, *values, release=release, namespace=ns)
        for doc in rendered:
            kind, name = doc["kind"], doc["metadata"]["name"]
            where = (
                ["-n", doc["metadata"].get("namespace", ns)] if kind not in CLUSTER_KINDS else []
            )
            got = get_json(cluster, f"{kind.lower()}.{group_of(doc)}", name, *where)
            if "spec" in doc and kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
                assert got["spec"] == doc["spec"], f"{kind} {name} stored otherwise"
        assert get_json(cluster, "clusterkopfpeering", full)["metadata"]["name"] == full
        rule = get_json(cluster, "prometheusrule", full, "-n", ns)
        first = rule["spec"]["groups"][0]["rules"][0]
        assert first["alert"] == "CosyVoiceQueueLatencyOverTarget" and first["for"] == "10m"
        assert exists(cluster, "podmonitor", f"{full}-triton", "-n", ns)

        # An upgrade with changed values: the rule follows, the PodMonitor goes.
        changed = (
            'monitoring={"serviceMonitor":{"enabled":true},"podMonitor":{"enabled":false},'
            '"prometheusRule":{"enabled":true,"alerts":{"queueLatencyOverTarget":{"for":"20m"}}},'
            '"dashboard":{"enabled":true,"labels":{"grafana_dashboard":"tts"}}}'
        )
        sets = [a for v in (*values[1:], changed) for a in ("--set-json", v)]
        run_helm(helm, "upgrade", release, str(CHART), "-n", ns, *sets, env=env)
        rule = get_json(cluster, "prometheusrule", full, "-n", ns)
        assert rule["spec"]["groups"][0]["rules"][0]["for"] == "20m"
        assert not exists(cluster, "podmonitor", f"{full}-triton", "-n", ns)
        cm = get_json(cluster, "configmap", f"{full}-dashboard", "-n", ns)
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "tts"
        assert len(labelled(cluster, release)) > 5
    finally:
        run_helm(helm, "uninstall", release, "-n", ns, "--wait", env=env)
    left = labelled(cluster, release)
    assert left == [], f"left behind by helm uninstall: {left}"
    releases = cluster.kubectl(
        "get", "secrets", "-n", ns, "-l", f"owner=helm,name={release}", "-o", "name"
    ).stdout
    assert not releases.strip(), f"Helm's release records left: {releases}"
    # Only CRDs stay: the operator's, kopf's (the subchart's crds/) and the monitoring ones.
    for crd in (
        "cosyvoiceservices.tts.cosyvoice.dev",
        "kopfpeerings.kopf.dev",
        "clusterkopfpeerings.kopf.dev",
        "prometheusrules.monitoring.coreos.com",
    ):
        assert exists(cluster, "crd", crd)
    cluster.kubectl("delete", "namespace", ns, "--wait=false")


CLUSTER_KINDS = {
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterKopfPeering",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def group_of(doc: dict[str, Any]) -> str:
    api = str(doc["apiVersion"])
    return api.split("/")[0] if "/" in api else ""


def exists(cluster: Cluster, *what: str) -> bool:
    return cluster.kubectl("get", *what, "-o", "name", check=False).returncode == 0


# ---- the closed run: real Prometheus, real operator, real Tritons --------------------------

# Windows shrunk so that a run of a few minutes fills them (rate windows, alert durations).
FAST_RULES = (
    'monitoring={"serviceMonitor":{"enabled":true},"podMonitor":{"enabled":true},'
    '"dashboard":{"enabled":true},"prometheusRule":{"enabled":true,"rateWindow":"20s","alerts":{'
    + ",".join(
        f'"{a}":{{"for":"5s"}}'
        for a in (
            "queueLatencyOverTarget",
            "requestFailures",
            "engineBuildGaveUp",
            "replicasAtMax",
            "metricsUnavailable",
            "operatorDown",
            "scalingConflict",
            "reconcileErrors",
        )
    )
    + "}}}"
)
RATE_INTERVAL = "20s"
SECRET_TOKEN = "hf_obs_" + uuid.uuid4().hex  # a credentials Secret's value; never in a log
URL_PASSWORD = "pw-" + uuid.uuid4().hex[:12]  # in the Prometheus URL given to the operator
# Dashboard expressions that cannot have data on this machine, and why. Each must still be
# accepted by Prometheus (no error).
NO_DATA_HERE = {
    "nv_gpu_utilization": "no GPU: a CPU tritonserver exports no nv_gpu_* series",
    "nv_gpu_memory_used_bytes": "no GPU: a CPU tritonserver exports no nv_gpu_* series",
    "nv_inference_first_response_histogram_ms_bucket": (
        "Triton 2.51 exports no first-response histogram for Python-backend decoupled models "
        "(docs/testenv.md)"
    ),
}
# Alert conditions that are (rightly) false in this run: their inner series are evaluated.
TRITON = 'job="cosyvoice-triton", model=~"cosyvoice2|cosyvoice3"'
INNER = {
    "CosyVoiceRequestFailures": [
        f"sum by (namespace, service) (rate(nv_inference_request_failure{{{TRITON}}}[20s]))",
        f"sum by (namespace, service) (rate(nv_inference_request_success{{{TRITON}}}[20s]))",
    ],
    "CosyVoiceReconcileErrors": ["sum(rate(cosyvoice_reconciles_total[20s]))"],
}


class RunPrometheus(Prometheus):
    """The harness's Prometheus with the scrape configs the Prometheus Operator would generate
    from the chart's ServiceMonitor and PodMonitor, and the chart's rules."""

    def __init__(self, work: Path, targets: Path, jobs: list[dict[str, Any]], rules: Path):
        super().__init__(work, targets, scrape_interval=1.0)
        self.jobs = jobs
        self.rules = rules

    def reload(self, jobs: list[dict[str, Any]]) -> None:
        assert self.process is not None
        self.jobs = jobs
        self._write_config()
        self.process.send_signal(signal.SIGHUP)

    def _write_config(self) -> None:
        cfg = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(self.rules)],
            "scrape_configs": self.jobs,
        }
        self.config.write_text(json.dumps(cfg, indent=1))


def service_monitor_job(
    monitor: dict[str, Any], svc: dict[str, Any], address: str, pod: str
) -> dict[str, Any]:
    [endpoint] = monitor["spec"]["endpoints"]
    ns = svc["metadata"]["namespace"]
    return {
        "job_name": f"serviceMonitor/{ns}/{monitor['metadata']['name']}/0",
        "honor_labels": endpoint.get("honorLabels", False),
        "metrics_path": endpoint["path"],
        "static_configs": [
            {
                "targets": [address],
                "labels": {
                    "namespace": ns,
                    "service": svc["metadata"]["name"],
                    "pod": pod,
                    "container": "operator",
                    "endpoint": endpoint["port"],
                    # job: the Service's name (no jobLabel set)
                    "job": svc["metadata"]["name"],
                },
            }
        ],
    }


def _relabel(rule: dict[str, Any]) -> dict[str, Any]:
    names = {
        "sourceLabels": "source_labels",
        "targetLabel": "target_label",
        "separator": "separator",
        "regex": "regex",
        "replacement": "replacement",
        "action": "action",
    }
    return {names[k]: v for k, v in rule.items()}


def pod_monitor_job(
    monitor: dict[str, Any], targets: Path, pod_labels: dict[str, str], container: str
) -> dict[str, Any]:
    """The harness lists each Triton as {namespace, pod}; the real pod's labels and port name
    become the __meta_kubernetes_* labels Kubernetes discovery would give it."""
    # Triton's metrics endpoint (the harness runs Triton alone, without cosyvoice-serve's
    # health port, the chart's second endpoint)
    [endpoint] = [e for e in monitor["spec"]["podMetricsEndpoints"] if e["port"] == "metrics"]
    meta = [
        {"source_labels": ["namespace"], "target_label": "__meta_kubernetes_namespace"},
        {"source_labels": ["pod"], "target_label": "__meta_kubernetes_pod_name"},
        {"target_label": "__meta_kubernetes_pod_container_name", "replacement": container},
        {"target_label": "__meta_kubernetes_pod_container_port_name", "replacement": "metrics"},
    ] + [
        {"target_label": f"__meta_kubernetes_pod_label_{sanitize(k)}", "replacement": v}
        for k, v in sorted(pod_labels.items())
    ]
    keep = [
        {
            "action": "keep",
            "source_labels": [f"__meta_kubernetes_pod_label_{sanitize(k)}"],
            "regex": re.escape(v),
        }
        for k, v in sorted(monitor["spec"]["selector"]["matchLabels"].items())
    ] + [
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": endpoint["port"],
        }
    ]
    standard = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {
            "source_labels": [
                f"__meta_kubernetes_pod_label_{sanitize(monitor['spec']['jobLabel'])}"
            ],
            "target_label": "job",
        },
        {"target_label": "endpoint", "replacement": endpoint["port"]},
    ]
    return {
        "job_name": "podMonitor/{namespace}/{name}/0".format(**monitor["metadata"]),
        "metrics_path": endpoint["path"],
        "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
        "relabel_configs": meta + keep + standard + [_relabel(r) for r in endpoint["relabelings"]],
    }


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """An instant query; an error answer raises with Prometheus' words."""
    target = f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(target, timeout=10) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as err:
        raise AssertionError(f"Prometheus refused {promql}: {err.read()[:500]!r}") from None
    assert body["status"] == "success", body
    found: list[dict[str, Any]] = body["data"]["result"]
    return found


def query_range(url: str, promql: str, start: float, end: float, step: float) -> Any:
    target = f"{url}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": promql, "start": start, "end": end, "step": step}
    )
    with urllib.request.urlopen(target, timeout=20) as r:
        return json.loads(r.read())["data"]["result"]


def status(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = get_json(cluster, "cvs", name, "-n", ns).get("status", {})
    return found


@pytest.fixture
def run_ns(cluster: Cluster) -> Iterator[str]:
    name = cluster.namespace("obs")
    yield name
    cluster.kubectl("delete", "cvs", "--all", "-n", name, "--timeout=60s", check=False)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.mark.cluster
@pytest.mark.timeout(480)
def test_every_expression_returns_data_from_a_real_run(
    cluster: Cluster, helm: Path, run_ns: str, tmp_path: Path
) -> None:
    ns = run_ns
    release = f"obs-{uuid.uuid4().hex[:5]}"
    full = f"{release}-cosyvoice-operator"
    docs = render_chart(helm, FAST_RULES, release=release, namespace=ns)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(docs)))

    # The chart (serving this namespace, with peering): its own peering CRDs and KopfPeering.
    # Its Deployment's pod is kwok's (no process); the operator runs here, as that pod would.
    sets = [
        *("--set-json", f"watchNamespaces={json.dumps([ns])}"),
        *("--set-json", 'peering={"enabled":true,"installCRDs":true}'),
        *("--set-json", 'imagePolicy={"enabled":false}'),
    ]
    run_helm(helm, "install", release, str(CHART), "-n", ns, *sets, env=cluster.env)
    wait_for("the chart's KopfPeering", lambda: exists(cluster, "kopfpeering", full, "-n", ns))
    cluster.apply(ns, cache_claim())
    cluster.kubectl(
        "create", "secret", "generic", "hf", "-n", ns, f"--from-literal=HF_TOKEN={SECRET_TOKEN}"
    )
    autoscaling = {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 2,
        "targetQueueLatencyMilliseconds": 20,
        "evaluationIntervalSeconds": 5,
        "scaleUp": {"stabilizationWindowSeconds": 0, "maxStepReplicas": 2},
        "scaleDown": {"stabilizationWindowSeconds": 600, "maxStepReplicas": 1},
    }
    tts = json.loads(
        service(
            "tts", replicas=1, serving={"nodeSelector": L20}, autoscaling=autoscaling,
            routing={"mode": "Service"},
            model={"variant": "cosyvoice3", "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
                   "credentialsSecret": "hf"},
        )
    )  # fmt: skip
    nodata = json.loads(
        service(
            "nodata",
            replicas=1,
            serving={"nodeSelector": L20},
            autoscaling=autoscaling,
            routing={"mode": "Service"},
        )
    )
    broken = service("broken", uri="hf://simulated/build-failure", serving={"nodeSelector": L20})

    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    metrics_port = free_port()
    servers = PodServers(
        parse(tts["spec"]),
        tmp_path / "pods",
        targets,
        namespace=ns,
        pods=ready_pods(cluster, ns, "tts.cosyvoice.dev/service=tts"),
        service_seconds=0.3,
        max_instances=2,
    )
    load = LoadGenerator(servers.grpc_urls, "cosyvoice3")
    prom_dir = tmp_path / "prom"
    prom_dir.mkdir()
    # Scraping the operator from the start; the Tritons' job joins once a pod exists (its
    # labels are the real pod's), by a configuration reload.
    operator_job = service_monitor_job(
        one(docs, "ServiceMonitor"), one(docs, "Service", "operator-metrics"),
        f"127.0.0.1:{metrics_port}", "operator-obs",
    )  # fmt: skip
    prometheus = RunPrometheus(prom_dir, targets, [operator_job], tmp_path / "rules.yaml")
    url = prometheus.url
    # With a password in it, which must never reach a log line.
    prom_url = f"http://obs:{URL_PASSWORD}@127.0.0.1:{prometheus.port}"
    op = OperatorProcess(
        cluster, ns, tmp_path,
        "--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1",
        "--peering", full, "--log-format", "json",
        COSYVOICE_PROMETHEUS_URL=prom_url,
        COSYVOICE_METRICS_WINDOW_SECONDS="10",
        COSYVOICE_BUILD_MAX_ATTEMPTS="1",
        POD_ID="operator-obs",
    ).start()  # fmt: skip
    started = time.time()
    try:
        prometheus.start()
        # The operator's counters are scraped at 0 before anything happens (a build ends a few
        # seconds after it starts here: its increase must be seen).
        wait_for(
            "the operator scraped",
            lambda: query(url, f'up{{job="{full}-metrics", namespace="{ns}"}} == 1'),
            timeout=60,
        )
        servers.start()
        for body in (json.dumps(tts), json.dumps(nodata), broken):
            cluster.apply(ns, body)
        wait_for(
            "a Ready tts pod",
            lambda: ready_pods(cluster, ns, "tts.cosyvoice.dev/service=tts")(),
            timeout=120,
        )
        pod = get_json(cluster, "pods", "-n", ns, "-l", "tts.cosyvoice.dev/service=tts")["items"][0]
        labels = dict(pod["metadata"]["labels"])
        container = pod["spec"]["containers"][0]["name"]
        prometheus.reload(
            [operator_job, pod_monitor_job(one(docs, "PodMonitor"), targets, labels, container)]
        )

        # An HPA on nodata's Deployment: a conflict the operator reports.
        deployment = wait_for(
            "nodata's Deployment",
            lambda: get_json(
                cluster, "deployments", "-n", ns, "-l", "tts.cosyvoice.dev/service=nodata"
            )["items"],
            timeout=60,
        )[0]["metadata"]["name"]
        cluster.kubectl(
            "autoscale", "deployment", deployment, "-n", ns, "--min=1", "--max=3",
            "--cpu-percent=50", "--name=rival",
        )  # fmt: skip
        wait_for("a Triton serving", lambda: len(servers.live()) >= 1, timeout=120)
        load.set_concurrency(10)
        wait_for(
            "tts at maxReplicas",
            lambda: (
                (status(cluster, ns, "tts").get("autoscaling") or {}).get("desiredReplicas") == 2
            ),
            timeout=90,
        )
        wait_for("two Tritons serving", lambda: len(servers.live()) == 2, timeout=120)

        def firing() -> set[str]:
            return {r["metric"]["alertname"] for r in query(url, 'ALERTS{alertstate="firing"}')}

        expected = {
            "CosyVoiceEngineBuildGaveUp",
            "CosyVoiceAutoscalerMetricsUnavailable",
            "CosyVoiceScalingConflict",
            "CosyVoiceQueueLatencyOverTarget",
            "CosyVoiceReplicasPinnedAtMax",
        }

        def all_expected() -> set[str] | None:
            now = firing()
            return now if expected <= now else None

        got = wait_for("the alerts of this run", all_expected, 120)
        assert not got & {"CosyVoiceOperatorDown", "CosyVoiceRequestFailures"}, got

        # The operator is the active peer through the chart's peering CRDs and KopfPeering.
        assert query(url, f'cosyvoice_operator_active{{job="{full}-metrics"}} == 1')

        # Triton's series carry the labels the PodMonitor gives them.
        triton = query(
            url, f'nv_inference_request_success{{job="cosyvoice-triton", namespace="{ns}"}}'
        )
        assert triton and {r["metric"].get("service") for r in triton} == {"tts"}
        assert {r["metric"].get("gpu_arch") for r in triton} == {"sm_89"}

        # Every expression of the rules: data, or (for conditions rightly false here) data in
        # its inner series.
        for name, rule in alerts(docs).items():
            answer = query(url, rule["expr"])
            if name in expected:
                assert answer, f"{name}: {rule['expr']} is empty"
            elif name in INNER:
                assert not answer, f"{name} holds in a healthy run: {answer}"
                for inner in INNER[name]:
                    assert query(url, inner), f"{name}: {inner} is empty"
            elif name == "CosyVoiceTritonRestarted":
                # cosyvoice-serve's counter (its health port): this run serves Triton without
                # the entrypoint, so no series; promtool's rule tests cover the alert
                # (tests/monitoring/alerts.test.yaml).
                assert not answer, (name, answer)
            else:
                assert name == "CosyVoiceOperatorDown" and not answer, (name, answer)
                assert query(url, f'up{{job="{full}-metrics", namespace="{ns}"}} == 1')

        # Every expression of the dashboard.
        dashboard = dashboard_of(docs)
        answers: dict[str, list[dict[str, Any]]] = {}
        for title, expr in dashboard_queries(dashboard):
            promql = grafana_to_promql(expr, RATE_INTERVAL)
            answers[promql] = query(url, promql)
            missing = [m for m in NO_DATA_HERE if m in promql]
            if missing:
                print(f"no data here for {title}: {NO_DATA_HERE[missing[0]]}")
                continue
            assert answers[promql], f"{title}: {promql} is empty"
            values = [float(r["value"][1]) for r in answers[promql]]
            assert any(math.isfinite(v) for v in values), f"{title}: {promql} is {values}"

        if os.environ.get("COSYVOICE_DASHBOARD_PNG"):
            # For the picture: the load falls, then stops (about two minutes).
            for concurrency, seconds in ((10, 40), (3, 40), (0, 30)):
                load.set_concurrency(concurrency)
                time.sleep(seconds)
        draw(dashboard, url, started, tmp_path)
        # The operator down: the alert fires.
        load.set_concurrency(0)
        op.stop()
        wait_for("CosyVoiceOperatorDown", lambda: "CosyVoiceOperatorDown" in firing(), 60)
    finally:
        load.close()
        servers.stop()
        prometheus.stop()
        op.stop()
        run_helm(helm, "uninstall", release, "-n", ns, env=cluster.env, check=False)
    check_logs(op.log(whole=True))


def check_logs(text: str) -> None:
    """JSON lines, one per event a person cares about, and no secret anywhere."""
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "the operator logged nothing"
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON log line: {line[:300]}") from None
    assert all({"message", "severity", "timestamp"} <= r.keys() for r in records)
    assert SECRET_TOKEN not in text, "the credentials Secret's value is in the log"
    assert URL_PASSWORD not in text, "the Prometheus URL's password is in the log"
    messages = [str(r["message"]) for r in records]
    assert any("created Job" in m for m in messages), messages[-20:]
    assert any("EngineBuildFailed" in m or "BuildFailed" in m for m in messages)
    # No line repeats itself over and over (a pass that logs every time it runs).
    worst = max(messages.count(m) for m in set(messages))
    assert worst <= 5, f"a message logged {worst} times"


def draw(dashboard: dict[str, Any], url: str, start: float, tmp_path: Path) -> None:
    """The dashboard's panels over this run, as a PNG (COSYVOICE_DASHBOARD_PNG names where to
    keep it; otherwise it stays in the test's tmp dir)."""
    from bench.dashboard_png import Panel, Series, draw_panels

    end = time.time()
    panels = []
    for p in dashboard["panels"]:
        if p["type"] == "row":
            continue
        series = []
        for t in p["targets"]:
            promql = grafana_to_promql(t["expr"], RATE_INTERVAL)
            for r in query_range(url, promql, start, end, 2.0):
                legend = legend_of(t["legendFormat"], r["metric"])
                series.append(
                    Series(legend, [(float(t0) - start, float(v)) for t0, v in r["values"]])
                )
        panels.append(Panel(p["title"], p["fieldConfig"]["defaults"]["unit"], series))
    out = Path(os.environ.get("COSYVOICE_DASHBOARD_PNG") or tmp_path / "dashboard.png")
    draw_panels(panels, out, title=dashboard["title"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with contextlib.suppress(OSError):
        print(f"dashboard picture: {out} ({out.stat().st_size} bytes)")


def legend_of(template: str, labels: dict[str, str]) -> str:
    """Grafana's legend format ({{label}}) filled in."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: str(labels.get(m.group(1), "")), template)
