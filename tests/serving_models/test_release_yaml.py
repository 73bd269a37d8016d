"""One template for the synthetic releases' ``cosyvoice2.yaml``: the tiny one of the CPU twins
and the full-size one of the GPU runs (``bench/gpu/full_release.py``) differ only in the sizes
of ``Dimensions``, never in an interface another model feeds."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import yaml

from cosyvoice_serving_models import tiny_release


class TagBlind(yaml.SafeLoader):
    """Reads hyperpyyaml's tagged nodes (``!new:``, ``!ref``, ...) as plain values."""


def _untagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


TagBlind.add_multi_constructor("!", _untagged)


def read(text: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load(text, Loader=TagBlind)
    return loaded


def leaves(tree: Any, path: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(leaves(value, f"{path}.{key}" if path else str(key)))
        return out
    return {path: tree}


def test_the_tiny_and_the_full_release_differ_only_in_their_dimensions() -> None:
    tiny = leaves(read(tiny_release.YAML))
    full = leaves(read(tiny_release.release_yaml(tiny_release.UPSTREAM)))
    differing = {key for key in tiny.keys() | full.keys() if tiny.get(key) != full.get(key)}
    sized = {
        "flow.encoder.attention_heads",
        "flow.encoder.linear_units",
        "flow.encoder.num_blocks",
        "flow.decoder.estimator.channels",
        "flow.decoder.estimator.attention_head_dim",
        "flow.decoder.estimator.n_blocks",
        "flow.decoder.estimator.num_mid_blocks",
        "flow.decoder.estimator.num_heads",
        "hift.base_channels",
        "hift.resblock_kernel_sizes",
        "hift.resblock_dilation_sizes",
        "hift.f0_predictor.cond_channels",
    }
    assert len(sized) == len(fields(tiny_release.Dimensions))
    # The tiny release also seeds its weights and names a Qwen2 checkpoint that cannot load.
    assert differing == sized | {"__set_seed1", "__set_seed3", "qwen_pretrain_path"}
    assert full["flow.decoder.estimator.num_mid_blocks"] == 12  # upstream's conf at ace7c47
    assert full["hift.resblock_kernel_sizes"] == [3, 7, 11]


def test_the_interfaces_other_models_feed_are_upstreams_in_both() -> None:
    for text in (tiny_release.YAML, tiny_release.release_yaml(tiny_release.UPSTREAM)):
        assert "$" not in text
        conf = read(text)
        assert conf["flow"]["output_size"] == 80 and conf["spk_embed_dim"] == 192
        assert conf["flow"]["vocab_size"] == 6561 and conf["token_mel_ratio"] == 2
        assert conf["feat_extractor"]["hop_size"] == 480 and conf["sample_rate"] == 24000
