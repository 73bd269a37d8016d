"""The builder image can run the default speaker's tool (issue 19, item 5).

The image cannot be built here (no Docker). What is checked is its definition: every module
the tool imports (``speaker_step._IMPORTS``, and the tool's own imports, followed through the
serving models' package) is copied into the image, installed at an exact version that agrees
with the serving side, or comes with the base; the image build itself imports them; and the
build context the Dockerfile copies from is the repository root everywhere it is documented.
Each provision is also taken out of the Dockerfile's text, one at a time, to show that the
check notices.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from cosyvoice_engine_builder import speaker_step

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILDER = REPO_ROOT / "engine-builder" / "Dockerfile"
SERVING = REPO_ROOT / "serving-image" / "Dockerfile"
TWIN = REPO_ROOT / "serving-models" / "cpu-twin-requirements.txt"
PACKAGE = "cosyvoice_serving_models"
PACKAGE_DIR = REPO_ROOT / "serving-models" / PACKAGE
# In the base image: PyTorch (Triton's compatibility matrix, 25.07 trtllm-python-py3) and
# NumPy with it; both held there by the constraints the Dockerfiles write.
FROM_BASE = {"numpy", "torch"}
# What s3tokenizer 0.3.0 itself imports (read in its __init__, utils and models) ...
S3TOKENIZER_IMPORTS = {"einops", "numpy", "onnx", "torch", "torchaudio", "tqdm"}
# ... and what pip may fetch for it from its metadata when it is installed with its
# dependencies, as the serving image installs it: not NumPy or torch (held at the base's) nor
# torchaudio (no PyPI wheel fits NVIDIA's torch, so the constrained install would fail: the
# image builds its own).
PIP_RESOLVES = S3TOKENIZER_IMPORTS - FROM_BASE - {"torchaudio"}


def _instructions(text: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", text)
    return [s.strip() for s in joined.splitlines() if s.strip() and not s.lstrip().startswith("#")]


def _imports_of(source: str, package_module: str) -> set[str]:
    """Every module ``source`` imports, anywhere in it (the tool imports most lazily)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package_module.rsplit(".", node.level)[0]
                base = f"{parent}.{base}" if base else parent
            if base == PACKAGE:
                found.update(f"{PACKAGE}.{alias.name}" for alias in node.names)
            else:
                found.add(base)
    return found


def tool_imports() -> set[str]:
    """The modules outside the standard library the tool imports, with what it imports from
    its own package followed (``features``, ``speakers``, ``speech_tokenizer``...)."""
    todo = [speaker_step.TOOL_MODULE]
    seen: set[str] = set()
    outside: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = PACKAGE_DIR / (module.removeprefix(f"{PACKAGE}.").replace(".", "/") + ".py")
        for name in _imports_of(path.read_text(), module):
            if name.startswith(f"{PACKAGE}."):
                todo.append(name)
            elif name != "__future__" and name.split(".")[0] not in sys.stdlib_module_names:
                outside.add(name)
    return outside | seen


