"""`make images` / `make push` (scripts/images.sh): which builder it picks, the exact commands it
gives it, and what it says when there is none. The real builders cannot run here (no Docker
daemon, and the GPU images' nvcr.io base cannot be pulled), so the builder on PATH is a
stand-in that records its arguments: what is tested is our script, not docker."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from cosyvoice_operator.render.build_job import BuildSettings
from cosyvoice_operator.render.workloads import ServingSettings
from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "images.sh"
BASH = "/bin/bash"


def stand_in(bin_dir: Path, name: str, log: Path, info_fails: bool = False) -> None:
    """An executable `name` that appends its arguments (one per line, then a blank line) and
    the directory it ran in to `log`; `info` fails when asked (a docker without a daemon)."""
    info = 'if [ "$1" = info ]; then exit 1; fi\n' if info_fails else ""
    script = bin_dir / name
    script.write_text(
        f'#!{BASH}\n{{ printf "%s\\n" "{name}" "cwd=$PWD" "$@"; printf "\\n"; }} >> "{log}"\n{info}'
    )
    script.chmod(0o755)


def run(
    action: str, path: Path, make: bool = False, **env: str
) -> subprocess.CompletedProcess[str]:
    """The script (or the Makefile target) with PATH = `path` alone: no real builder can be
    found, whatever this machine has."""
    full = {"PATH": str(path), "HOME": os.environ.get("HOME", "/tmp"), **env}
    if make:
        target = {"build": "images", "push": "push"}[action]
        cmd = ["/usr/bin/make", "-s", "-C", str(REPO), target]
        cmd += [f"{k}={v}" for k, v in env.items()]
        full["PATH"] = f"{path}:/usr/bin:/bin"  # make's recipe shell; no builder lives there
    else:
        cmd = [BASH, str(SCRIPT), action]
    return subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=60)


def calls(log: Path) -> list[list[str]]:
    """Each recorded invocation: [tool, cwd=..., args...]."""
    if not log.exists():
        return []
    return [block.split("\n") for block in log.read_text().split("\n\n") if block.strip()]


def test_without_a_builder_it_names_what_is_needed(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    for action, target in (("build", "make images"), ("push", "make push")):
        proc = run(action, empty)
        assert proc.returncode == 127, proc.stdout + proc.stderr
        assert f"error: '{target}' needs a container image builder" in proc.stderr
        assert "docker (with a running Docker daemon), podman or buildah" in proc.stderr
        assert "None of docker, podman, buildah is on PATH." in proc.stderr
        assert "nvcr.io" in proc.stderr


def test_a_docker_client_without_a_daemon_is_not_taken_for_a_builder(tmp_path: Path) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    stand_in(bin_dir, "docker", log, info_fails=True)
    proc = run("build", bin_dir)
    assert proc.returncode == 127
    assert f"docker is on PATH ({bin_dir}/docker), but 'docker info' fails" in proc.stderr
    assert [c[2:] for c in calls(log)] == [["info"]]  # asked, and given nothing to build
    # A daemonless builder beside it is used instead.
    stand_in(bin_dir, "podman", log)
    proc = run("build", bin_dir, IMAGES="operator")
    assert proc.returncode == 0, proc.stderr
    assert [c[0] for c in calls(log)] == ["docker", "docker", "podman"]
    proc = run("build", bin_dir, BUILDER="docker")
    assert proc.returncode == 2 and "reaches no Docker daemon" in proc.stderr


def test_make_images_gives_docker_the_exact_builds(tmp_path: Path) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    stand_in(bin_dir, "docker", log)
    stand_in(bin_dir, "podman", log)  # docker comes first when both are usable
    proc = run("build", bin_dir, make=True, REGISTRY="registry.example:5000/tts/", TAG="1.2.3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    builds = [c for c in calls(log) if c[2:] != ["info"]]
    root = f"cwd={REPO}"
    assert builds == [
        ["docker", root, "build", "-f", "Dockerfile", "-t",
         "registry.example:5000/tts/cosyvoice-operator:1.2.3", "."],
        ["docker", root, "build", "-f", "engine-builder/Dockerfile", "-t",
         "registry.example:5000/tts/engine-builder:1.2.3-trtllm0.20.0", "."],
        ["docker", root, "build", "-f", "serving-image/Dockerfile", "-t",
         "registry.example:5000/tts/cosyvoice-triton:1.2.3-trtllm0.20.0", "."],
    ]  # fmt: skip
    for build in builds:
        assert (REPO / build[4]).is_file()
    log.unlink()
    proc = run("push", bin_dir, make=True, REGISTRY="registry.example:5000/tts", TAG="1.2.3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [c[2:] for c in calls(log) if c[2:] != ["info"]] == [
        ["push", "registry.example:5000/tts/cosyvoice-operator:1.2.3"],
        ["push", "registry.example:5000/tts/engine-builder:1.2.3-trtllm0.20.0"],
        ["push", "registry.example:5000/tts/cosyvoice-triton:1.2.3-trtllm0.20.0"],
    ]


@pytest.mark.parametrize("tool", ["podman", "buildah"])
def test_podman_or_buildah_alone(tmp_path: Path, tool: str) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    stand_in(bin_dir, tool, log)
    proc = run("build", bin_dir, IMAGES="engine-builder", PLATFORM="linux/amd64")
    assert proc.returncode == 0, proc.stderr
    image = "ghcr.io/cosyvoice-operator/engine-builder:0.1.0-trtllm0.20.0"
    assert calls(log) == [
        [tool, f"cwd={REPO}", "build", "-f", "engine-builder/Dockerfile", "-t", image,
         "--platform", "linux/amd64", "."],
    ]  # fmt: skip


def test_default_names_are_what_the_chart_and_the_operator_use(tmp_path: Path) -> None:
    """With no REGISTRY and TAG the images are the chart's and the operator's defaults, so
    what `make images REGISTRY=r` builds is what `--set imageRegistry=r` pulls."""
    proc = run("list", tmp_path)
    assert proc.returncode == 0, proc.stderr
    images = {line.split()[0]: line.split()[1] for line in proc.stdout.splitlines()}
    chart = yaml.safe_load((REPO / "charts/cosyvoice-operator/Chart.yaml").read_text())
    values = yaml.safe_load((REPO / "charts/cosyvoice-operator/values.yaml").read_text())
    assert images == {
        "operator": f"{values['image']['repository']}:{chart['appVersion']}",
        "engine-builder": BuildSettings().default_builder_image,
        "serving": ServingSettings().default_image,
    }


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REGISTRY": "Registry.example/x"}, "is not a registry and path"),
        ({"REGISTRY": "registry.example/x:1"}, "is not a registry and path"),
        ({"REGISTRY": "https://registry.example"}, "is not a registry and path"),
        ({"TAG": "1.0/x"}, "is not an image tag"),
        ({"IMAGES": "operator,router"}, 'unknown image "router"'),
        ({"BUILDER": "kaniko"}, "one of docker, podman, buildah"),
    ],
)
def test_bad_settings_are_refused_before_anything_runs(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    stand_in(bin_dir, "docker", log)
    proc = run("build", bin_dir, False, **env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert calls(log) == []
