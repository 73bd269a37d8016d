"""Prompt features of a reference recording, in NumPy (the orchestrator keeps no torch).

What the flow is conditioned on (the release's ``feat_extractor``, i.e. Matcha-TTS'
``mel_spectrogram`` with n_fft 1920, 80 bins, 24 kHz, hop 480, window 1920, fmin 0,
``center=False``, and fmax 8000 in CosyVoice2's ``cosyvoice2.yaml``, ``null`` in CosyVoice3's
``cosyvoice3.yaml``, i.e. the Nyquist frequency, 12 kHz, as upstream's CosyVoice3 orchestrator
computes it): reflect padding of (n_fft - hop) / 2 on each side, a
periodic Hann window, magnitude ``sqrt(power + 1e-9)``, a Slaney-scale, Slaney-normalised
mel filterbank (librosa's default), then ``log(max(x, 1e-5))``. The 16 kHz reference is
brought to 24 kHz as upstream's frontend does it, ``torchaudio.transforms.Resample(16000,
24000)`` with its defaults: a polyphase filter of Hann-windowed sincs, 6 zero crossings,
cut off at 0.99 of the 8 kHz Nyquist frequency (:func:`resample_to_24k`). Written from those
definitions; no code of librosa, torchaudio or Matcha-TTS is copied. Checked against
upstream's own pipeline (torchaudio's resampler, Matcha's ``mel_spectrogram``) in
``serving-models/tests/test_prompt_mel.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SAMPLE_RATE = 24000
REFERENCE_RATE = 16000
N_FFT = 1920
HOP = 480
MELS = 80
F_MAX = 8000.0  # CosyVoice2's; CosyVoice3's release says null: SAMPLE_RATE / 2
NYQUIST = SAMPLE_RATE / 2.0
# How a yaml writes "no fmax" (hyperpyyaml reads them as None: librosa then takes Nyquist).
NO_F_MAX = ("null", "None", "~")


def _hz_to_mel(hz: Any) -> Any:
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / (200.0 / 3)
    log_step = np.log(6.4) / 27.0
    return np.where(hz >= 1000.0, 15.0 + np.log(np.maximum(hz, 1e-12) / 1000.0) / log_step, linear)


def _mel_to_hz(mel: Any) -> Any:
    mel = np.asarray(mel, dtype=np.float64)
    log_step = np.log(6.4) / 27.0
    return np.where(mel >= 15.0, 1000.0 * np.exp(log_step * (mel - 15.0)), mel * (200.0 / 3))


def mel_filterbank(
    rate: int = SAMPLE_RATE, n_fft: int = N_FFT, mels: int = MELS, f_max: float = F_MAX
) -> Any:
    """[mels, n_fft // 2 + 1] Slaney filterbank from 0 Hz to ``f_max``."""
    freqs = np.linspace(0.0, rate / 2.0, 1 + n_fft // 2)
    points = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(f_max), mels + 2))
    widths = np.diff(points)
    ramps = points[:, None] - freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (points[2 : mels + 2] - points[:mels]))[:, None]
    return weights.astype(np.float32)


_BANKS = {F_MAX: mel_filterbank(), NYQUIST: mel_filterbank(f_max=NYQUIST)}
_WINDOW = (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)


# The resampler: 16 kHz -> 24 kHz is UP output samples for every DOWN input samples.
UP, DOWN = 3, 2
ZERO_CROSSINGS = 6  # of the sinc on each side (torchaudio's lowpass_filter_width)
ROLLOFF = 0.99  # the cut-off, as a fraction of the lower rate's Nyquist frequency


def _resampling_kernels() -> Any:
    """[UP, taps]: for each output phase, the weights of the input samples around it.

    Time is counted in blocks of DOWN input samples (= UP output samples). Output sample
    ``UP * f + p`` lies ``p / UP`` of a block after input sample ``DOWN * f``, and is the
    weighted sum of the inputs ``DOWN * f - half + j`` (``j`` over the taps). A weight is a
    sinc whose zeros are ``1 / cutoff`` blocks apart (a low-pass at ``ROLLOFF`` of the lower
    rate's Nyquist frequency), times a Hann window that is 0 at ``ZERO_CROSSINGS`` zeros
    away, scaled by ``cutoff / DOWN`` (a gain of 1 at 0 Hz, within 0.07 %)."""
    cutoff = min(UP, DOWN) * ROLLOFF
    half = int(np.ceil(ZERO_CROSSINGS * DOWN / cutoff))
    offsets = np.arange(-half, half + DOWN, dtype=np.float64) / DOWN
    phases = np.arange(UP, dtype=np.float64)[:, None] / UP
    t = np.clip((offsets[None, :] - phases) * cutoff, -ZERO_CROSSINGS, ZERO_CROSSINGS)
    window = np.cos(np.pi * t / (2 * ZERO_CROSSINGS)) ** 2
    return np.sinc(t) * window * (cutoff / DOWN)


