"""`cosyvoice-operator render`: every object for a service, no cluster; clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cosyvoice_operator.cli.main import main

REPO = Path(__file__).resolve().parents[3]
COMPONENT = "app.kubernetes.io/component"


def test_renders_build_jobs_and_workloads_of_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", str(REPO / "examples/cosyvoice3.yaml"), "-n", "tts"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in docs]
    triton = [d for d in docs if d["metadata"]["labels"].get(COMPONENT) != "router"]
    triton_kinds = [d["kind"] for d in triton]
    assert triton_kinds.count("Job") == triton_kinds.count("Deployment") >= 1
    assert triton_kinds.count("Deployment") == triton_kinds.count("ConfigMap")
    # Issue 30: the router in front (spec.routing.mode Router by default): its config, its
    # Deployment, its PDB and NetworkPolicy; cvs-<name> selects it, cvs-<name>-pods the pods.
    routers = {(d["kind"], d["metadata"]["name"]) for d in docs if d not in triton}
    assert routers == {
        (kind, "cvs-cosyvoice3-router")
        for kind in ("ConfigMap", "Deployment", "PodDisruptionBudget", "NetworkPolicy")
    }
    services = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Service"}
    assert services["cvs-cosyvoice3"]["selector"][COMPONENT] == "router"
    assert services["cvs-cosyvoice3-pods"]["clusterIP"] == "None"
    # Issue 21: the NetworkPolicies (on by default) come last.
    assert kinds[-2:] == ["NetworkPolicy", "NetworkPolicy"]
    assert {d["metadata"]["namespace"] for d in docs} == {"tts"}
    for dep in (d for d in triton if d["kind"] == "Deployment"):
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


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"engine": {"precison": "bfloat16"}}, "spec.engine.precison"),
        (
            {"autoscaling": {"enabled": True, "scaleUp": {"stepz": 2}}},
            "spec.autoscaling.scaleUp.stepz",
        ),
        # Tolerations and affinity are typed since issue 21 (no free-form subtree left).
        (
            {"serving": {"tolerations": [{"key": "a", "operater": "Exists"}]}},
            "spec.serving.tolerations[0].operater",
        ),
        (
            {"serving": {"affinity": {"nodeAfinity": {}}}},
            "spec.serving.affinity.nodeAfinity",
        ),
        ({"replica": 2}, "spec.replica"),
    ],
)
def test_unknown_fields_are_refused_as_the_api_server_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], patch: dict[str, object], path: str
) -> None:
    body = yaml.safe_load((REPO / "examples/cosyvoice2.yaml").read_text())
    for key, value in patch.items():
        current = body["spec"].setdefault(key, {})
        if isinstance(value, dict) and isinstance(current, dict):
            current.update(value)
        else:
            body["spec"][key] = value
    manifest = tmp_path / "svc.yaml"
    manifest.write_text(yaml.safe_dump(body))
    code = main(["render", "-f", str(manifest), "--gpu-product", "NVIDIA-L20"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == f'error: {manifest}: unknown field "{path}" (kubectl explain cvs.spec)\n'


def test_a_mistyped_time_zone_fails_render(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the CRD cannot check (an IANA zone) is checked by spec.parse, so render refuses
    it before the operator would (as InvalidSpec on the service)."""
    body = yaml.safe_load((REPO / "examples/cosyvoice3.yaml").read_text())
    body["spec"]["autoscaling"]["schedules"][0]["timezone"] = "Asia/Shanghi"
    manifest = tmp_path / "svc.yaml"
    manifest.write_text(yaml.safe_dump(body))
    assert main(["render", "-f", str(manifest), "--gpu-product", "NVIDIA-L20"]) == 2
    err = capsys.readouterr().err
    assert "spec.autoscaling.schedules[0].timezone: unknown IANA time zone 'Asia/Shanghi'" in err
    assert err.count("\n") == 1


def test_every_example_passes_the_strict_check(capsys: pytest.CaptureFixture[str]) -> None:
    for example in sorted((REPO / "examples").glob("*.yaml")):
        assert main(["render", "-f", str(example), "--gpu-product", "NVIDIA-L20"]) == 0, example
        assert capsys.readouterr().err == ""


def test_a_missing_file_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", "/no/such/file.yaml"]) == 2
    assert "/no/such/file.yaml" in capsys.readouterr().err
