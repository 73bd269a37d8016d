"""What the audio tokenizer and the speaker embedding should answer for one waveform, found
without our model code or the release's ONNX files: the tokenizer from the weights
``tiny_onnx`` generated (loaded straight into ``s3tokenizer``'s model, not read back out of
the ONNX file) run as upstream's ``audio_tokenizer`` runs it; the embedding from upstream's
fbank and the tiny network's definition in NumPy. Run by Debian's python3 (torch 1.13);
prints one JSON line.

    python3 reference_check.py WAV.npy [v2|v3]
"""

from __future__ import annotations

import json
import sys

import numpy as np
import s3tokenizer  # type: ignore[import-not-found]
import torch
import torchaudio.compliance.kaldi as kaldi  # type: ignore[import-not-found]
from s3tokenizer.model_v2 import ModelConfig, S3TokenizerV2  # type: ignore[import-not-found]
from s3tokenizer.model_v3 import ModelConfigV3, S3TokenizerV3  # type: ignore[import-not-found]

from cosyvoice_serving_models import tiny_onnx

SEED = 1986  # tiny_release's


def tokens(wav: torch.Tensor, version: str) -> list[int]:
    weights = tiny_onnx.tokenizer_weights(version, SEED)
    dims = {
        "n_audio_state": tiny_onnx.TOKENIZER_STATE,
        "n_audio_head": tiny_onnx.TOKENIZER_STATE // 64,
        "n_audio_layer": tiny_onnx.TOKENIZER_BLOCKS,
    }
    name = f"speech_tokenizer_{version}"
    model = (
        S3TokenizerV3(name, ModelConfigV3(**dims))
        if version == "v3"
        else S3TokenizerV2(name, ModelConfig(**dims))
    )
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    mels, lengths = s3tokenizer.padding([s3tokenizer.log_mel_spectrogram(wav)])
    codes, counts = model.quantize(mels, lengths)
    return [int(t) for t in codes[0, : int(counts[0])]]


def embedding(wav: torch.Tensor) -> list[float]:
    feat = kaldi.fbank(wav.reshape(1, -1), num_mel_bins=80, dither=0, sample_frequency=16000)
    feat = (feat - feat.mean(dim=0, keepdim=True)).numpy()
    projection = tiny_onnx.campplus_projection(SEED)
    return [float(v) for v in np.tanh(feat @ projection).mean(axis=0)]


def main(path: str, version: str) -> None:
    wav = torch.from_numpy(np.load(path).astype(np.float32).reshape(-1))
    print(json.dumps({"tokens": tokens(wav, version), "embedding": embedding(wav)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "v2")
