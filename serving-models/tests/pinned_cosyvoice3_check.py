"""A check run by hand, not by pytest: our CosyVoice3 ``token2wav`` / ``vocoder`` code on
upstream's own CosyVoice3 classes at the pinned commit, which no PyPI package holds (README,
"The PyPI packages against the pinned commit"), so CI cannot install them.

    PYTHONPATH=UPSTREAM_SRC:X_TRANSFORMERS_SITE:serving-models:UPSTREAM_CPU_SITE \\
        /usr/bin/python3 serving-models/tests/pinned_cosyvoice3_check.py WORK_DIR

``UPSTREAM_SRC``: a directory holding upstream's ``cosyvoice/`` at ace7c47 (``git archive``
of a checkout), first on the path so that it, not the PyPI wheel's older ``cosyvoice``, is
imported; ``X_TRANSFORMERS_SITE``: ``x-transformers`` (1.44.8 imports under torch 1.13) with
``einx``, ``loguru`` and ``frozendict``. Debian's torch 1.13 lacks torch 2's
``scaled_dot_product_attention``, which upstream's DiT calls: a plain one is defined here
(:func:`_attention`). It writes a tiny CosyVoice3 release (upstream's yaml
layout and classes, ``CausalMaskedDiffWithDiT`` with a 2-block ``DiT``, ``CausalHiFTGenerator``
with ``CausalConvRNNF0Predictor``, small widths, random weights) and prints one JSON object:
a stream served chunk by chunk by our code, its chunks alternating between two ``Token2Mel``
and two ``Vocoder`` instances as our orchestrator sends them, against upstream's own
streaming synthesis in one process (``CosyVoice3Model.token2wav``, mel and speech offset kept
under one uuid), the excitation tables of upstream's vocoder set to ours (they are drawn at
construction, from wherever the generator stands); and the same stream with the second
vocoder's tables drawn on its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosyvoice_serving_models.chunking import LOOKAHEAD_TOKENS, Chunking
from cosyvoice_serving_models.cosyvoice3_token2wav import Token2Mel, Vocoder


def _attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> Any:
    """torch 2's ``scaled_dot_product_attention`` as documented (a boolean mask says which
    positions take part), for Debian's torch 1.13, which lacks it and whose absence upstream's
    DiT ``Attention`` refuses. Only what the DiT calls: no dropout, not causal."""
    assert dropout_p == 0.0 and not is_causal
    scores = query @ key.transpose(-2, -1) / query.shape[-1] ** 0.5
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ value


if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
    torch.nn.functional.scaled_dot_product_attention = _attention

YAML = """\
__set_seed1: !apply:random.seed [1986]
__set_seed2: !apply:numpy.random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]
sample_rate: 24000
spk_embed_dim: 192
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: 25 # streaming inference chunk size, in token
num_decoding_left_chunks: -1

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: 64
        pre_lookahead_len: 3
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: 64
            depth: 2
            heads: 2
            dim_head: 32
            ff_mult: 2
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    in_channels: 80
    base_channels: 64
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    conv_pre_look_right: 4
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: 32
"""


def write_release(release: Path) -> Any:
    from hyperpyyaml import load_hyperpyyaml

    release.mkdir(parents=True, exist_ok=True)
    (release / "cosyvoice3.yaml").write_text(YAML)
    configs = load_hyperpyyaml(YAML)
    torch.save(configs["flow"].state_dict(), release / "flow.pt")
    hift = configs["hift"].state_dict()
    torch.save({f"generator.{k}": v for k, v in hift.items()}, release / "hift.pt")
    return configs


def upstream_stream(configs: Any, ours: Vocoder, prompt: dict[str, Any], tokens: Any) -> Any:
    """Upstream's in-process streaming: ``CosyVoice3Model.token2wav`` chunk by chunk, the
    windows our schedule cuts (upstream's own loop cuts them the same way: the tokens up to
    the chunk's end and its look-ahead, then all of them finalized)."""
    from cosyvoice.cli.model import CosyVoice3Model

    hift = configs["hift"]
    source = hift.m_source
    source.l_sin_gen.rand_ini = ours.hift.m_source.l_sin_gen.rand_ini.clone()
    source.l_sin_gen.sine_waves = ours.hift.m_source.l_sin_gen.sine_waves.clone()
    source.uv = ours.hift.m_source.uv.clone()
    model = CosyVoice3Model(None, configs["flow"].eval(), hift.eval(), fp16=False)
    model.hift_cache_dict["u"] = None
    schedule = Chunking(first=15, strategy="exponential").schedule(len(tokens))
    out = []
    for index, (offset, end) in enumerate(schedule):
        finalize = index == len(schedule) - 1
        window = tokens if finalize else tokens[: end + LOOKAHEAD_TOKENS]
        with torch.inference_mode():
            speech = model.token2wav(
                token=torch.from_numpy(window[None]),
                prompt_token=torch.from_numpy(prompt["tokens"][None]),
                prompt_feat=torch.from_numpy(prompt["feat"][None].astype(np.float32)),
                embedding=torch.from_numpy(prompt["embedding"][None].astype(np.float32)),
                token_offset=offset,
                uuid="u",
                stream=True,
                finalize=finalize,
            )
        out.append(speech.reshape(-1).numpy())
    return np.concatenate(out)


def our_stream(
    flows: list[Token2Mel], vocoders: list[Vocoder], prompt: dict[str, Any], tokens: Any
) -> Any:
    schedule = Chunking(first=15, strategy="exponential").schedule(len(tokens))
    mel = np.zeros((80, 0), dtype=np.float32)
    out, done = [], 0
    for index, (offset, end) in enumerate(schedule):
        finalize = index == len(schedule) - 1
        window = tokens if finalize else tokens[: end + LOOKAHEAD_TOKENS]
        flow, vocoder = flows[index % 2], vocoders[index % 2]
        part = flow.mel(
            window, prompt["tokens"], prompt["feat"], prompt["embedding"], offset, finalize
        )
        mel = np.concatenate([mel, part], axis=1)
        speech = vocoder.speech(mel, finalize)
        out.append(speech[done:])
        done = speech.shape[0]
    return np.concatenate(out), len(schedule)


def main(work: Path) -> None:
    torch.set_num_threads(1)
    release = work / "model"
    configs = write_release(release)
    rng = np.random.default_rng(13)
    tokens = rng.integers(0, 6561, size=90).astype(np.int32)
    prompt = {
        "tokens": rng.integers(0, 6561, size=25).astype(np.int32),
        "feat": (rng.standard_normal((50, 80)) * 0.5).astype(np.float16),
        "embedding": rng.standard_normal(192).astype(np.float16),
    }
    flows = [Token2Mel(release, "cpu"), Token2Mel(release, "cpu")]
    torch.manual_seed(1)
    first = Vocoder(release, "cpu")
    torch.manual_seed(2)
    torch.rand(100)
    second = Vocoder(release, "cpu")
    ours, chunks = our_stream(flows, [first, second], prompt, tokens)
    reference = upstream_stream(configs, first, prompt, tokens)
    unseeded = Vocoder(release, "cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(77)
        drawn = torch.rand_like(unseeded.hift.m_source.l_sin_gen.sine_waves)
    unseeded.hift.m_source.l_sin_gen.sine_waves = drawn
    mixed, _ = our_stream(flows, [first, unseeded], prompt, tokens)
    print(
        json.dumps(
            {
                "classes": [type(flows[0].flow).__name__, type(first.hift).__name__],
                "estimator": type(flows[0].flow.decoder.estimator).__name__,
                "chunks": chunks,
                "samples": int(ours.shape[0]),
                "reference_samples": int(reference.shape[0]),
                "same_tables": bool(
                    torch.equal(
                        first.hift.m_source.l_sin_gen.sine_waves,
                        second.hift.m_source.l_sin_gen.sine_waves,
                    )
                ),
                "max_abs_difference": float(np.abs(ours - reference).max()),
                "own_tables_max_abs_difference": float(np.abs(mixed - reference).max()),
                "peak": float(np.abs(ours).max()),
            }
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
