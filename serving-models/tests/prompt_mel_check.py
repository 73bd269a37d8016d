"""Run by ``test_prompt_mel.py`` under the interpreter that has torch, torchaudio and upstream's
library (Debian's python3 with the twin's upstream site folder on ``PYTHONPATH``).

    prompt_mel_check.py SIGNALS.npz OUT.npz

For every 16 kHz signal in SIGNALS.npz, the prompt mel as upstream's frontend computes it:
``torchaudio.transforms.Resample(16000, 24000)`` (its defaults), then the release's
``feat_extractor``, Matcha-TTS' ``mel_spectrogram`` (``matcha.utils.audio``, from upstream's
library in the site) with the arguments of CosyVoice2's ``cosyvoice2.yaml`` (n_fft 1920, 80
mels, 24 kHz, hop 480, window 1920, fmin 0, fmax 8000, center False) and CosyVoice3's
(the same with fmax null). Written to OUT.npz as ``NAME@8000`` and ``NAME@none``, [frames,
80] (upstream's ``_extract_speech_feat`` transposes to frames first), with the resampled
signal as ``NAME@24k``.

``matcha.utils.audio`` takes its filterbank from librosa, which the site does not hold
(upstream's requirements do; nothing else here needs it): ``librosa.filters.mel`` is given
as ``torchaudio.functional.melscale_fbanks`` with Slaney's mel scale and Slaney's area
normalisation, which is librosa's default filterbank (``htk=False, norm="slaney"``), and the
filterbank is compared with our NumPy one in the test.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchaudio

# cosyvoice2.yaml's feat_extractor (upstream ace7c47); CosyVoice3's says fmax: null.
FEAT = {
    "n_fft": 1920,
    "num_mels": 80,
    "sampling_rate": 24000,
    "hop_size": 480,
    "win_size": 1920,
    "fmin": 0,
    "center": False,
}


def librosa_mel(
    *, sr: int, n_fft: int, n_mels: int = 128, fmin: float = 0.0, fmax: float | None = None
) -> np.ndarray:
    """librosa.filters.mel's default filterbank, [n_mels, 1 + n_fft // 2], from torchaudio."""
    bank = torchaudio.functional.melscale_fbanks(
        n_freqs=1 + n_fft // 2,
        f_min=float(fmin),
        f_max=float(sr / 2 if fmax is None else fmax),
        n_mels=n_mels,
        sample_rate=sr,
        norm="slaney",
        mel_scale="slaney",
    )
    return bank.T.numpy().astype(np.float32)


def upstream_mel_spectrogram() -> tuple[Any, str]:
    """Matcha-TTS' ``mel_spectrogram``, from ``matcha/utils/audio.py`` in upstream's library
    (loaded from its file: the package's ``__init__`` imports its training helpers), and where
    its filterbank came from."""
    import matcha

    path = Path(matcha.__file__).parent / "utils" / "audio.py"
    spec = importlib.util.spec_from_file_location("upstream_matcha_audio", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        import librosa  # noqa: F401

        source = "librosa"
    except ImportError:
        filters = types.ModuleType("librosa.filters")
        filters.mel = librosa_mel  # type: ignore[attr-defined]
        package = types.ModuleType("librosa")
        package.filters = filters  # type: ignore[attr-defined]
        sys.modules["librosa"], sys.modules["librosa.filters"] = package, filters
        source = "torchaudio.functional.melscale_fbanks (slaney, slaney)"
    try:
        spec.loader.exec_module(module)
    finally:
        if source != "librosa":
            del sys.modules["librosa"], sys.modules["librosa.filters"]
    return module.mel_spectrogram, f"{path}, filterbank from {source}"


def main(signals: Path, out: Path) -> None:
    mel_spectrogram, source = upstream_mel_spectrogram()
    resample = torchaudio.transforms.Resample(orig_freq=16000, new_freq=24000)
    results: dict[str, np.ndarray] = {}
    for name, wav in np.load(signals).items():
        speech = resample(torch.from_numpy(wav.astype(np.float32))[None])
        results[f"{name}@24k"] = speech[0].numpy()
        for label, fmax in (("8000", 8000), ("none", None)):
            mel = mel_spectrogram(speech, fmax=fmax, **FEAT)
            results[f"{name}@{label}"] = mel[0].transpose(0, 1).numpy()
    for label, fmax in (("8000", 8000.0), ("none", None)):
        results[f"filterbank@{label}"] = librosa_mel(sr=24000, n_fft=1920, n_mels=80, fmax=fmax)
    np.savez(out, **results)
    print(f"{source}; torch {torch.__version__}, torchaudio {torchaudio.__version__}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
