"""The prompt mel our orchestrators and the speaker tool compute in NumPy
(``cosyvoice_serving_models.features.prompt_mel``) against upstream's own pipeline:
``torchaudio.transforms.Resample(16000, 24000)`` and Matcha-TTS' ``mel_spectrogram`` from
upstream's library, on Debian's torch and torchaudio (``prompt_mel_check.py``), for
CosyVoice2's fmax (8 kHz) and CosyVoice3's (none: 12 kHz), on speech-like signals.

Tolerance: every log-mel value within ``TOLERANCE`` (0.01 nats, a 1 % difference in mel
amplitude) of upstream's, and on average within ``MEAN_TOLERANCE``. The linear
interpolation features.py used before fails it by far (checked below, so the comparison is
known to have the power to fail).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from twins import RATE, debian_python, require_library, write_recording

from cosyvoice_serving_models import features

HERE = Path(__file__).parent
TOLERANCE = 0.01  # nats of log-mel, any value
MEAN_TOLERANCE = 1e-4  # nats of log-mel, on average
F_MAXES = {"8000": features.F_MAX, "none": features.NYQUIST}


def speech_like(seconds: float, seed: int) -> Any:
    """A voiced signal with a gliding pitch (90-260 Hz, harmonics to 8 kHz with a falling
    tilt), syllables at 4 Hz, a fricative burst of noise and a pause of near-silence; an odd
    number of samples."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(RATE * seconds) + 1) / RATE
    pitch = 90.0 + 170.0 * (0.5 + 0.5 * np.sin(2 * np.pi * 0.7 * t + seed))
    phase = 2 * np.pi * np.cumsum(pitch) / RATE
    harmonics = range(1, int(8000 / 260))
    voiced = sum(np.sin(k * phase + rng.uniform(0, 2 * np.pi)) / k**0.8 for k in harmonics)
    syllables = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t) ** 2
    signal = 0.08 * voiced * syllables
    burst = (t > 0.35 * seconds) & (t < 0.5 * seconds)
    signal[burst] = 0.3 * rng.standard_normal(burst.sum())
    pause = (t > 0.7 * seconds) & (t < 0.8 * seconds)
    signal[pause] = 1e-4 * rng.standard_normal(pause.sum())
    return np.clip(signal, -1.0, 1.0).astype(np.float32)


def linear_mel(wav16k: Any, f_max: float) -> Any:
    """The prompt mel with the 16 -> 24 kHz linear interpolation features.py used before."""
    samples = np.asarray(wav16k, dtype=np.float32)
    at = np.arange(len(samples) * 3 // 2) * 2 / 3
    return features.log_mel(np.interp(at, np.arange(len(samples)), samples), f_max)


def test_the_prompt_mel_matches_upstreams_pipeline(tmp_path: Path) -> None:
    require_library()
    signals = {
        "speech": speech_like(2.0, seed=1),
        "speech_short": speech_like(0.9, seed=2),
        "recording": write_recording(tmp_path / "narrator.wav"),  # the twins' default speaker
        "noise": (0.2 * np.random.default_rng(4).standard_normal(RATE)).astype(np.float32),
    }
    np.savez(tmp_path / "signals.npz", **signals)
    printed = debian_python(
        str(HERE / "prompt_mel_check.py"), str(tmp_path / "signals.npz"), str(tmp_path / "up.npz")
    )
    upstream = dict(np.load(tmp_path / "up.npz"))
    print(f"\n{printed.strip()}")

    # The same filterbanks (upstream's: librosa's default, here from torchaudio).
    for label, f_max in F_MAXES.items():
        bank = features.mel_filterbank(f_max=f_max)
        assert np.abs(bank - upstream[f"filterbank@{label}"]).max() < 1e-5 * bank.max(), label

    worst = {"max": 0.0, "mean": 0.0}
    for name, wav in signals.items():
        resampled = features.resample_to_24k(wav)
        theirs = upstream[f"{name}@24k"]
        assert resampled.shape == theirs.shape, name
        assert np.abs(resampled - theirs).max() < 1e-5, name
        for label, f_max in F_MAXES.items():
            ours, reference = features.prompt_mel(wav, f_max), upstream[f"{name}@{label}"]
            assert ours.shape == reference.shape, (name, label, ours.shape, reference.shape)
            difference = np.abs(ours.astype(np.float64) - reference)
            linear = np.abs(linear_mel(wav, f_max).astype(np.float64) - reference)
            spread = float(reference.max() - reference.min())
            print(
                f"{name} fmax {label}: |d log-mel| mean {difference.mean():.2e}, max "
                f"{difference.max():.2e} ({difference.max() / spread:.1e} of its range); "
                f"linear resampling: mean {linear.mean():.3f}, max {linear.max():.3f}"
            )
            assert difference.max() <= TOLERANCE, (name, label, difference.max())
            assert difference.mean() <= MEAN_TOLERANCE, (name, label, difference.mean())
            # The mel alone, on upstream's resampled signal.
            mel_only = np.abs(features.log_mel(theirs, f_max).astype(np.float64) - reference)
            assert mel_only.max() <= TOLERANCE and mel_only.mean() <= MEAN_TOLERANCE, name
            # The linear interpolation used before is far outside: the check can fail.
            assert linear.max() > 10 * TOLERANCE and linear.mean() > 10 * MEAN_TOLERANCE
            worst = {
                "max": max(worst["max"], float(difference.max())),
                "mean": max(worst["mean"], float(difference.mean())),
            }
    assert worst["max"] <= TOLERANCE
