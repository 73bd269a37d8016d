"""The contract between the renderer and the project's model code (issue 19, item 3), both
ways: every parameter the renderer declares for a model (``render/model_parameters.py``,
which ``render/triton.py`` checks each rendering against) is read by our code for it, and
every parameter our code reads is declared; ``always`` keys are required by the code,
``sometimes`` keys have a default there. The reads are taken from the source of each
``model.py`` (calls of ``contract.parameter``), so a read that bypasses the declaration
fails here too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from cosyvoice_operator.api import spec
from cosyvoice_operator.render import model_parameters, triton
from cosyvoice_serving_models import contract

from .conftest import PACKAGE_ROOT

ROOT = PACKAGE_ROOT.parent
MODELS = PACKAGE_ROOT / "models"
# Python models of the rendered repositories whose code is not written here yet (they would
# run upstream's): none since CosyVoice3's token2wav and vocoder were written. Kept so that the
# test fails when a model is added without its contract entry, or one is written and listed.
NOT_YET_OURS: set[tuple[str, str]] = set()


def reads_in_source(path: Path) -> tuple[set[str], bool]:
    """Keys passed to ``contract.parameter`` in a model file, and whether any other code
    indexes the parameters (``params[...]`` or ``.get`` on them)."""
    tree = ast.parse(path.read_text())
    keys: set[str] = set()
    bypass = False
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "parameter"
        ):
            key = node.args[2]
            assert isinstance(key, ast.Constant) and isinstance(key.value, str), ast.dump(node)
            keys.add(key.value)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            bypass |= node.value.id == "params"
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "params"
        ):
            bypass = True
    return keys, bypass


def ours() -> list[str]:
    return sorted(p.parent.name for p in MODELS.glob("*/model.py"))


def written() -> set[tuple[str, str]]:
    """(variant, model) of every model of ours, in each variant it serves."""
    return {(variant, model) for model in ours() for variant in contract.VARIANTS_OF[model]}


def test_every_python_model_is_ours_or_listed_as_not_yet() -> None:
    python_models = {
        (variant, model)
        for variant, models in model_parameters.MODEL_PARAMETERS.items()
        for model, declared in models.items()
        if declared.reader == model_parameters.MODEL_CODE
    }
    assert written() | NOT_YET_OURS == python_models
    assert not written() & NOT_YET_OURS


@pytest.mark.parametrize(("variant", "model"), sorted(written()))
def test_the_code_reads_exactly_what_the_renderer_declares(variant: str, model: str) -> None:
    declared = model_parameters.MODEL_PARAMETERS[variant][model]
    required, optional = contract.READS[model]
    assert required == frozenset(declared.always) - frozenset(declared.backend_keys)
    assert optional == frozenset(declared.sometimes)
    assert required | optional == model_parameters.read_by_model_code(variant, model)
    keys, bypass = reads_in_source(MODELS / model / "model.py")
    assert not bypass, f"{model}/model.py reads parameters other than through contract.parameter"
    assert keys == required | optional


def rendered_services() -> list[spec.ServiceSpec]:
    raw = yaml.safe_load((ROOT / "examples" / "cosyvoice2.yaml").read_text())["spec"]
    services = [spec.parse(raw)]
    raw["serving"]["streamChunking"] = {"firstChunkTokens": 9, "hopGrowth": "equal"}
    raw["serving"]["gpusPerReplica"] = 2
    services.append(spec.parse(raw))
    raw3 = yaml.safe_load((ROOT / "examples" / "cosyvoice3.yaml").read_text())["spec"]
    services.append(spec.parse(raw3))
    raw3["serving"]["gpusPerReplica"] = 2
    raw3["serving"]["streamChunking"] = {"firstChunkTokens": 20}
    services.append(spec.parse(raw3))
    return services


@pytest.mark.parametrize(
    "svc", rendered_services(), ids=["cv2", "cv2-chunking-2gpu", "cv3", "cv3-chunking-2gpu"]
)
def test_every_rendered_parameter_has_a_reader(svc: spec.ServiceSpec) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    rendered = triton.render_repository(svc, "/engine")
    for model in ours():
        if svc.model.variant not in contract.VARIANTS_OF[model]:
            continue
        config = text_format.Parse(rendered[model], mc.ModelConfig())
        keys = set(config.parameters) - contract.BACKEND_KEYS
        required, optional = contract.READS[model]
        assert keys <= required | optional, (model, keys)
        assert required <= keys, (model, keys)


def test_first_chunk_tokens_reaches_the_code_as_token_hop_len() -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from cosyvoice_serving_models.chunking import Chunking

    config = text_format.Parse(
        triton.render_repository(rendered_services()[1], "/engine")["cosyvoice2"],
        mc.ModelConfig(),
    )
    params = {k: {"string_value": v.string_value} for k, v in config.parameters.items()}
    chunks = Chunking(
        first=int(contract.parameter(params, "cosyvoice2", "token_hop_len", "15")),
        strategy=contract.parameter(params, "cosyvoice2", "dynamic_chunk_strategy"),
    )
    assert chunks.schedule(38) == [(0, 9), (9, 18), (18, 27), (27, 38)]


def test_an_undeclared_read_is_refused() -> None:
    with pytest.raises(KeyError, match="undeclared"):
        contract.parameter({}, "token2wav", "llm_api_base")
    with pytest.raises(ValueError, match="missing"):
        contract.parameter({}, "token2wav", "model_dir")
    assert contract.parameter({}, "cosyvoice2", "token_hop_len", "15") == "15"


def test_token2wav_interface_carries_the_vocoder_state_the_code_uses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tensors our orchestrator sends to and asks of token2wav are rendered."""
    import importlib.util
    import sys
    import types

    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = text_format.Parse(
        triton.render_repository(rendered_services()[0], "/engine")["token2wav"],
        mc.ModelConfig(),
    )
    inputs = {t.name: t for t in config.input}
    outputs = {t.name for t in config.output}
    stub = types.ModuleType("triton_python_backend_utils")  # the backend's module, absent here
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)
    spec_ = importlib.util.spec_from_file_location(
        "orchestrator", MODELS / "cosyvoice2" / "model.py"
    )
    assert spec_ is not None and spec_.loader is not None
    orchestrator = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(orchestrator)
    for out_name, in_name in orchestrator.STATE:
        assert out_name in outputs
        assert inputs[in_name].optional and inputs[in_name].data_type == mc.TYPE_FP32
