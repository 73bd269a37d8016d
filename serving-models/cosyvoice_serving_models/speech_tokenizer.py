"""Reference audio -> speech tokens, with the ``s3tokenizer`` library (PyPI; the package
upstream's runtime uses), on the device the model instance was given.

The release names its variant by its yaml (``cosyvoice2.yaml`` / ``cosyvoice3.yaml``, as the
engine builder's gate checks), and the variant its tokenizer: ``speech_tokenizer_v2.onnx``
(``S3TokenizerV2``) or ``speech_tokenizer_v3.onnx`` (``S3TokenizerV3``). The weights come out
of the ONNX file through ``s3tokenizer``'s own converters (``onnx2torch``,
``onnx2torch_v3``) and load as its ``init_from_onnx`` loads them (v2 strict, v3 not); the
model's width and depth are read from those weights (a released tokenizer: 1280 wide, 6 or
12 blocks, ``s3tokenizer``'s defaults; 64 per attention head, which its rotary embedding
fixes), so a smaller checkpoint of the same format loads too. Features and batching are the
library's: ``log_mel_spectrogram`` (128 bins, 16 kHz), ``padding``, ``quantize``.

The tokens are the speech tokens themselves, 0..6560, for both variants: both orchestrators
take them so (upstream's CosyVoice2 tokenizer model added the LLM's text vocabulary size,
151663, and its orchestrator took it off again).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPEECH_TOKENIZER = {
    "cosyvoice2": "speech_tokenizer_v2.onnx",
    "cosyvoice3": "speech_tokenizer_v3.onnx",
}
HEAD_WIDTH = 64
SAMPLE_RATE = 16000


def release_variant(model_dir: Path) -> str:
    """The variant of the release in ``model_dir``: the one whose yaml it holds."""
    found = [v for v in SPEECH_TOKENIZER if (model_dir / f"{v}.yaml").is_file()]
    if len(found) != 1:
        raise ValueError(
            f"{model_dir}: expected exactly one of "
            f"{', '.join(f'{v}.yaml' for v in SPEECH_TOKENIZER)}, found {found or 'none'}"
        )
    return found[0]


@dataclass(frozen=True)
class Dimensions:
    mels: int
    width: int
    blocks: int


def dimensions(weights: dict[str, Any]) -> Dimensions:
    """Width, depth and mel bins of the tokenizer whose state dict ``weights`` is."""
    mels_in = weights["encoder.conv1.weight"].shape  # [width, mels, 3]
    blocks = {key.split(".")[2] for key in weights if key.startswith("encoder.blocks.")}
    if mels_in[0] % HEAD_WIDTH:
        raise ValueError(f"tokenizer width {mels_in[0]} is not a multiple of {HEAD_WIDTH}")
    return Dimensions(mels=int(mels_in[1]), width=int(mels_in[0]), blocks=len(blocks))


def load(path: Path, device: str) -> Any:
    """The tokenizer of ``path`` (``speech_tokenizer_v2.onnx`` or ``_v3.onnx``) on ``device``."""
    import s3tokenizer  # type: ignore[import-not-found]
    from s3tokenizer.model_v2 import ModelConfig  # type: ignore[import-not-found]
    from s3tokenizer.model_v3 import ModelConfigV3  # type: ignore[import-not-found]

    v3 = path.name == SPEECH_TOKENIZER["cosyvoice3"]
    convert = s3tokenizer.onnx2torch_v3 if v3 else s3tokenizer.onnx2torch
    weights = convert(str(path), None, False)
    dims = dimensions(weights)
    config = (ModelConfigV3 if v3 else ModelConfig)(
        n_mels=dims.mels,
        n_audio_state=dims.width,
        n_audio_head=dims.width // HEAD_WIDTH,
        n_audio_layer=dims.blocks,
    )
    model = (s3tokenizer.S3TokenizerV3 if v3 else s3tokenizer.S3TokenizerV2)(path.stem, config)
    model.load_state_dict(weights, strict=not v3)
    return model.to(device).eval()


def tokenize(model: Any, wavs: list[Any], device: str) -> list[Any]:
    """Speech tokens (int32 NumPy) of each 16 kHz waveform of ``wavs``, in one batch."""
    import numpy as np
    import s3tokenizer
    import torch

    mels = [
        s3tokenizer.log_mel_spectrogram(
            torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32)).to(device),
            n_mels=model.config.n_mels,
        )
        for wav in wavs
    ]
    batch, lengths = s3tokenizer.padding(mels)
    codes, counts = model.quantize(batch.to(device), lengths.to(device))
    codes, counts = codes.cpu().numpy(), counts.cpu().numpy()
    return [codes[i, : int(counts[i])].astype(np.int32) for i in range(len(wavs))]