def _top(names: set[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


def _installs(text: str) -> list[str]:
    """The arguments of each ``pip install`` command of the Dockerfile ``text``."""
    return [
        install
        for line in _instructions(text)
        for install in re.findall(r"pip install ([^;&|]*)", line)
    ]


def _pins(text: str) -> dict[str, str]:
    """Exact requirements the Dockerfile's ``pip install`` commands name (name -> version)."""
    pins: dict[str, str] = {}
    for install in _installs(text):
        pins.update(re.findall(r'"([A-Za-z0-9_.-]+)==([^"]+)"', install))
    return pins


def provided(text: str) -> set[str]:
    """The top-level modules the builder's Dockerfile ``text`` puts in its image."""
    instructions = _instructions(text)
    # The pinned distributions' modules carry their names (s3tokenizer, onnxruntime).
    have = set(FROM_BASE) | set(_pins(text))
    installs = _installs(text)
    s3tokenizer = [i for i in installs if '"s3tokenizer==' in i]
    if s3tokenizer and all("--no-deps" not in i for i in s3tokenizer):
        have |= PIP_RESOLVES
    if any(re.search(r"/tmp/wheels/torchaudio-\*\.whl", i) for i in installs):
        have.add("torchaudio")
    paths = [i for i in instructions if i.startswith("ENV ") and "PYTHONPATH=" in i]
    python_path = re.findall(r"PYTHONPATH=(\S+)", " ".join(paths))
    for line in instructions:
        copied = re.fullmatch(r"COPY (\S+)/(\w+) (\S+)/(\w+)", line)
        on_path = copied and any(copied.group(3) in p.split(":") for p in python_path)
        if copied and on_path and copied.group(2) == copied.group(4):
            have.add(copied.group(4))
    return have


def missing(text: str) -> set[str]:
    needed = _top(tool_imports()) | _top(set(speaker_step._IMPORTS))
    if "s3tokenizer" in needed:
        needed |= S3TOKENIZER_IMPORTS
    return needed - provided(text)


def test_preflight_checks_what_the_tool_imports() -> None:
    """_IMPORTS names the tool and every library it imports but the base's NumPy and torch;
    a new import in the tool (or the models' code it calls) fails here until it is added."""
    outside = {name for name in tool_imports() if not name.startswith(PACKAGE)}
    assert _top(outside) - FROM_BASE == set(speaker_step._IMPORTS) - {speaker_step.TOOL_MODULE}
    assert speaker_step.TOOL_MODULE in speaker_step._IMPORTS
    assert {f"{PACKAGE}.speech_tokenizer", f"{PACKAGE}.speaker_embedding"} <= tool_imports()
    assert {"torchaudio.functional", "torchaudio.compliance.kaldi"} <= outside
    assert {"s3tokenizer.model_v2", "s3tokenizer.model_v3", "onnxruntime"} <= outside


def test_the_builder_image_provides_every_module_the_tool_imports() -> None:
    assert missing(BUILDER.read_text()) == set()


@pytest.mark.parametrize(
    ("old", "new", "lost"),
    [
        ('"s3tokenizer==0.3.0" ', "", {"s3tokenizer", "onnx", "einops", "tqdm"}),
        (' "onnxruntime==1.31.1"', "", {"onnxruntime"}),
        (
            "pip install --no-cache-dir --no-deps /tmp/wheels/torchaudio-*.whl",
            "true",
            {"torchaudio"},
        ),
        ("COPY serving-models/cosyvoice_serving_models ", "# ", {PACKAGE}),
        (":/opt/cosyvoice-serving-models ", " ", {PACKAGE}),
        ("-c /tmp/base-constraints.txt \\\n", "--no-deps \\\n", {"onnx", "einops", "tqdm"}),
    ],
)
def test_taking_any_of_them_out_is_noticed(old: str, new: str, lost: set[str]) -> None:
    text = BUILDER.read_text()
    assert text.count(old) == 1, old
    assert missing(text.replace(old, new)) == lost


def test_the_versions_are_the_serving_sides() -> None:
    builder, serving = _pins(BUILDER.read_text()), _pins(SERVING.read_text())
    twin = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", TWIN.read_text(), flags=re.MULTILINE))
    # s3tokenizer: the serving image's exact pin (the CPU twin's too).
    assert builder["s3tokenizer"] == serving["s3tokenizer"] == twin["s3tokenizer"]
    # ONNX Runtime: the CPU build the tool runs with in the twin's tests (the serving image
    # has upstream's unpinned onnxruntime-gpu for its GPU sessions).
    assert builder["onnxruntime"] == twin["onnxruntime"]
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.+]*", v) for v in builder.values()), builder
    # torchaudio: the same commit, built by the same instructions, against the same base.
    commit = re.compile(r"^ARG TORCHAUDIO_COMMIT=(\S+)$", re.MULTILINE)
    assert commit.findall(BUILDER.read_text()) == commit.findall(SERVING.read_text())
    assert _stage(BUILDER, "torchaudio") == _stage(SERVING, "torchaudio")
    # The base's TensorRT, TensorRT-LLM, PyTorch and NumPy are held the same way.
    held = re.compile(r"grep -iE '\^\(([^)]*)\)=='")
    assert held.findall(BUILDER.read_text()) == held.findall(SERVING.read_text())
    assert len(held.findall(BUILDER.read_text())) == 1


def _stage(path: Path, name: str) -> list[str]:
    instructions = _instructions(path.read_text())
    start = instructions.index(
        f"FROM nvcr.io/nvidia/tritonserver:25.07-trtllm-python-py3 AS {name}"
    )
    end = next(i for i in range(start + 1, len(instructions)) if instructions[i].startswith("FROM"))
    return instructions[start:end]


def test_the_image_build_imports_them() -> None:
    """The build fails where a module is missing, not a Job's preflight."""
    checks = [i for i in _instructions(BUILDER.read_text()) if f"import {PACKAGE}." in i]
    assert len(checks) == 1
    names: set[str] = set()
    for code in re.findall(r'python3 -c "([^"]*)"', checks[0]):
        names |= _imports_of(code, "__main__")
    for module in tool_imports() | set(speaker_step._IMPORTS) | S3TOKENIZER_IMPORTS:
        assert module in names, module
    assert f"python3 -m {speaker_step.TOOL_MODULE} --help" in checks[0]


def test_the_build_context_is_the_repository_root_everywhere() -> None:
    text = BUILDER.read_text()
    assert "-f engine-builder/Dockerfile \\\n#       -t " in text
    assert re.search(r"-t ghcr\.io/cosyvoice-operator/engine-builder:\S+ \.\n", text)
    assert "Build context: the repository root" in text
    copies = [
        i.split()[1] for i in _instructions(text) if i.startswith("COPY ") and "--from" not in i
    ]
    assert copies == ["engine-builder/cosyvoice_engine_builder", f"serving-models/{PACKAGE}"]
    for source in copies:
        assert (REPO_ROOT / source / "__init__.py").is_file(), source
    # BuildKit's ignore file for this Dockerfile lets exactly those through.
    ignore = (REPO_ROOT / "engine-builder" / "Dockerfile.dockerignore").read_text()
    assert [line[1:] for line in ignore.splitlines() if line.startswith("!")] == copies
    assert not (REPO_ROOT / "engine-builder" / ".dockerignore").exists()
    for doc in ("docs/getting-started/real-cluster.md", "engine-builder/README.md"):
        prose = re.sub(r"\s+", " ", (REPO_ROOT / doc).read_text())
        assert "docker build -f engine-builder/Dockerfile" in prose, doc
        assert "docker build -t ghcr.io/cosyvoice-operator/engine-builder" not in prose, doc
