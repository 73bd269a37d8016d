"""The README's minimal CosyVoiceService is one the operator takes: `render` checks it against
the CRD (defaults applied) and renders its build Job and its serving objects."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cosyvoice_operator.cli.main import main
from tests.conftest import REPO


def readme_service() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## A minimal service", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```yaml\n(.*?)```", section, re.S)
    return str(block)


def test_the_readmes_minimal_service_renders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = readme_service()
    assert yaml.safe_load(text)["kind"] == "CosyVoiceService"
    path = tmp_path / "service.yaml"
    path.write_text(text)
    assert main(["render", "-f", str(path), "--gpu-product", "NVIDIA-L20"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in docs]
    # one Triton Deployment and the router's (issue 30: spec.routing.mode Router by default)
    assert kinds.count("Job") == 1 and kinds.count("Deployment") == 2
    [deployment] = (
        d
        for d in docs
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "serving"
    )
    assert deployment["spec"]["replicas"] == 2
    [job] = (d for d in docs if d["kind"] == "Job")
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in job["spec"]["template"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert "cosyvoice-engines" in claims  # the claim the README's install step creates
