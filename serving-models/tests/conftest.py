"""Fixtures of the tests of the project's model code with upstream's library (helpers:
``twins.py``, which also says why this folder has no ``__init__.py``).

One tiny synthetic release, one CosyVoice2 and one CosyVoice3 tritonserver for the whole
run: every test of a variant in tritonserver asks the same rendered repository (a server
costs 10-20 s to start on this machine). Each twin is rendered with a default speaker
(``spec.speakers.default``), whose file the builder's tool makes from a recording; requests
that send reference audio do not use it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from twins import (
    COSYVOICE2_OURS,
    COSYVOICE3_OURS,
    FIRST_CHUNK_TOKENS,
    CosyVoice2Twin,
    CosyVoice3Twin,
    debian_python,
    default_speaker,
    example,
    library_path,
    remap_llm_urls,
    require_library,
    serve,
    set_parameters,
    speaker_file,
)

from cosyvoice_operator.api.spec import ServiceSpec
from cosyvoice_operator.devtools.closedloop import cpu_twin
from cosyvoice_operator.render import triton

SPEAKER_IN_ENGINE = "/engine/speakers/default.npz"
TESTS = Path(__file__).parent


def yaml_entry(text: str, key: str) -> str:
    """One top-level entry of a hyperpyyaml file, with its indented lines."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{key}:"))
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i] and not lines[i][0].isspace()),
        len(lines),
    )
    return "\n".join(lines[start:end]).strip() + "\n"


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny synthetic CosyVoice2 release (cosyvoice_serving_models.tiny_release)."""
    require_library()
    out = tmp_path_factory.mktemp("release") / "model"
    debian_python("-m", "cosyvoice_serving_models.tiny_release", str(out))
    return out


@pytest.fixture(scope="session")
def cosyvoice3_model_dir(tmp_path_factory: pytest.TempPathFactory, release: Path) -> Path:
    """A CosyVoice3 model directory: a ``cosyvoice3.yaml`` of upstream's layout whose flow and
    vocoder are the narrowest fakes of the two networks no PyPI package holds
    (``cv3_fakes``), with the tiny release's ``feat_extractor`` at CosyVoice3's ``fmax: null``,
    and their ``flow.pt`` and
    ``hift.pt``; the tiny release's tokenizer and ``campplus.onnx``; a tiny
    ``speech_tokenizer_v3.onnx`` (``tiny_onnx``)."""
    model_dir = tmp_path_factory.mktemp("cosyvoice3") / "model"
    (model_dir / "llm").mkdir(parents=True)
    feat_extractor = model_dir.parent / "feat_extractor.yaml"
    # CosyVoice3's release computes the prompt mel up to Nyquist (fmax: null), CosyVoice2's
    # up to 8 kHz: the orchestrator and the speaker tool follow the release.
    extractor = yaml_entry((release / "cosyvoice2.yaml").read_text(), "feat_extractor")
    assert "    fmax: 8000\n" in extractor
    feat_extractor.write_text(extractor.replace("    fmax: 8000\n", "    fmax: null\n"))
    debian_python(
        "-c",
        "import sys; sys.path.insert(0, sys.argv[3]); import cv3_fakes; "
        "cv3_fakes.write_release(sys.argv[1], open(sys.argv[2]).read())",
        str(model_dir),
        str(feat_extractor),
        str(TESTS),
    )
    shutil.copy(release / "llm" / "tokenizer.json", model_dir / "llm" / "tokenizer.json")
    shutil.copy(release / "campplus.onnx", model_dir / "campplus.onnx")
    debian_python(
        "-c",
        "import sys; from pathlib import Path; from cosyvoice_serving_models import tiny_onnx; "
        "tiny_onnx.write_speech_tokenizer(Path(sys.argv[1]), 'v3')",
        str(model_dir / "speech_tokenizer_v3.onnx"),
    )
    return model_dir


def cosyvoice2_service() -> ServiceSpec:
    """examples/cosyvoice2.yaml with two sequences per engine, two instances of each GPU model
    (so four orchestrator instances), a first chunk of 10 tokens and a default speaker."""
    raw = example("cosyvoice2")
    raw["engine"]["maxBatchSize"] = 2
    raw["serving"]["dynamicBatching"]["preferredBatchSizes"] = [2]
    raw["serving"]["instancesPerGpu"] = 2
    raw["serving"]["streamChunking"] = {"firstChunkTokens": FIRST_CHUNK_TOKENS}
    return default_speaker(raw)


def cosyvoice3_service() -> ServiceSpec:
    """examples/cosyvoice3.yaml for a pod of two LLM groups (``gpusPerReplica: 2``), one
    instance of each GPU model per GPU, with a default speaker."""
    raw = example("cosyvoice3")
    raw["serving"]["gpusPerReplica"] = 2
    # one instance of each GPU model per GPU (the default is 4): each loads upstream's torch
    # networks, and the twin runs on the CI's two cores
    raw["serving"]["instancesPerGpu"] = 1
    raw["engine"]["tensorParallelSize"] = 1
    raw["serving"].pop("dynamicBatching", None)
    raw.pop("autoscaling", None)
    raw["replicas"] = 1
    return default_speaker(raw)


def speaker_rendered(rendered: dict[str, str], orchestrator: str) -> None:
    assert rendered[orchestrator].count('"default_speaker"') == 1
    assert f'"{SPEAKER_IN_ENGINE}"' in rendered[orchestrator]


@pytest.fixture(scope="session")
def cosyvoice2_twin(
    tmp_path_factory: pytest.TempPathFactory, release: Path
) -> Iterator[CosyVoice2Twin]:
    """The operator's rendered CosyVoice2 repository in tritonserver with our ``cosyvoice2``,
    ``token2wav``, ``audio_tokenizer`` and ``speaker_embedding``; ``tensorrt_llm`` is the
    twin's stand-in. The paths point at the tiny release and the speaker's file."""
    work = tmp_path_factory.mktemp("cosyvoice2")
    speaker, recording = speaker_file(release, "cosyvoice2", work / "speaker")
    rendered = triton.render_repository(cosyvoice2_service(), "/engine")
    speaker_rendered(rendered, "cosyvoice2")
    paths = {
        "model_dir": str(release),
        "llm_tokenizer_dir": str(release / "llm"),
        "default_speaker": str(speaker),
    }
    records = work / "devices"
    with serve(
        rendered,
        work,
        COSYVOICE2_OURS,
        lambda text: set_parameters(text, paths),
        env={
            "COSYVOICE_DEVICE_RECORD_DIR": str(records),
            # while work/llm-pause exists, the stand-in LLM holds each stream before its
            # last step (test_twin's gauge test); absent, as for every other test, it does not
            "COSYVOICE_TWIN_LLM_PAUSE_FILE": str(work / "llm-pause"),
        },
    ) as server:
        yield CosyVoice2Twin(server, records, speaker, recording)


@pytest.fixture(scope="session")
def cosyvoice3_twin(
    tmp_path_factory: pytest.TempPathFactory, cosyvoice3_model_dir: Path
) -> Iterator[CosyVoice3Twin]:
    """The operator's rendered CosyVoice3 repository in tritonserver with all our models
    (``cosyvoice3``, ``token2wav`` and ``vocoder`` on the fake networks of
    ``cosyvoice3_model_dir``, ``audio_tokenizer``, ``speaker_embedding``) and the twin's
    stand-ins for the two trtllm-serve processes (``cpu_twin.LlmStandIn``: OpenAI chat
    completions, streamed), whose URLs replace the rendered ones."""
    work = tmp_path_factory.mktemp("cosyvoice3-twin")
    records = work / "devices"
    env = {
        # the stubs build the fake networks the release's yaml names (cv3_fakes, here)
        "COSYVOICE_MODELS_PATH": os.pathsep.join([library_path(), str(TESTS)]),
        "COSYVOICE_DEVICE_RECORD_DIR": str(records),
    }
    speaker, _ = speaker_file(cosyvoice3_model_dir, "cosyvoice3", work / "speaker")
    svc = cosyvoice3_service()
    urls = triton.llm_urls(svc)
    assert len(urls) == 2
    rendered = triton.render_repository(svc, "/engine")
    speaker_rendered(rendered, "cosyvoice3")
    with cpu_twin.LlmStandIn(urls, event_seconds=0.01) as llm:

        def configure(text: str) -> str:
            paths = {
                "model_dir": str(cosyvoice3_model_dir),
                "llm_tokenizer_dir": str(cosyvoice3_model_dir / "llm"),
                "default_speaker": str(speaker),
            }
            return remap_llm_urls(set_parameters(text, paths), llm.remap)

        with serve(rendered, work, COSYVOICE3_OURS, configure, env=env) as server:
            yield CosyVoice3Twin(server, llm, work / "repo", speaker, records)
