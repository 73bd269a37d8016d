"""The tiny synthetic release's ONNX files: the speech tokenizer and the speaker embedding
(``tiny_release`` writes them beside ``flow.pt`` and ``hift.pt``). Random weights, seeded;
real ONNX files (``onnx.checker`` passes), small dimensions.

``speech_tokenizer_v2.onnx`` / ``_v3.onnx`` (CosyVoice2's / CosyVoice3's): the weights of an
``s3tokenizer`` ``S3TokenizerV2`` / ``V3`` of 2 blocks of width 128 (the releases': 6 / 12 of
1280), under the names ``s3tokenizer``'s converters (``onnx2torch``, ``onnx2torch_v3``) read
from upstream's exports: v2 by initializer (``onnx::Conv_2216`` .. ``_2219``,
``onnx::MatMul_2536``, ``quantizer.project_in.bias``) and by node
(``/blocks.<i>/attn/query/MatMul``, ``/blocks.<i>/attn_ln/LayerNormalization``,
``/blocks.<i>/mlp/mlp.0/Add`` ...); v3 by node
(``/conv1/Conv``, ``/blocks.<i>/attn_ln/Mul`` and ``/Add`` ...); matrices stored ``[in, out]``
as an export stores them. The graph holds the weights; it is not the tokenizer's computation:
``s3tokenizer`` reads the weights out of the file into its own torch model and never runs the
ONNX graph.

``campplus.onnx``: a network with the interface of upstream's CAM++ export, which the
speaker-embedding model runs in ONNX Runtime: input ``input`` ``[batch, frames, 80]``
(mean-normalised Kaldi fbank), output ``[batch, 192]``. Here: a projection, ``tanh`` and the
mean over frames.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TOKENIZER_STATE = 128  # 64 per attention head, as s3tokenizer's rotary embedding fixes it
TOKENIZER_BLOCKS = 2
SPEAKER_DIM = 192
FBANK_BINS = 80
OPSET = 17  # LayerNormalization
IR_VERSION = 8

# s3tokenizer.onnx2torch (v2): upstream's export's names for these weights.
_V2_NAMED = {
    "encoder.conv1.weight": "onnx::Conv_2216",
    "encoder.conv1.bias": "onnx::Conv_2217",
    "encoder.conv2.weight": "onnx::Conv_2218",
    "encoder.conv2.bias": "onnx::Conv_2219",
    "quantizer._codebook.project_down.weight": "onnx::MatMul_2536",
    "quantizer._codebook.project_down.bias": "quantizer.project_in.bias",
}


def tokenizer_weights(version: str, seed: int) -> dict[str, Any]:
    """The state dict of a tiny ``S3TokenizerV2`` / ``V3`` (``version`` "v2" / "v3") with
    random weights (``seed``)."""
    import torch
    from s3tokenizer.model_v2 import ModelConfig, S3TokenizerV2  # type: ignore[import-not-found]
    from s3tokenizer.model_v3 import ModelConfigV3, S3TokenizerV3  # type: ignore[import-not-found]

    torch.manual_seed(seed + int(version[1:]))  # v2 and v3 differ
    dims = {
        "n_audio_state": TOKENIZER_STATE,
        "n_audio_head": TOKENIZER_STATE // 64,
        "n_audio_layer": TOKENIZER_BLOCKS,
    }
    name = f"speech_tokenizer_{version}"
    model = (
        S3TokenizerV3(name, ModelConfigV3(**dims))
        if version == "v3"
        else S3TokenizerV2(name, ModelConfig(**dims))
    )
    weights = {}
    for key, value in model.state_dict().items():
        # LayerNorm starts at exactly 1 and 0: random, so a test sees each one arrive.
        weights[key] = (value + 0.1 * torch.randn_like(value)).numpy()
    return weights


def _v2_node(key: str) -> tuple[str, str, str]:
    """(op type, node name, initializer name) of one weight in the v2 export."""
    if key in _V2_NAMED:
        op = "Conv" if "conv" in key else ("MatMul" if key.endswith("weight") else "Add")
        return op, "/" + key.rsplit(".", 1)[0].replace(".", "/") + f"/{op}", _V2_NAMED[key]
    parts = key.split(".")  # encoder.blocks.<i>.<rest...>
    block, rest = parts[2], parts[3:]
    if rest[0] in ("attn_ln", "mlp_ln"):
        return "LayerNormalization", f"/blocks.{block}/{rest[0]}/LayerNormalization", key
    if rest[:2] == ["attn", "fsmn_block"]:
        return "Conv", f"/blocks.{block}/attn/fsmn_block/Conv", key
    op = "MatMul" if rest[-1] == "weight" else "Add"
    if rest[0] == "mlp":  # mlp.0.weight -> /blocks.i/mlp/mlp.0/MatMul
        return op, f"/blocks.{block}/mlp/mlp.{rest[1]}/{op}", key
    return op, f"/blocks.{block}/attn/{rest[1]}/{op}", key


def _v3_node(key: str) -> tuple[str, str, str]:
    """(op type, node name, initializer name) of one weight in the v3 export
    (``s3tokenizer.onnx2torch_v3`` maps node names, layer norms as Mul + Add)."""
    parts = key.split(".")
    if parts[1] in ("conv1", "conv2"):
        return "Conv", f"/{parts[1]}/Conv", key
    if parts[0] == "quantizer":
        if parts[-1] == "bias":
            return "Add", "/quantizer/project_in/Add", "quantizer.project_in.bias"
        return "MatMul", "/quantizer/project_in/MatMul", key
    block, rest = parts[2], parts[3:]
    if rest[0] in ("attn_ln", "mlp_ln"):
        op = "Mul" if rest[1] == "weight" else "Add"
        return op, f"/blocks.{block}/{rest[0]}/{op}", key
    if rest[:2] == ["attn", "fsmn_block"]:
        return "Conv", f"/blocks.{block}/attn/fsmn_block/Conv", key[len("encoder.") :]
    op = "MatMul" if rest[-1] == "weight" else "Add"
    if rest[0] == "mlp":
        return op, f"/blocks.{block}/mlp/mlp.{rest[1]}/{op}", key
    return op, f"/blocks.{block}/attn/{rest[1]}/{op}", key


def write_speech_tokenizer(path: Path, version: str, seed: int = 1986) -> dict[str, Any]:
    """Write ``speech_tokenizer_<version>.onnx``'s weights to ``path``; return the state dict
    the file holds."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper  # type: ignore[import-not-found]

    weights = tokenizer_weights(version, seed)
    where = _v3_node if version == "v3" else _v2_node
    initializers: list[Any] = []
    by_node: dict[str, tuple[str, list[str]]] = {}
    for key, value in weights.items():
        op, node, name = where(key)
        matrix = value.T if value.ndim == 2 else value  # [out, in] -> [in, out]
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(matrix), name))
        by_node.setdefault(node, (op, []))[1].append(name)
    nodes = [
        helper.make_node(op, ["mel", *inputs], [f"out{i}"], name=node)
        for i, (node, (op, inputs)) in enumerate(by_node.items())
    ]
    graph = helper.make_graph(
        nodes,
        f"tiny_speech_tokenizer_{version}",
        [helper.make_tensor_value_info("mel", TensorProto.FLOAT, ["batch", 128, "frames"])],
        [helper.make_tensor_value_info(f"out{len(nodes) - 1}", TensorProto.FLOAT, ["out"])],
        initializers,
    )
    _save(graph, path)
    return weights


def campplus_projection(seed: int) -> Any:
    """The tiny speaker network's one weight, ``[80, 192]``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.standard_normal((FBANK_BINS, SPEAKER_DIM)).astype(np.float32) / 9.0


def write_campplus(path: Path, seed: int = 1986) -> None:
    """Write the speaker-embedding network (see the module's docstring)."""
    from onnx import TensorProto, helper, numpy_helper  # type: ignore[import-not-found]

    projection = campplus_projection(seed)
    nodes = [
        helper.make_node("MatMul", ["input", "projection"], ["projected"]),
        helper.make_node("Tanh", ["projected"], ["squashed"]),
        helper.make_node("ReduceMean", ["squashed"], ["embedding"], axes=[1], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_campplus",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "frames", 80])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", SPEAKER_DIM])],
        [numpy_helper.from_array(projection, "projection")],
    )
    _save(graph, path)


def _save(graph: Any, path: Path) -> None:
    import onnx  # type: ignore[import-not-found]
    from onnx import helper  # type: ignore[import-not-found]

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
