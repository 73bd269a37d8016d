"""The serving image's definition agrees with the builder's and with `serve`'s defaults.

The image cannot be built here (no Docker); what can be checked is that it cannot drift
from the builder image's base (a different TensorRT would make every engine unloadable),
that upstream's code is pinned to one commit everywhere it is named, and that the paths
and entry point the Dockerfile sets up are the ones `serve` expects.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from cosyvoice_engine_builder.serving import options

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVING = REPO_ROOT / "serving-image" / "Dockerfile"
BUILDER = REPO_ROOT / "engine-builder" / "Dockerfile"
README = REPO_ROOT / "serving-image" / "README.md"
PYPROJECT = REPO_ROOT / "pyproject.toml"
SHORT_COMMIT = "ace7c47"
_FROM_RE = re.compile(r"^FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?\s*$", re.I)


def _instructions(path: Path) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", path.read_text())
    return [
        line.strip()
        for line in joined.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _froms(path: Path) -> list[tuple[str, str | None]]:
    froms = []
    for line in _instructions(path):
        match = _FROM_RE.match(line)
        if match:
            froms.append((match.group(1), match.group(2)))
    return froms


def _args(path: Path) -> dict[str, str]:
    args = {}
    for line in _instructions(path):
        match = re.match(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(\S+)$", line)
        if match:
            args[match.group(1)] = match.group(2)
    return args


def test_every_stage_starts_from_the_builders_base_image() -> None:
    builder = _froms(BUILDER)
    base = builder[-1][0]
    # The builder's torchaudio stage too; the image that ships is the base itself.
    assert {image for image, _ in builder} == {base}
    assert builder[-1][1] is None
    # 25.07: the first release with CVE-2025-23310/23311/23319/23320/23334 fixed (NVIDIA's
    # August 2025 Triton bulletin), and still TensorRT-LLM 0.20.0 (the examples' tag).
    assert base == "nvcr.io/nvidia/tritonserver:25.07-trtllm-python-py3"
    serving = _froms(SERVING)
    stages = {name for _, name in serving if name}
    images = {image for image, _ in serving if image not in stages}
    assert images == {base}
    # The image that ships is the base itself, not a stage built on something else.
    assert serving[-1] == (base, None)


def test_upstream_is_pinned_to_one_full_commit_everywhere() -> None:
    commit = _args(SERVING)["COSYVOICE_COMMIT"]
    assert re.fullmatch(r"[0-9a-f]{40}", commit)
    assert commit.startswith(SHORT_COMMIT)
    # Every hash that names a CosyVoice commit is this one; stages re-declare the ARG
    # without a value instead of repeating it.
    dockerfile = SERVING.read_text()
    assert re.findall(r"\b[0-9a-f]{40}\b", dockerfile) == [commit]
    assert "ARG COSYVOICE_COMMIT\n" in dockerfile
    readme = README.read_text()
    assert commit in readme and SHORT_COMMIT in readme
    assert set(re.findall(r"\b[0-9a-f]{40}\b", readme)) <= {commit, _matcha_commit(readme)}


def test_base_release_has_the_august_2025_triton_fixes_and_matches_the_examples() -> None:
    """Issue 21 H1: no base before 25.07; the TensorRT-LLM examples' tag is the base's 0.20.0."""
    for path in (BUILDER, SERVING):
        froms = _froms(path)
        stages = {name for _, name in froms if name}
        images = [image for image, _ in froms if image not in stages]
        assert images, path
        for image in images:
            assert _triton_release(image) >= (25, 7), image
    assert _args(BUILDER)["TRTLLM_GIT_REF"] == "v0.20.0"
    # A moved tag is caught when the commit is given, and always recorded.
    dockerfile = BUILDER.read_text()
    assert 'ARG TRTLLM_GIT_COMMIT=""' in dockerfile
    assert "/opt/tensorrt_llm/examples/COMMIT" in dockerfile
    # The fetchers are installed at exact versions.
    pip = [line for line in _instructions(BUILDER) if "pip install" in line]
    assert pip and all(">=" not in line and "==" in line for line in pip)


def _triton_release(image: str) -> tuple[int, int]:
    """(year, month) of an NGC TensorRT-LLM Triton image, tag or tag pinned by digest; any
    other image fails the test (a base this check cannot read is not let through)."""
    match = re.fullmatch(
        r"nvcr\.io/nvidia/tritonserver:(\d+)\.(\d+)-trtllm-python-py3(@sha256:[0-9a-f]{64})?",
        image,
    )
    assert match, f"{image}: not an nvcr.io tritonserver YY.MM-trtllm-python-py3 image"
    return int(match.group(1)), int(match.group(2))


def test_the_release_check_reads_a_base_pinned_by_digest_and_refuses_others() -> None:
    """The advice in both Dockerfiles is to pin the base by digest: the check still reads it."""
    tag = "nvcr.io/nvidia/tritonserver:25.07-trtllm-python-py3"
    assert _triton_release(tag) == (25, 7)
    assert _triton_release(f"{tag}@sha256:{'0a' * 32}") == (25, 7)
    for other in (
        "nvcr.io/nvidia/tritonserver:25.07-py3",
        "nvcr.io/nvidia/tritonserver@sha256:" + "0a" * 32,
        "ubuntu:24.04",
    ):
        with pytest.raises(AssertionError, match=r"not an nvcr\.io tritonserver"):
            _triton_release(other)


def _matcha_commit(readme: str) -> str:
    """The Matcha-TTS submodule commit the README states (recorded by ace7c47)."""
    match = re.search(r"Matcha-TTS[^\n]*?\b([0-9a-f]{40})\b", readme)
    assert match, "the README names the Matcha-TTS commit"
    return match.group(1)


def test_the_image_puts_things_where_serve_looks_for_them() -> None:
    instructions = _instructions(SERVING)
    entrypoints = [line for line in instructions if line.startswith("ENTRYPOINT")]
    assert len(entrypoints) == 1
    assert json.loads(entrypoints[0].removeprefix("ENTRYPOINT")) == ["cosyvoice-serve"]
    dockerfile = SERVING.read_text()
    # serve's --model-code default is where the upstream stage lays out the models' code
    # (ours and the rest of upstream's: serving-image/model-code.list, checked in
    # tests/serving_models/test_image_model_code.py).
    assert Path("/opt/cosyvoice/models") == options.DEFAULT_MODEL_CODE
    assert "COPY --from=upstream /out/opt/cosyvoice /opt/cosyvoice" in dockerfile
    assert "place-model-code.sh /src/serving-image/model-code.list \\\n" in dockerfile
    assert '"${out}/models"' in dockerfile
    # Only code directories: config.pbtxt files come from the operator.
    assert "config.pbtxt" not in re.sub(r"#.*", "", dockerfile)
    # The writable places serve defaults to are under the pod's /tmp emptyDir.
    assert options.DEFAULT_MODEL_REPOSITORY.parent == Path("/tmp")
    assert options.DEFAULT_MODEL_VIEW.parent == Path("/tmp")
    assert "HOME=/tmp" in dockerfile
    users = [line for line in instructions if line.startswith("USER")]
    assert users == ["USER 1000:1000"]


def test_the_images_console_scripts_are_the_distributions() -> None:
    """The image writes its own console scripts (it does not pip-install the operator's
    distribution): each runs the function pyproject.toml names for the same script."""
    scripts = tomllib.loads(PYPROJECT.read_text())["project"]["scripts"]
    joined = " ".join(_instructions(SERVING))
    for name in ("cosyvoice-serve", "cosyvoice-engine-builder"):
        module, function = scripts[name].split(":")
        written = re.search(
            rf"'from {re.escape(module)} import {function}'\s+'sys\.exit\({function}\(\)\)'"
            rf"\s+>\s+/usr/local/bin/{name}\b",
            joined,
        )
        assert written, name
        assert re.search(rf"chmod 0755 [^;&]*/usr/local/bin/{name}\b", joined), name
