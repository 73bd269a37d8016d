"""The default speaker's pieces that need no library (issue 19, item 5): the speaker file's
NumPy form (``speakers.save_prompt`` / ``load_prompt``) and the builder tool's WAV reading
(``speaker_prompt.read_wav`` / ``load_16k``). The tool's computation itself runs with
upstream's library in ``serving-models/tests/test_default_speaker.py``."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from cosyvoice_serving_models import speaker_prompt, speakers


def test_a_prompt_round_trips_cut_to_two_mel_frames_per_token(tmp_path: Path) -> None:
    prompt = speakers.aligned(
        "Hi there.", np.arange(50), np.ones((80, 80), dtype=np.float32), np.zeros(192)
    )
    assert prompt.speech_tokens.size == 40 and prompt.speech_feat.shape == (80, 80)
    speakers.save_prompt(tmp_path / "s.npz", prompt)
    back = speakers.load_prompt(tmp_path / "s.npz")
    assert back.text == "Hi there."
    assert np.array_equal(back.speech_tokens, prompt.speech_tokens)
    tokens, feat, embedding = back.as_request_inputs()
    assert tokens.shape == (1, 40) and tokens.dtype == np.int32
    assert feat.shape == (1, 80, 80) and feat.dtype == np.float16
    assert embedding.shape == (1, 192) and embedding.dtype == np.float16


def test_a_file_that_is_not_a_speaker_is_refused_naming_it(tmp_path: Path) -> None:
    np.savez(tmp_path / "other.npz", something=np.zeros(3))
    with pytest.raises(ValueError, match=r"other\.npz: not a speaker prompt file"):
        speakers.load_prompt(tmp_path / "other.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"junk\.npz"):
        speakers.load_prompt(tmp_path / "junk.npz")
    empty = speakers.Prompt(
        "x", np.zeros(0, np.int32), np.zeros((0, 80), np.float32), np.zeros(192)
    )
    speakers.save_prompt(tmp_path / "empty.npz", empty)
    with pytest.raises(ValueError, match="0 speech tokens"):
        speakers.load_prompt(tmp_path / "empty.npz")


def _wav(path: Path, frames: bytes, width: int, channels: int, rate: int = 16000) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        out.writeframes(frames)
    return path


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_pcm_of_every_width_reads_as_the_same_samples(tmp_path: Path, width: int) -> None:
    values = np.array([0.0, 0.5, -0.5, -1.0], dtype=np.float64)
    if width == 1:
        frames = (values * 128 + 128).astype(np.uint8).tobytes()
    elif width == 3:
        ints = (values * (1 << 23)).astype(np.int32)
        frames = b"".join(int(i).to_bytes(3, "little", signed=True) for i in ints)
    else:
        frames = (values * (1 << (8 * width - 1))).astype(f"<i{width}").tobytes()
    samples, rate = speaker_prompt.read_wav(_wav(tmp_path / "a.wav", frames, width, 1))
    assert rate == 16000 and samples.dtype == np.float32
    assert np.allclose(samples, values, atol=1e-6)


def test_channels_are_mixed_to_mono(tmp_path: Path) -> None:
    left_right = np.array([[0.5, -0.5], [0.25, 0.25]]) * 32768
    frames = left_right.astype("<i2").tobytes()
    samples, _ = speaker_prompt.read_wav(_wav(tmp_path / "s.wav", frames, 2, 2))
    assert np.allclose(samples, [0.0, 0.25])


def test_a_recording_outside_one_to_thirty_seconds_or_not_a_wav_is_refused(
    tmp_path: Path,
) -> None:
    short = _wav(tmp_path / "short.wav", np.zeros(8000, "<i2").tobytes(), 2, 1)
    with pytest.raises(ValueError, match=r"0\.5 s of audio; a speaker's reference must be 1-30 s"):
        speaker_prompt.load_16k(short)
    (tmp_path / "x.wav").write_bytes(b"ID3 an mp3")
    with pytest.raises(ValueError, match="not a PCM WAV file"):
        speaker_prompt.load_16k(tmp_path / "x.wav")
    assert speaker_prompt.load_16k(
        _wav(tmp_path / "ok.wav", np.zeros(16000, "<i2").tobytes(), 2, 1)
    ).shape == (16000,)
