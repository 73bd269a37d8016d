"""render/front.py: what stands in front of the Triton pods per spec.routing.mode. Golden
files of every router object; each rendered haproxy.cfg passes `haproxy -c`; mode Service
renders today's objects exactly; the selectors keep Triton and router pods apart."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cosyvoice_operator.api import labels
from cosyvoice_operator.api.spec import ServiceSpec
from cosyvoice_operator.render import front, workloads
from cosyvoice_operator.render.workloads import ServingSettings
from tests.unit import golden as golden_files
from tests.unit.objects import service

GOLDEN = Path(__file__).parent / "golden"
SETTINGS = ServingSettings(scraper_namespace_labels=(("kubernetes.io/metadata.name", "mon"),))
REPO = Path(__file__).resolve().parents[3]


def body(name: str = "tts") -> dict[str, Any]:
    return {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {"name": name, "namespace": "ml", "uid": "svc-uid"},
    }


def golden(name: str, obj: Any) -> None:
    text = yaml.safe_dump(json.loads(json.dumps(obj)), sort_keys=False, width=100)
    golden_files.check(GOLDEN / name, text)


def by_name(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def slo_service() -> ServiceSpec:
    return service(
        autoscaling={
            "enabled": True,
            "maxReplicas": 12,
            "slo": {"firstAudioMilliseconds": 5000, "firstChunkMilliseconds": 1107},
        },
        routing={"router": {"replicas": 2}},
    )


def test_the_router_objects_as_rendered() -> None:
    objs = by_name(front.front_objects(body(), slo_service(), "ml", SETTINGS))
    assert sorted(objs) == [
        ("ConfigMap", "cvs-tts-router"),
        ("Deployment", "cvs-tts-router"),
        ("NetworkPolicy", "cvs-tts"),
        ("NetworkPolicy", "cvs-tts-router"),
        ("PodDisruptionBudget", "cvs-tts"),
        ("PodDisruptionBudget", "cvs-tts-router"),
        ("Service", "cvs-tts"),
        ("Service", "cvs-tts-pods"),
    ]
    golden("router-configmap.yaml", objs["ConfigMap", "cvs-tts-router"])
    golden("router-deployment.yaml", objs["Deployment", "cvs-tts-router"])
    golden("router-pdb.yaml", objs["PodDisruptionBudget", "cvs-tts-router"])
    golden("router-networkpolicy.yaml", objs["NetworkPolicy", "cvs-tts-router"])
    golden("router-service.yaml", objs["Service", "cvs-tts"])
    golden("router-pods-service.yaml", objs["Service", "cvs-tts-pods"])
    golden("router-triton-networkpolicy.yaml", objs["NetworkPolicy", "cvs-tts"])
    golden("router-triton-pdb.yaml", objs["PodDisruptionBudget", "cvs-tts"])


def test_mode_service_renders_todays_objects_exactly() -> None:
    svc = service(routing={"mode": "Service"})
    assert front.front_objects(body(), svc, "ml", SETTINGS) == [
        workloads.render_service(body(), "ml"),
        workloads.render_disruption_budget(body(), "ml"),
        workloads.render_network_policy(body(), "ml", SETTINGS),
    ]


def test_mode_gateway_api_adds_a_grpc_route_and_envoys_policy() -> None:
    svc = service(
        routing={
            "mode": "GatewayAPI",
            "gateway": {"parentRefs": [{"name": "edge", "namespace": "gateways"}]},
        }
    )
    enabled = ServingSettings(
        scraper_namespace_labels=SETTINGS.scraper_namespace_labels, gateway_api=True
    )
    objs = front.front_objects(body(), svc, "ml", enabled)
    # without the operator's Gateway API support: mode Service's objects only
    assert front.front_objects(body(), svc, "ml", SETTINGS) == objs[:3]
    assert objs[:3] == front.front_objects(
        body(), service(routing={"mode": "Service"}), "ml", SETTINGS
    )
    route, policy = objs[3:]
    golden("gateway-grpcroute.yaml", route)
    golden("gateway-backendtrafficpolicy.yaml", policy)
    assert route["spec"]["rules"] == [{"backendRefs": [{"name": "cvs-tts", "port": 8001}]}]
    assert policy["spec"]["loadBalancer"] == {"type": "LeastRequest"}
    assert policy["spec"]["timeout"]["http"]["requestTimeout"] == "0s"


def test_selectors_keep_triton_and_router_pods_apart() -> None:
    objs = by_name(front.front_objects(body(), slo_service(), "ml", SETTINGS))
    router_pod = objs["Deployment", "cvs-tts-router"]["spec"]["template"]["metadata"]["labels"]
    triton_pod = {**workloads.common_labels("tts"), labels.ARCH_LABEL: "sm_90"}
    # the router pods carry the service's label (the autoscaler tells them by component)
    assert router_pod[labels.SERVICE_LABEL] == "tts"
    assert router_pod[labels.COMPONENT_LABEL] == labels.ROUTER_COMPONENT

    def selects(selector: dict[str, str], pod: dict[str, str]) -> bool:
        return all(pod.get(k) == v for k, v in selector.items())

    to_router = [
        objs["Service", "cvs-tts"]["spec"]["selector"],
        objs["PodDisruptionBudget", "cvs-tts-router"]["spec"]["selector"]["matchLabels"],
        objs["NetworkPolicy", "cvs-tts-router"]["spec"]["podSelector"]["matchLabels"],
        objs["Deployment", "cvs-tts-router"]["spec"]["selector"]["matchLabels"],
    ]
    to_triton = [
        objs["Service", "cvs-tts-pods"]["spec"]["selector"],
        objs["PodDisruptionBudget", "cvs-tts"]["spec"]["selector"]["matchLabels"],
        objs["NetworkPolicy", "cvs-tts"]["spec"]["podSelector"]["matchLabels"],
    ]
    assert all(selects(s, router_pod) and not selects(s, triton_pod) for s in to_router)
    assert all(selects(s, triton_pod) and not selects(s, router_pod) for s in to_triton)
    # the Triton pods admit the router on the inference ports and the health port it checks
    rules = objs["NetworkPolicy", "cvs-tts"]["spec"]["ingress"]
    from_router = [
        r for r in rules if r["from"] == [{"podSelector": {"matchLabels": to_router[0]}}]
    ]
    assert [[p["port"] for p in r["ports"]] for r in from_router] == [[8000, 8001, 8003]]


def test_the_router_is_a_restricted_pod() -> None:
    objs = by_name(front.front_objects(body(), slo_service(), "ml", SETTINGS))
    pod = objs["Deployment", "cvs-tts-router"]["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # the one writable place: HAProxy's runtime socket
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/var/run/haproxy"]["name"] == "run" and mounts[front.CONFIG_MOUNT]["readOnly"]
    assert pod["automountServiceAccountToken"] is False
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["image"] == "docker.io/library/haproxy:3.2"
    assert c["resources"] == front.DEFAULT_RESOURCES


def test_sizes_come_from_the_slots_the_slo_and_the_autoscaler() -> None:
    svc = slo_service()
    # cosyvoice3: the orchestrator's instances per pod (render/triton.py), split over 2
    slots = front.slots_per_pod(svc)
    assert slots >= 2 and front.slots_per_router(svc) == slots // 2
    config = front.router_config(svc, "tts", "ml", SETTINGS)
    assert config.server_slots == 12  # maxReplicas
    assert config.queue_timeout_ms == 5000 - 1107  # the SLO's wait budget
    set_slots = service(
        autoscaling={"slo": {"slotsPerPod": 7}}, routing={"router": {"replicas": 3}}
    )
    assert front.slots_per_router(set_slots) == 2  # floor(7 / 3)
    assert front.slots_per_router(service(routing={"router": {"replicas": 16}})) == 1  # >= 1
    assert front.queue_timeout_ms(service()) == front.DEFAULT_QUEUE_TIMEOUT_SECONDS * 1000
    assert front.queue_timeout_ms(service(routing={"router": {"queueTimeoutSeconds": 9}})) == 9000
    # without autoscaling: the replicas, never below maxReplicas (a manual scale keeps it)
    assert front.server_slots(service(replicas=2)) == 4
    assert front.server_slots(service(replicas=9)) == 9


def test_a_config_change_rolls_the_router_and_an_image_is_its_own() -> None:
    def deployment(svc: ServiceSpec, settings: ServingSettings = SETTINGS) -> dict[str, Any]:
        return by_name(front.front_objects(body(), svc, "ml", settings))[
            "Deployment", "cvs-tts-router"
        ]

    before = deployment(slo_service())["spec"]["template"]["metadata"]["annotations"]
    longer = service(
        autoscaling={
            "enabled": True,
            "maxReplicas": 13,
            "slo": {"firstAudioMilliseconds": 5000, "firstChunkMilliseconds": 1107},
        }
    )
    after = deployment(longer)["spec"]["template"]["metadata"]["annotations"]
    key = front.CONFIG_HASH_ANNOTATION
    assert before[key] != after[key]
    mine = service(routing={"router": {"image": "registry.example/haproxy:3.2.4"}})
    assert deployment(mine)["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "registry.example/haproxy:3.2.4"
    )
    moved = ServingSettings(router_image="registry.example/mirror/haproxy:3.2")
    assert deployment(service(), moved)["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "registry.example/mirror/haproxy:3.2"
    )
    # no router Deployment while its image is not allowed (the one there is kept)
    kinds = [o["kind"] for o in front.front_objects(body(), service(), "ml", SETTINGS, False)]
    assert kinds.count("Deployment") == 0 and kinds.count("ConfigMap") == 1


@pytest.mark.parametrize("example", ["cosyvoice2.yaml", "cosyvoice3.yaml"])
def test_each_examples_router_config_passes_haproxy_check(example: str, tmp_path: Path) -> None:
    from cosyvoice_operator.api.spec import parse

    doc = yaml.safe_load((REPO / "examples" / example).read_text())
    svc = parse(doc["spec"])
    config = front.render_router_config(doc, svc, "ml", SETTINGS)
    path = tmp_path / "haproxy.cfg"
    path.write_text(config["data"][front.CONFIG_KEY])
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    assert Path(haproxy).exists(), (
        "haproxy is not installed: scripts/setup.sh installs Debian's (apt-get install -y "
        "--no-install-recommends haproxy)"
    )
    done = subprocess.run(
        [haproxy, "-c", "-f", str(path)], capture_output=True, text=True, timeout=30, check=False
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "WARNING" not in out and "ALERT" not in out, out