_KERNELS = _resampling_kernels()
_HALF = (_KERNELS.shape[1] - DOWN) // 2


def resample_to_24k(wav16k: Any) -> Any:
    """16 kHz -> 24 kHz, ``ceil(3 n / 2)`` samples, by the polyphase windowed-sinc filter of
    :func:`_resampling_kernels` (zeros beyond both ends)."""
    samples = np.asarray(wav16k, dtype=np.float64).reshape(-1)
    count = -(-len(samples) * UP // DOWN)
    padded = np.pad(samples, (_HALF, _HALF + DOWN))
    taps = np.lib.stride_tricks.sliding_window_view(padded, _KERNELS.shape[1])[::DOWN]
    return (taps @ _KERNELS.T).reshape(-1)[:count].astype(np.float32)


def prompt_mel(wav16k: Any, f_max: float = F_MAX) -> Any:
    """[frames, 80] log-mel of a 16 kHz reference, at 24 kHz and 50 frames per second, up to
    ``f_max`` (the release's: :func:`check_release`)."""
    if f_max not in _BANKS:
        raise ValueError(f"no mel filterbank up to {f_max} Hz (known: {sorted(_BANKS)})")
    return log_mel(resample_to_24k(wav16k), f_max, f"reference audio of {len(wav16k)} samples")


def log_mel(wav24k: Any, f_max: float = F_MAX, what: str = "audio") -> Any:
    """[frames, 80] log-mel of 24 kHz audio (the ``feat_extractor``'s), up to ``f_max``."""
    if f_max not in _BANKS:
        raise ValueError(f"no mel filterbank up to {f_max} Hz (known: {sorted(_BANKS)})")
    wav = np.asarray(wav24k, dtype=np.float32).reshape(-1)
    pad = (N_FFT - HOP) // 2
    if len(wav) <= pad:
        raise ValueError(f"{what} is too short")
    wav = np.pad(wav, (pad, pad), mode="reflect")
    frames = 1 + (len(wav) - N_FFT) // HOP
    if frames < 1:
        raise ValueError(f"{what} is too short")
    index = np.arange(N_FFT)[None, :] + HOP * np.arange(frames)[:, None]
    spectrum = np.fft.rfft(wav[index] * _WINDOW, axis=1)
    magnitude = np.sqrt(np.abs(spectrum) ** 2 + 1e-9)
    mel = magnitude.astype(np.float32) @ _BANKS[f_max].T
    return np.log(np.maximum(mel, 1e-5)).astype(np.float32)


EXPECTED = {
    "n_fft": str(N_FFT),
    "num_mels": str(MELS),
    "sampling_rate": str(SAMPLE_RATE),
    "hop_size": str(HOP),
    "win_size": str(N_FFT),
    "fmin": "0",
    "fmax": str(int(F_MAX)),
    "center": "False",
}


def check_release(yaml_text: str) -> float:
    """The ``f_max`` of :func:`prompt_mel` for this release: 8000 Hz where its
    ``feat_extractor`` says 8000 (CosyVoice2), Nyquist where it says ``null`` (CosyVoice3).
    Refuses a release whose ``feat_extractor`` (the prompt mel the flow was trained on)
    differs otherwise from what :func:`prompt_mel` computes. Reads the entry's one-line values
    from the yaml's text (``!ref <sample_rate>`` resolved from the top-level scalar) without
    building anything."""
    scalars: dict[str, str] = {}
    feat: dict[str, str] = {}
    found = inside = False
    for line in yaml_text.splitlines():
        if line and not line[0].isspace() and ":" in line:
            key, value = (part.strip() for part in line.split(":", 1))
            inside = key == "feat_extractor"
            found |= inside
            scalars[key] = value.split("#", 1)[0].strip()
        elif inside and ":" in line:
            key, value = (part.strip() for part in line.split(":", 1))
            feat[key] = value.split("#", 1)[0].strip()
    if not found:
        raise ValueError("the release's yaml has no feat_extractor entry")
    resolved = {}
    for key, value in feat.items():
        if value.startswith("!ref <") and value.endswith(">"):
            value = scalars.get(value[len("!ref <") : -1], value)
        resolved[key] = value
    no_f_max = resolved.get("fmax") in NO_F_MAX
    if no_f_max:
        resolved["fmax"] = EXPECTED["fmax"]
    wrong = {k: resolved.get(k) for k, v in EXPECTED.items() if resolved.get(k) != v}
    if wrong:
        raise ValueError(f"the release's feat_extractor differs from the prompt mel here: {wrong}")
    return NYQUIST if no_f_max else F_MAX
