"""The release (.github/workflows/release.yml) as far as it can run here: the chart it packages
(scripts/pin_release.py pins the version and every image by digest, and the packaged chart
renders them, to the operator's objects too), and the workflow's own hygiene (actions pinned by
commit, the permissions keyless signing needs). actionlint checks the workflow in `make lint`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import yaml

from cosyvoice_operator.cli import render_command
from cosyvoice_operator.render.workloads import ServingSettings
from cosyvoice_operator.shell import config
from tests.chart_tools import CHART, KUBE_VERSION, env_of, of_kind, run_helm
from tests.conftest import REPO

PIN = REPO / "scripts" / "pin_release.py"
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
D1, D2, D3 = ("sha256:" + c * 64 for c in "123")
OWNER = "ghcr.io/example-org"
OPERATOR = f"{OWNER}/cosyvoice-operator:0.2.0@{D1}"
BUILDER = f"{OWNER}/engine-builder:0.2.0-trtllm0.20.0@{D2}"
SERVING = f"{OWNER}/cosyvoice-triton:0.2.0-trtllm0.20.0@{D3}"


def pin(chart: Path, *extra: str, **images: str) -> subprocess.CompletedProcess[str]:
    args = {"operator": OPERATOR, "builder": BUILDER, "serving": SERVING, **images}
    flags = [a for k, v in args.items() for a in (f"--{k}", v)]
    # The runner's python3, standard library only: -I ignores this venv's site-packages.
    return subprocess.run(
        [sys.executable, "-I", str(PIN), str(chart), *extra, *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_packaged_release_names_every_image_by_digest(helm: Path, tmp_path: Path) -> None:
    chart = tmp_path / "cosyvoice-operator"
    shutil.copytree(CHART, chart)
    before = (chart / "values.yaml").read_text()
    proc = pin(chart, "--version", "v0.2.0")
    assert proc.returncode == 0, proc.stderr
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    assert (meta["version"], meta["appVersion"]) == ("0.2.0", "0.2.0")
    after = (chart / "values.yaml").read_text()
    values = yaml.safe_load(after)
    assert values["image"] == {
        **yaml.safe_load(before)["image"],
        "repository": f"{OWNER}/cosyvoice-operator",
        "digest": D1,
    }
    assert (values["config"]["builderImage"], values["config"]["servingImage"]) == (
        BUILDER,
        SERVING,
    )
    # Four lines changed, every comment kept.
    changed = [a for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]
    assert len(changed) == 4, changed

    run_helm(helm, "package", str(chart), "--destination", str(tmp_path))
    package = tmp_path / "cosyvoice-operator-0.2.0.tgz"
    with tarfile.open(package) as tar:
        assert "cosyvoice-operator/crds/cosyvoiceservices.tts.cosyvoice.dev.yaml" in tar.getnames()
    rendered = run_helm(
        helm,
        "template",
        "cvo",
        str(package),
        "--kube-version",
        KUBE_VERSION,
        "--set-json",
        f'imagePolicy={{"allowedPrefixes":["{OWNER}/","docker.io/library/haproxy:"]}}',
    ).stdout
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(rendered) if d]
    [deployment] = of_kind(docs, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"{OWNER}/cosyvoice-operator@{D1}"
    # And what the operator renders from that chart's settings.
    cfg = config.load(env_of(docs))
    example = REPO / "examples" / "cosyvoice3.yaml"
    body = render_command.load_service(example.read_text(), example.name)
    objects = render_command.render_service(body, ["NVIDIA-H100"], cfg, "t")
    images = {
        c["image"]
        for o in objects
        if o["kind"] in ("Job", "Deployment")
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    # and the router's HAProxy (issue 30), a third-party image the release does not pin
    assert images == {BUILDER, SERVING, ServingSettings().router_image}


def test_a_bad_pin_writes_nothing(tmp_path: Path) -> None:
    chart = tmp_path / "cosyvoice-operator"
    shutil.copytree(CHART, chart)
    untouched = {p: (chart / p).read_text() for p in ("Chart.yaml", "values.yaml")}
    proc = pin(chart, "--version", "0.2.0", builder=f"{OWNER}/engine-builder:0.2.0")
    assert proc.returncode == 2 and "expected NAME[:TAG]@sha256:<64 hex>" in proc.stderr
    proc = pin(chart, "--version", "release-2")
    assert proc.returncode == 2 and "expected a semantic version" in proc.stderr
    assert {p: (chart / p).read_text() for p in untouched} == untouched
    # A chart already pinned is refused rather than pinned twice.
    assert pin(chart, "--version", "0.2.0").returncode == 0
    proc = pin(chart, "--version", "0.2.0")
    assert proc.returncode == 2 and "found 0" in proc.stderr


def test_the_workflow_pins_actions_and_asks_for_what_signing_needs() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    # `on:` is YAML 1.1's boolean true to PyYAML.
    assert workflow[True] == {"push": {"tags": ["v*"]}}
    assert workflow["permissions"] == {"contents": "read"}
    [job] = workflow["jobs"].values()
    assert job["permissions"] == {"contents": "read", "packages": "write", "id-token": "write"}
    uses = [s["uses"] for s in job["steps"] if "uses" in s]
    assert len(uses) >= 8
    for use in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", use), f"{use} is not pinned"
    text = WORKFLOW.read_text()
    for line in text.splitlines():
        if "uses:" in line:
            assert re.search(r"# v\d+\.\d+\.\d+$", line), f"no version comment: {line}"
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    # The names are the ones `make images` gives; every image is signed, then the chart.
    assert "bash scripts/images.sh list" in runs
    assert "scripts/pin_release.py" in runs and "helm push" in runs
    assert runs.count("cosign sign --yes") == 2
    builds = [s["with"] for s in job["steps"] if "build-push-action" in s.get("uses", "")]
    assert [b["file"] for b in builds] == [
        "Dockerfile",
        "engine-builder/Dockerfile",
        "serving-image/Dockerfile",
    ]
    assert [b["platforms"] for b in builds] == [
        "linux/amd64,linux/arm64",
        "linux/amd64",
        "linux/amd64",
    ]
    assert all(b["sbom"] is True and b["push"] is True for b in builds)
