"""Issue 21 L6: what the images are built from is pinned where it can be known here, and says
so where it cannot (base image digests: no registry of theirs is reachable from here)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from cosyvoice_operator.render.build_job import BuildSettings
from cosyvoice_operator.render.workloads import ServingSettings

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "constraints" / "operator.txt"
OPERATOR = REPO / "Dockerfile"
BUILDER = REPO / "engine-builder" / "Dockerfile"
SERVING = REPO / "serving-image" / "Dockerfile"


def _instructions(path: Path) -> list[str]:
    joined = re.sub(r"\\\n", " ", path.read_text())
    return [s.strip() for s in joined.splitlines() if s.strip() and not s.lstrip().startswith("#")]


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!-]+)", line.strip())
        assert match, f"not an exact pin: {line!r}"
        pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def test_every_runtime_requirement_is_pinned_exactly_within_its_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = _pins()
    for text in project["dependencies"]:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in {CONSTRAINTS.name}"
        assert req.specifier.contains(pins[name], prereleases=True), (req, pins[name])
    # What the requirements' extras bring is pinned too (tritonclient[grpc,http]: grpcio,
    # geventhttpclient; kopf: aiohttp).
    for extra_dependency in ("grpcio", "geventhttpclient", "protobuf", "aiohttp"):
        assert extra_dependency in pins


def test_the_operator_image_installs_through_the_pins() -> None:
    (wheel,) = [i for i in _instructions(OPERATOR) if "pip wheel" in i]
    assert "--constraint constraints/operator.txt" in wheel
    assert "COPY constraints/operator.txt constraints/operator.txt" in _instructions(OPERATOR)


def test_base_images_are_by_digest_or_say_why_not() -> None:
    """No digest is invented: a base by tag carries the comment that no digest could be
    looked up here and where to pin it."""
    for path in (OPERATOR, BUILDER, SERVING):
        text = path.read_text()
        froms = [i.split()[1] for i in _instructions(path) if i.startswith("FROM ")]
        assert froms, path
        by_tag = [f for f in froms if "@sha256:" not in f]
        if by_tag:
            flat = re.sub(r"\s*\n#\s*", " ", text)
            assert re.search(r"digest could not be looked up", flat), path
            assert re.search(r"@sha256:", flat), path  # ... and how to pin it
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in _instructions(OPERATOR)


def test_the_serving_images_own_pip_names_are_exact() -> None:
    (install,) = [i for i in _instructions(SERVING) if "pip install --no-cache-dir -c" in i]
    named = re.findall(r'"([A-Za-z0-9_.-]+)([<>=!~]=?[^"]*)?"', install)
    assert {n for n, _ in named} == {"s3tokenizer"}
    assert all(spec.startswith("==") for _, spec in named), named


def test_the_build_commands_name_the_operators_default_images() -> None:
    """H3: the Dockerfiles' `docker build -t` lines and the operator's defaults are one
    registry and the same names (tests/helm/test_chart_hardening.py: the chart's allowlist)."""
    assert f"-t {BuildSettings().default_builder_image} " in BUILDER.read_text()
    serving = re.sub(r"\\\n#\s*", "", SERVING.read_text())
    assert f"-t {ServingSettings().default_image} ." in serving
    assert "-t ghcr.io/cosyvoice-operator/cosyvoice-operator:0.1.0 ." in OPERATOR.read_text()
