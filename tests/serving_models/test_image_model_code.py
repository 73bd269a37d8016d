"""The serving image ships the project's own model code (issue 19, item 1).

``serving-image/model-code.list`` names, per variant and model, where the image takes the
model's ``1/`` directory from: ours (``serving-models/models``), upstream's at the pinned commit
(only the models :data:`NOT_YET_OURS` lists) or none (the C++ backend's ``tensorrt_llm``);
``serving-image/place-model-code.sh``, which the Dockerfile runs, lays it out. No Docker here:
the script runs on a stand-in of upstream's checkout (every model directory upstream has at
ace7c47, its files marked as upstream's), and ``cosyvoice-serve``'s repository writer assembles
the operator's rendered repositories from what it laid out.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from cosyvoice_engine_builder.request import Variant
from cosyvoice_engine_builder.serving import repository
from cosyvoice_engine_builder.serving.options import ServeOptions
from cosyvoice_operator.api import spec
from cosyvoice_operator.render import triton

from .conftest import PACKAGE_ROOT
from .test_contract import MODELS, NOT_YET_OURS, ours, rendered_services, written

ROOT = PACKAGE_ROOT.parent
LIST = ROOT / "serving-image" / "model-code.list"
SCRIPT = ROOT / "serving-image" / "place-model-code.sh"
DOCKERFILE = ROOT / "serving-image" / "Dockerfile"
UPSTREAM_REPOS = {"cosyvoice2": "model_repo", "cosyvoice3": "model_repo_cosyvoice3"}
# Every file of upstream's runtime/triton_trtllm model directories at ace7c47 (git ls-tree).
UPSTREAM_FILES: dict[str, dict[str, tuple[str, ...]]] = {
    "model_repo": {
        "audio_tokenizer": ("model.py",),
        "cosyvoice2": ("model.py",),
        "cosyvoice2_dit": ("model.py",),
        "speaker_embedding": ("model.py",),
        "tensorrt_llm": (".gitkeep",),
        "token2wav": ("model.py",),
        "token2wav_dit": ("model.py", "token2wav_dit.py"),
    },
    "model_repo_cosyvoice3": {
        "audio_tokenizer": ("model.py",),
        "cosyvoice3": ("model.py",),
        "speaker_embedding": ("model.py",),
        "token2wav": ("model.py",),
        "vocoder": ("model.py",),
    },
}


def listed() -> list[tuple[str, str, str]]:
    entries = []
    for line in LIST.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            variant, model, source = line.split()
            entries.append((variant, model, source))
    return entries


def rendered_models() -> dict[str, dict[str, str]]:
    """variant -> model -> its backend, over every rendered test service."""
    models: dict[str, dict[str, str]] = {}
    for svc in rendered_services():
        for name, text in triton.render_repository(svc, "/engine").items():
            backend = text_format.Parse(text, mc.ModelConfig()).backend
            models.setdefault(svc.model.variant, {})[name] = backend
    return models


def upstream_checkout(root: Path) -> Path:
    for repo, models in UPSTREAM_FILES.items():
        for model, files in models.items():
            code = root / "runtime" / "triton_trtllm" / repo / model / "1"
            code.mkdir(parents=True)
            for name in files:
                (code / name).write_text(f"# upstream {repo}/{model}/{name}\n")
    return root


def place(tmp_path: Path, model_list: Path = LIST) -> subprocess.CompletedProcess[str]:
    upstream = tmp_path / "CosyVoice"
    if not upstream.exists():
        upstream_checkout(upstream)
    out = tmp_path / "out"
    return subprocess.run(
        ["sh", str(SCRIPT), str(model_list), str(upstream), str(PACKAGE_ROOT), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_every_model_a_rendered_repository_needs_has_exactly_one_source() -> None:
    entries = listed()
    keys = [(variant, model) for variant, model, _ in entries]
    assert len(keys) == len(set(keys)), "a model is listed twice"
    source = {(variant, model): s for variant, model, s in entries}
    own = written()
    rendered = rendered_models()
    assert set(rendered) == {v.value for v in Variant}
    for variant, models in rendered.items():
        assert {m for v, m in keys if v == variant} == set(models), variant
        for model, backend in models.items():
            key = (variant, model)
            if backend == "python":
                # ours exactly when serving-models has it, upstream's exactly when not yet ours
                assert (source[key] == "ours") == (key in own), key
                assert (source[key] == "upstream") == (key in NOT_YET_OURS), key
            else:
                assert source[key] == "backend", key
    assert {k for k, s in source.items() if s == "ours"} == own
    assert {k for k, s in source.items() if s == "upstream"} == NOT_YET_OURS


def test_the_script_takes_ours_and_only_the_listed_models_of_upstream(tmp_path: Path) -> None:
    done = place(tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    entries = listed()
    assert (out / "SOURCES").read_text().splitlines() == [f"{v}/{m} {s}" for v, m, s in entries]
    laid_out = {(p.parent.parent.name, p.parent.name) for p in out.glob("*/*/1") if p.is_dir()}
    assert laid_out == {(v, m) for v, m, _ in entries}  # no cosyvoice2_dit, no token2wav_dit
    for variant, model, source in entries:
        files = {p.name: p.read_text() for p in (out / variant / model / "1").iterdir()}
        if source == "ours":
            assert files == {"model.py": (MODELS / model / "model.py").read_text()}
        elif source == "upstream":
            repo = UPSTREAM_REPOS[variant]
            assert files == {"model.py": f"# upstream {repo}/{model}/model.py\n"}
        else:
            assert files == {}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("cosyvoice3 cosyvoice3 ours\ncosyvoice3 cosyvoice3 upstream\n", "listed twice"),
        ("cosyvoice3 tts_frontend upstream\n", "tts_frontend/1/model.py does not exist"),
        ("cosyvoice2 tts_frontend ours\n", "models/tts_frontend/model.py does not exist"),
        ("cosyvoice2 token2wav somewhere\n", "unknown source somewhere"),
        ("cosyvoice4 token2wav ours\n", "unknown variant cosyvoice4"),
    ],
)
def test_the_script_refuses_a_list_it_cannot_honour(tmp_path: Path, bad: str, message: str) -> None:
    model_list = tmp_path / "model-code.list"
    model_list.write_text(f"# a comment\n\n{bad}")
    done = place(tmp_path, model_list)
    assert done.returncode != 0
    assert message in done.stderr


@pytest.mark.parametrize("svc", rendered_services(), ids=["cv2", "cv2-2gpu", "cv3", "cv3-2gpu"])
def test_cosyvoice_serve_assembles_the_rendered_repository_on_our_code(
    tmp_path: Path, svc: spec.ServiceSpec
) -> None:
    """The repository writer, on the image's layout: each rendered model's ``1/`` is the code
    the list names, ours byte for byte where we have it."""
    assert place(tmp_path).returncode == 0
    rendered = triton.render_repository(svc, "/engine")
    config = tmp_path / "config"
    config.mkdir()
    for name, text in rendered.items():
        (config / f"{name}.pbtxt").write_text(text)
    options = ServeOptions(
        engine_dir=tmp_path / "engine",
        key="k",
        variant=Variant(svc.model.variant),
        repository_config=config,
        model_code=tmp_path / "out",
        model_repository=tmp_path / "repository",
        model_view=tmp_path / "view",
        http_port=8000,
        grpc_port=8001,
        metrics_port=8002,
        llm_groups=None,
        llm_base_port=8010,
        kv_cache_fraction=0.4,
        llm_startup_timeout=600.0,
        exit_timeout_seconds=30,
        dry_run=False,
    )
    repository.assemble_repository(options.model_repository, repository.plan_repository(options))
    source = {(v, m): s for v, m, s in listed()}
    served = sorted(p.name for p in options.model_repository.iterdir() if p.is_dir())
    assert served == sorted(rendered)
    for name, text in rendered.items():
        model = options.model_repository / name
        assert (model / "config.pbtxt").read_text() == text
        code = {p.name: p.read_text() for p in (model / "1").iterdir()}
        kind = source[(svc.model.variant, name)]
        if kind == "ours":
            assert code == {"model.py": (MODELS / name / "model.py").read_text()}, name
        elif kind == "upstream":
            assert list(code) == ["model.py"] and code["model.py"].startswith("# upstream"), name
        else:
            assert code == {}, name


def test_the_image_runs_the_script_and_puts_our_package_where_our_models_look() -> None:
    dockerfile = DOCKERFILE.read_text()
    assert "COPY serving-image/model-code.list serving-image/place-model-code.sh" in dockerfile
    assert "COPY serving-models/models /src/serving-models/models" in dockerfile
    assert (
        "sh /src/serving-image/place-model-code.sh /src/serving-image/model-code.list \\\n"
        '        /src/CosyVoice /src/serving-models "${out}/models"'
    ) in dockerfile
    assert (
        "COPY serving-models/cosyvoice_serving_models "
        "/opt/cosyvoice-serving-models/cosyvoice_serving_models"
    ) in dockerfile
    # Our model.py files put COSYVOICE_MODELS_PATH on sys.path; the image sets it.
    for model in ours():
        assert 'os.environ.get("COSYVOICE_MODELS_PATH"' in (MODELS / model / "model.py").read_text()
    (models_path,) = [
        line.split("=", 1)[1].split()[0]
        for line in dockerfile.splitlines()
        if line.strip().startswith("COSYVOICE_MODELS_PATH=")
    ]
    assert models_path.split(":")[0] == "/opt/cosyvoice-serving-models"
    assert "/opt/cosyvoice/src" in models_path.split(":")
    # Only the list decides: no copy of upstream's whole model repositories any more.
    assert 'runtime/triton_trtllm/"${pair%%:*}"' not in dockerfile
