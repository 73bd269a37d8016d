"""`cosyvoice-operator render`: every object for a service, no cluster; clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cosyvoice_operator.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def test_renders_build_jobs_and_workloads_of_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", str(REPO / "examples/cosyvoice3.yaml"), "-n", "tts"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in docs]
    assert kinds.count("Job") == kinds.count("Deployment") == kinds.count("ConfigMap") >= 1
    assert kinds[-2:] == ["Service", "PodDisruptionBudget"]
    assert {d["metadata"]["namespace"] for d in docs} == {"tts"}
    for dep in (d for d in docs if d["kind"] == "Deployment"):
        [c] = dep["spec"]["template"]["spec"]["containers"]
        assert c["args"][:2] == ["--engine-dir", f"/engines/{c['args'][3]}"]


def test_a_gpu_product_narrows_what_is_rendered(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(REPO / "examples/cosyvoice3.yaml")
    assert main(["render", "-f", path, "--gpu-product", "NVIDIA-L20"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [
        d["metadata"]["labels"]["tts.cosyvoice.dev/gpu-arch"] for d in docs if d["kind"] == "Job"
    ] == ["sm_89"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("foo: [", "not valid YAML"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "exactly one CosyVoiceService"),
        (
            "apiVersion: tts.cosyvoice.dev/v1alpha1\nkind: CosyVoiceService\nmetadata: {name: x}\n"
            "spec: {model: {variant: cosyvoice3, uri: 'ftp://x/y'}}\n",
            "spec.model.uri",
        ),
        (
            "apiVersion: tts.cosyvoice.dev/v1alpha1\nkind: CosyVoiceService\nmetadata: {name: x}\n"
            "spec: {model: {variant: cosyvoice3, uri: 'hf://a/b'}}\n",
            "--gpu-product",
        ),
    ],
)
def test_bad_input_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: str
) -> None:
    path = tmp_path / "svc.yaml"
    path.write_text(text)
    assert main(["render", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and len(err.strip().splitlines()) == 1


def test_a_missing_file_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", "/no/such/file.yaml"]) == 2
    assert "/no/such/file.yaml" in capsys.readouterr().err
