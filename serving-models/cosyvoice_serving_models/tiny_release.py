"""A tiny synthetic CosyVoice2 release: the real release's file layout and formats, small
dimensions, random weights (seeded). For the CPU twin and the tests; never for speech.

    python -m cosyvoice_serving_models.tiny_release OUT_DIR
    python -m cosyvoice_serving_models.tiny_release --orchestrator-files VARIANT OUT_DIR

writes, as the engine builder lays out ``<engine>/model/`` (the upstream release
``FunAudioLLM/CosyVoice2-0.5B`` plus the HF LLM companion under ``llm/``):

- ``cosyvoice2.yaml``: hyperpyyaml with upstream's top-level entries and class paths
  (``llm``, ``flow``, ``hift``, ``feat_extractor``, ``mel_spec_transform1``), dimensions
  shrunk. The ``llm`` entry names a Qwen2 checkpoint that does not exist, and the feature
  extractors a module whose import needs librosa: building either fails, which is how the
  tests know token2wav builds only flow and HiFT;
- ``flow.pt``, ``hift.pt``: ``torch.save`` of the state dicts, as upstream's;
- ``llm/tokenizer.json``: a byte-level tokenizer (``tokenizers`` format, as the Qwen2
  companion ships it) with upstream's special tokens ``<|sos|>``, ``<|task_id|>``,
  ``<|eos1|>``;
- ``speech_tokenizer_v2.onnx`` and ``campplus.onnx``: the speech tokenizer's weights as
  ``s3tokenizer`` reads them, and a network with CAM++'s interface (:mod:`.tiny_onnx`).

The flow keeps the real interfaces that other models feed: 80 mel bins, 192-dim speaker
embeddings, 6561 speech tokens, 2 mel frames per token, 3 look-ahead tokens, chunks of 25
tokens; the encoder keeps its width of 512 (upstream's UpsampleConformerEncoder hard-codes
it in its look-ahead and upsampling layers); HiFT keeps 480 samples per mel frame at 24 kHz.
"""

from __future__ import annotations

import string
import sys
from dataclasses import dataclass, fields
from pathlib import Path


@dataclass(frozen=True)
class Dimensions:
    """The sizes that differ between the tiny release and upstream's (every interface the
    other models feed stays upstream's: see the module's docstring)."""

    encoder_heads: int
    encoder_units: int
    encoder_blocks: int
    estimator_channels: int
    estimator_head_dim: int
    estimator_blocks: int
    estimator_mid_blocks: int
    estimator_heads: int
    hift_channels: int
    hift_resblock_kernels: str
    hift_resblock_dilations: str
    f0_channels: int


TINY = Dimensions(2, 64, 1, 32, 16, 1, 1, 2, 16, "[3]", "[[1, 3, 5]]", 16)
# Upstream's examples/libritts/cosyvoice2/conf/cosyvoice2.yaml at ace7c47 (for
# bench/gpu/full_release.py).
UPSTREAM = Dimensions(
    8, 2048, 6, 256, 64, 4, 12, 8, 512, "[3, 7, 11]", "[[1, 3, 5], [1, 3, 5], [1, 3, 5]]", 512
)

TEMPLATE = string.Template(
    """\
${header}sample_rate: 24000
llm_input_size: 896
llm_output_size: 896
spk_embed_dim: 192
qwen_pretrain_path: '$qwen_pretrain_path'
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: 25
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.Qwen2LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: 6561
$llm_training    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
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
        attention_heads: $encoder_heads
        linear_units: $encoder_units
        num_blocks: $encoder_blocks
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
            channels: [$estimator_channels]
            dropout: 0.0
            attention_head_dim: $estimator_head_dim
            n_blocks: $estimator_blocks
            num_mid_blocks: $estimator_mid_blocks
            num_heads: $estimator_heads
            act_fn: 'gelu'
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    in_channels: 80
    base_channels: $hift_channels
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
    resblock_kernel_sizes: $hift_resblock_kernels
    resblock_dilation_sizes: $hift_resblock_dilations
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: $f0_channels

feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: 8000
    center: False

mel_spec_transform1: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: 8000
    center: False
"""
)


def release_yaml(
    dims: Dimensions,
    *,
    header: str = "",
    qwen_pretrain_path: str = "CosyVoice-BlankEN",
    llm_training: str = "",
) -> str:
    """The release's ``cosyvoice2.yaml``: upstream's entries and class paths with ``dims``;
    ``header`` (lines) before them, ``llm_training`` (lines) in the ``llm`` entry."""
    return TEMPLATE.substitute(
        header=header,
        qwen_pretrain_path=qwen_pretrain_path,
        llm_training=llm_training,
        **{f.name: getattr(dims, f.name) for f in fields(dims)},
    )


YAML = release_yaml(
    TINY,
    header=(
        "# tiny synthetic release (cosyvoice_serving_models.tiny_release): random weights\n"
        "__set_seed1: !apply:random.seed [1986]\n"
        "__set_seed3: !apply:torch.manual_seed [1986]\n\n"
    ),
    qwen_pretrain_path="/nonexistent/CosyVoice-BlankEN",
)

SPECIAL_TOKENS = ("<|sos|>", "<|task_id|>", "<|eos1|>")


def write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # type: ignore

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))


def write(out: Path, seed: int = 1986) -> Path:
    import torch
    from hyperpyyaml import load_hyperpyyaml  # type: ignore[import-not-found]

    from cosyvoice_serving_models import tiny_onnx
    from cosyvoice_serving_models.token2wav import flow_and_hift_yaml

    out.mkdir(parents=True, exist_ok=True)
    (out / "cosyvoice2.yaml").write_text(YAML)
    torch.manual_seed(seed)
    configs = load_hyperpyyaml(flow_and_hift_yaml(YAML))
    torch.save(configs["flow"].state_dict(), out / "flow.pt")
    torch.save(configs["hift"].state_dict(), out / "hift.pt")
    write_tokenizer(out / "llm" / "tokenizer.json")
    tiny_onnx.write_speech_tokenizer(out / "speech_tokenizer_v2.onnx", "v2", seed)
    tiny_onnx.write_campplus(out / "campplus.onnx", seed)
    return out


def write_orchestrator_files(out: Path, variant: str) -> Path:
    """Only what an orchestrator opens: ``<variant>.yaml`` and ``llm/tokenizer.json`` (no
    torch: the CPU twin's closed loop, whose other models are stand-ins)."""
    if variant not in ("cosyvoice2", "cosyvoice3"):
        raise ValueError(f"unknown variant {variant!r}")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{variant}.yaml").write_text(YAML)
    write_tokenizer(out / "llm" / "tokenizer.json")
    return out


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--orchestrator-files":
        print(write_orchestrator_files(Path(sys.argv[3]), sys.argv[2]))
    elif len(sys.argv) == 2:
        print(write(Path(sys.argv[1])))
    else:
        sys.exit(
            "usage: python -m cosyvoice_serving_models.tiny_release "
            "[--orchestrator-files VARIANT] OUT_DIR"
        )
