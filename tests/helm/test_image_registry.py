"""The chart's `imageRegistry`: one value points every image at one registry, the operator's own
and every image the operator renders (build and cleanup Jobs, serving Deployments), and the
image allowlist must admit it. The operator's objects are rendered by the operator's own code
(`render`'s functions and the cleanup Job's) from the environment the chart gives it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cosyvoice_operator.cli import render_command
from cosyvoice_operator.render import build_job
from cosyvoice_operator.shell import config
from tests.chart_tools import CHART, DEFAULT_PREFIXES, env_of, of_kind, render, run_helm
from tests.conftest import REPO

REGISTRY = "registry.example.com:5000/tts"
ALLOWED = f'imagePolicy={{"allowedPrefixes":["{REGISTRY}/"]}}'
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
KEY = "0" * 40


def images_of(obj: dict[str, Any]) -> list[str]:
    """Every container image of a workload (Deployment, Job) or pod spec."""
    spec = obj["spec"]
    pod = spec["template"]["spec"] if "template" in spec else spec
    return [c["image"] for k in ("initContainers", "containers") for c in pod.get(k, [])]


def every_image(docs: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The images the chart renders, and the ones the operator it configures renders: for each
    example service, its build Jobs and serving Deployments, and the cleanup Job of an engine."""
    found: dict[str, list[str]] = {}
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job", "DaemonSet", "StatefulSet", "Pod", "CronJob"):
            found[f"chart {doc['kind']} {doc['metadata']['name']}"] = images_of(doc)
    cfg = config.load(env_of(docs))
    for example in EXAMPLES:
        body = render_command.load_service(example.read_text(), example.name)
        for obj in render_command.render_service(body, ["NVIDIA-L20", "NVIDIA-H100"], cfg, "t"):
            if obj["kind"] in ("Deployment", "Job"):
                found[f"{example.name} {obj['kind']} {obj['metadata']['name']}"] = images_of(obj)
    cache = build_job.CacheClaim("cosyvoice-engines", render_command.CLAIM_UID_PLACEHOLDER)
    cleanup = build_job.render_cleanup_job(
        KEY, "sm_89", cfg.build.default_builder_image, "t", cache, cfg.build
    )
    found["cleanup Job"] = images_of(cleanup)
    return found


def test_every_image_comes_from_the_registry(helm: Path) -> None:
    docs = render(helm, f'imageRegistry="{REGISTRY}"', ALLOWED)
    found = every_image(docs)
    kinds = {what.split()[1] for what in found}
    assert kinds == {"Deployment", "Job"}, found  # the chart's, the operator's
    assert len([w for w in found if w.startswith("cosyvoice")]) >= 6, found  # both examples
    images = {image for listed in found.values() for image in listed}
    assert images == {
        f"{REGISTRY}/cosyvoice-operator:0.1.0",
        f"{REGISTRY}/engine-builder:0.1.0-trtllm0.20.0",
        f"{REGISTRY}/cosyvoice-triton:0.1.0-trtllm0.20.0",
        f"{REGISTRY}/haproxy:3.2",  # the router's (issue 30)
    }, found
    assert all(listed for listed in found.values()), found
    env = env_of(docs)
    assert env["COSYVOICE_IMAGE_REGISTRY"] == REGISTRY
    assert env["COSYVOICE_ALLOWED_IMAGE_PREFIXES"] == f"{REGISTRY}/"
    # The operator's image policy (the API server's check of what it creates) admits them.
    [policy] = [
        d
        for d in of_kind(docs, "ValidatingAdmissionPolicy")
        if d["metadata"]["name"].endswith("-operator")
    ]
    assert f"{REGISTRY}/" in json.dumps(policy["spec"])


def test_without_it_every_image_is_as_named(helm: Path) -> None:
    found = every_image(render(helm))
    images = {image for listed in found.values() for image in listed}
    assert images == {
        "ghcr.io/cosyvoice-operator/cosyvoice-operator:0.1.0",
        "ghcr.io/cosyvoice-operator/engine-builder:0.1.0-trtllm0.20.0",
        "ghcr.io/cosyvoice-operator/cosyvoice-triton:0.1.0-trtllm0.20.0",
        "docker.io/library/haproxy:3.2",  # the router's (issue 30)
    }
    assert "COSYVOICE_IMAGE_REGISTRY" not in env_of(render(helm))


