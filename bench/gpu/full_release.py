"""A synthetic CosyVoice2 release at the real dimensions, random weights (issue 20, item 2).

Run on the GPU machine (the weights are GBs; the code is carried):

    python3 full_release.py OUT_DIR [--llm]

Writes what the serving pod's model code opens, laid out as the engine builder lays out
``<engine>/model/`` (``serving-models/cosyvoice_serving_models/tiny_release.py`` is the tiny
twin of this script):

- ``cosyvoice2.yaml``: upstream's hyperpyyaml with the dimensions of
  ``examples/libritts/cosyvoice2/conf/cosyvoice2.yaml`` at the pinned commit ace7c47 (the
  release's ``cosyvoice2.yaml`` has the same ``flow`` and ``hift`` entries; the parameter
  counts below match the sizes of the release's ``flow.pt`` and ``hift.pt``, see
  ``../shared/probes/gpu-upstream-flow``);
- ``flow.pt`` (``CausalMaskedDiffWithXvec``: the causal conformer encoder and the causal
  conditional flow-matching decoder) and ``hift.pt`` (``HiFTGenerator``), built from that yaml
  by upstream's own classes, seeded, saved as upstream saves them (state dicts);
- ``llm/tokenizer.json``: the byte-level tokenizer with upstream's special tokens;
- with ``--llm``: ``CosyVoice-BlankEN/`` (a Qwen2-0.5B-shaped Hugging Face checkpoint:
  ``config.json`` + ``model.safetensors``, bfloat16) and ``llm.pt`` (upstream's ``Qwen2LM``
  around it). Nothing in the sweep reads them (its LLM stage is the torch stand-in of
  ``standins/cv_shapes.py``, of the same geometry); they are written to show the release's
  layout is complete and to time it.

Not written: ``speech_tokenizer_v2.onnx`` and ``campplus.onnx`` (the sweep's
``audio_tokenizer`` and ``speaker_embedding`` are GPU stand-ins, and with a cached speaker they
run once per voice) and ``spk2info.pt``. Prints a JSON summary (parameter counts, sizes, time).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "build" / "serving-models"))  # pack.py's copy

# Upstream's conf at ace7c47, the entries the serving code builds or reads; seeds and the
# training-only entries left out.
YAML = """\
sample_rate: 24000
llm_input_size: 896
llm_output_size: 896
spk_embed_dim: 192
qwen_pretrain_path: 'CosyVoice-BlankEN'
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: 25
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.Qwen2LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: 6561
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    input_size: 512
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: 512
        attention_heads: 8
        linear_units: 2048
        num_blocks: 6
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: 512
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: !ref <chunk_size>
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
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: 320
            out_channels: 80
            channels: [256]
            dropout: 0.0
            attention_head_dim: 64
            n_blocks: 4
            num_mid_blocks: 12
            num_heads: 8
            act_fn: 'gelu'
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    in_channels: 80
    base_channels: 512
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
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: 512

feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: 8000
    center: False
"""

# Qwen2-0.5B's config.json (the geometry upstream's CosyVoice-BlankEN carries).
QWEN2_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
}


def millions(module: object) -> float:
    return round(sum(p.numel() for p in module.parameters()) / 1e6, 1)  # type: ignore[attr-defined]


def write_llm(out: Path, summary: dict[str, object]) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    began = time.monotonic()
    blank = out / "CosyVoice-BlankEN"
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_05B)).to(torch.bfloat16)
    model.save_pretrained(blank)
    summary["qwen2_params_M"] = millions(model)
    del model
    from hyperpyyaml import load_hyperpyyaml  # type: ignore[import-not-found]

    text = YAML.replace("'CosyVoice-BlankEN'", repr(str(blank)))
    try:
        llm = load_hyperpyyaml(text)["llm"]
        torch.save(llm.state_dict(), out / "llm.pt")
        summary["llm_params_M"] = millions(llm)
    except Exception as exc:  # upstream's Qwen2Encoder against this transformers
        summary["llm_pt_error"] = f"{type(exc).__name__}: {exc}"[:300]
    summary["llm_seconds"] = round(time.monotonic() - began, 1)


def main() -> int:
    import torch
    from hyperpyyaml import load_hyperpyyaml  # type: ignore[import-not-found]

    from cosyvoice_serving_models.tiny_release import write_tokenizer
    from cosyvoice_serving_models.token2wav import flow_and_hift_yaml

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    (out / "cosyvoice2.yaml").write_text(YAML)
    torch.manual_seed(1986)
    configs = load_hyperpyyaml(flow_and_hift_yaml(YAML))
    torch.save(configs["flow"].state_dict(), out / "flow.pt")
    torch.save(configs["hift"].state_dict(), out / "hift.pt")
    write_tokenizer(out / "llm" / "tokenizer.json")
    summary: dict[str, object] = {
        "flow_params_M": millions(configs["flow"]),
        "hift_params_M": millions(configs["hift"]),
        "flow_estimator_params_M": millions(configs["flow"].decoder.estimator),
    }
    if "--llm" in sys.argv[2:]:
        write_llm(out, summary)
    summary["files_MiB"] = {
        str(p.relative_to(out)): round(p.stat().st_size / 2**20, 1)
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }
    summary["seconds"] = round(time.monotonic() - began, 1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