def test_names_tags_and_digests_are_kept(helm: Path) -> None:
    """What the release pins (scripts/pin_release.py) survives a move to a mirror that copied
    the images as they are: only the registry changes."""
    digest = "sha256:" + "b" * 64
    values = {
        "imageRegistry": "mirror.example/team/",  # a trailing "/" is the same registry
        "image": {"repository": "ghcr.io/someone/cosyvoice-operator", "digest": digest},
        "config": {
            "builderImage": f"ghcr.io/someone/engine-builder:0.2.0-trtllm0.20.0@{digest}",
            "servingImage": "ghcr.io/someone/cosyvoice-triton:0.2.0-trtllm0.20.0",
        },
        "imagePolicy": {"allowedPrefixes": ["mirror.example/"]},
    }
    docs = render(helm, *(f"{k}={json.dumps(v)}" for k, v in values.items()))
    images = {image for listed in every_image(docs).values() for image in listed}
    assert images == {
        f"mirror.example/team/cosyvoice-operator@{digest}",
        f"mirror.example/team/engine-builder:0.2.0-trtllm0.20.0@{digest}",
        "mirror.example/team/cosyvoice-triton:0.2.0-trtllm0.20.0",
        "mirror.example/team/haproxy:3.2",
    }


def test_a_registry_the_allowlist_does_not_admit_fails_the_render(helm: Path) -> None:
    proc = run_helm(
        helm, "template", "cvo", str(CHART), "--set", f"imageRegistry={REGISTRY}", check=False
    )
    assert proc.returncode != 0, proc.stdout[:2000]
    assert f'imageRegistry "{REGISTRY}": the images would be pulled from' in proc.stderr
    assert "starts with none of imagePolicy.allowedPrefixes" in proc.stderr
    # The message gives the list that would admit it.
    assert json.dumps([*DEFAULT_PREFIXES, f"{REGISTRY}/"], separators=(",", ":")) in proc.stderr
    # A prefix that admits only some of the images is not enough either.
    narrow = f'imagePolicy={{"allowedPrefixes":["{REGISTRY}/engine-builder:"]}}'
    proc = run_helm(
        helm,
        "template",
        "cvo",
        str(CHART),
        "--set",
        f"imageRegistry={REGISTRY}",
        "--set-json",
        narrow,
        check=False,
    )
    assert proc.returncode != 0 and "starts with none of" in proc.stderr
    # Without the image policy there is no list to check against.
    docs = render(helm, f'imageRegistry="{REGISTRY}"', 'imagePolicy={"enabled":false}')
    [deployment] = of_kind(docs, "Deployment")
    assert images_of(deployment) == [f"{REGISTRY}/cosyvoice-operator:0.1.0"]


@pytest.mark.parametrize(
    "registry",
    ["https://registry.example", "Registry.example/x", "registry.example/x:1", "r.example/a b"],
)
def test_a_malformed_registry_is_refused_by_the_schema(helm: Path, registry: str) -> None:
    value = f"imageRegistry={json.dumps(registry)}"
    proc = run_helm(helm, "template", "cvo", str(CHART), "--set-json", value, check=False)
    assert proc.returncode != 0, proc.stdout[:2000]
    assert "imageRegistry" in proc.stderr, proc.stderr
    # The operator refuses the same values on its own.
    with pytest.raises(config.ConfigError, match="COSYVOICE_IMAGE_REGISTRY"):
        config.load({"COSYVOICE_IMAGE_REGISTRY": registry})


def test_the_operator_refuses_a_registry_outside_its_allowlist() -> None:
    env = {"COSYVOICE_IMAGE_REGISTRY": REGISTRY}
    assert config.load(env).serving.default_image == (
        f"{REGISTRY}/cosyvoice-triton:0.1.0-trtllm0.20.0"
    )
    with pytest.raises(config.ConfigError, match="is not under COSYVOICE_ALLOWED_IMAGE_PREFIXES"):
        config.load({**env, "COSYVOICE_ALLOWED_IMAGE_PREFIXES": "ghcr.io/cosyvoice-operator/"})
