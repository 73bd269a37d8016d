"""The pure pieces of the project's model code: the chunk schedule, the speaker cache, the
prompt features, the device choice (no torch, no Triton)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cosyvoice_serving_models import device, features
from cosyvoice_serving_models.chunking import Chunking
from cosyvoice_serving_models.speakers import SpeakerCache, speaker_key


def test_upstreams_schedule_by_default_and_first_chunk_tokens_honoured() -> None:
    assert Chunking().schedule(200) == [(0, 15), (15, 40), (40, 90), (90, 190), (190, 200)]
    assert Chunking(first=5).schedule(60) == [(0, 5), (5, 30), (30, 60)]
    assert Chunking(first=10, strategy="equal").schedule(32) == [(0, 10), (10, 20), (20, 32)]
    # a stream shorter than the first chunk and its look-ahead: one finalized chunk
    assert Chunking().schedule(17) == [(0, 17)]
    with pytest.raises(ValueError):
        Chunking(strategy="linear")


def test_speaker_key_is_the_audio_and_the_text() -> None:
    a = np.zeros(16000, dtype=np.float32)
    b = a.copy()
    b[5] = 0.5
    assert speaker_key(a, "hello") == speaker_key(a.copy(), "hello")
    assert speaker_key(a, "hello") != speaker_key(b, "hello")  # another voice, same text
    assert speaker_key(a, "hello") != speaker_key(a, "hullo")  # same voice, another text
    assert speaker_key(a, "") != speaker_key(b, "")  # no text at all


def test_speaker_cache_is_bounded_and_least_recently_used() -> None:
    cache: SpeakerCache[int] = SpeakerCache(entries=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)  # evicts b, the least recently used
    assert cache.get("b") is None
    assert (cache.get("a"), cache.get("c"), len(cache)) == (1, 3, 2)


def test_prompt_mel_has_50_frames_per_second_and_80_bins() -> None:
    wav = np.sin(np.arange(32000, dtype=np.float32) / 7.0)  # 2 s at 16 kHz
    mel = features.prompt_mel(wav)
    assert mel.shape == (100, 80) and mel.dtype == np.float32
    assert np.isfinite(mel).all()
    bank = features.mel_filterbank()
    assert bank.shape == (80, 961) and (bank >= 0).all()
    assert bank[:, np.fft.rfftfreq(1920, 1 / 24000) > 8000].max() == 0  # fmax 8 kHz


def test_device_is_the_one_triton_assigns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = {"model_instance_kind": "GPU", "model_instance_device_id": "3"}
    assert device.assigned_device(gpu, cuda_available=True) == "cuda:3"
    assert device.assigned_device({"model_instance_kind": "CPU"}, cuda_available=True) == "cpu"
    with pytest.raises(RuntimeError, match="no CUDA"):
        device.assigned_device(gpu, cuda_available=False)
    monkeypatch.setenv(device.RECORD_DIR_ENV, str(tmp_path))
    device.record({**gpu, "model_instance_name": "token2wav_0_1"}, "cuda:3")
    entry = json.loads((tmp_path / "token2wav_0_1.json").read_text())
    assert (entry["device_id"], entry["device"]) == ("3", "cuda:3")


def test_a_release_whose_prompt_mel_differs_is_refused() -> None:
    from cosyvoice_serving_models.tiny_release import YAML

    features.check_release(YAML)
    entry = YAML.index("feat_extractor:")
    other = YAML[:entry] + YAML[entry:].replace("hop_size: 480", "hop_size: 256", 1)
    with pytest.raises(ValueError, match="hop_size"):
        features.check_release(other)
    with pytest.raises(ValueError, match="no feat_extractor"):
        features.check_release(YAML.replace("feat_extractor:", "other_extractor:"))


def test_cosyvoice3s_prompt_mel_goes_up_to_nyquist() -> None:
    """CosyVoice3's release yaml says ``fmax: null`` (upstream's CosyVoice3 orchestrator
    computes its prompt mel with ``fmax=None``): accepted, and the mel then spans 0-12 kHz;
    CosyVoice2's says 8000."""
    from cosyvoice_serving_models.tiny_release import YAML

    assert features.check_release(YAML) == 8000.0
    cosyvoice3 = YAML.replace("    fmax: 8000\n", "    fmax: null\n")
    assert cosyvoice3 != YAML
    assert features.check_release(cosyvoice3) == 12000.0
    wav = np.random.default_rng(3).standard_normal(16000).astype(np.float32)
    low, full = features.prompt_mel(wav), features.prompt_mel(wav, 12000.0)
    assert low.shape == full.shape == (50, 80)
    assert np.abs(low - full).max() > 0.1
    bank = features.mel_filterbank(f_max=12000.0)
    assert bank[:, np.fft.rfftfreq(1920, 1 / 24000) > 8000].max() > 0
    with pytest.raises(ValueError, match="fmax"):
        features.check_release(YAML.replace("    fmax: 8000\n", "    fmax: 11000\n"))


def test_llm_groups_least_loaded_across_holders(tmp_path: Path) -> None:
    from cosyvoice_serving_models.llm_groups import LeastLoaded

    urls = ["http://127.0.0.1:8010/v1", "http://127.0.0.1:8011/v1"]
    a, b = LeastLoaded(urls, str(tmp_path)), LeastLoaded(urls, str(tmp_path))  # two processes
    with a.slot() as first, b.slot() as second, a.slot() as third:
        assert (first, second, third) == (urls[0], urls[1], urls[0])
        assert b.counts() == [2, 1]
        with b.slot() as fourth:
            assert fourth == urls[1]
    assert a.counts() == [0, 0]
    with pytest.raises(RuntimeError), a.slot():
        raise RuntimeError("a failed stream gives its slot back too")
    assert a.counts() == [0, 0]


def test_each_cosyvoice3_model_keeps_only_its_entry_of_the_release_yaml() -> None:
    """CosyVoice3's token2wav builds the ``flow`` entry, its vocoder the ``hift`` entry: the
    LLM, the other network, the seeds and the feature extractor are left out, the one-line
    scalars they may ``!ref`` are kept."""
    from cosyvoice_serving_models.token2wav import release_yaml_entries

    release = (
        "__set_seed3: !apply:torch.manual_seed [1986]\n"
        "sample_rate: 24000\n"
        "chunk_size: 25 # streaming inference chunk size, in token\n"
        "llm: !new:cosyvoice.llm.llm.CosyVoice3LM\n"
        "    llm: !new:cosyvoice.llm.llm.Qwen2Encoder\n"
        "        pretrain_path: !ref <qwen_pretrain_path>\n"
        "flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT\n"
        "    static_chunk_size: !ref <chunk_size> * 2\n"
        "hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator\n"
        "    sampling_rate: !ref <sample_rate>\n"
        "feat_extractor: !name:matcha.utils.audio.mel_spectrogram\n"
        "    n_fft: 1920\n"
    )
    flow = release_yaml_entries(release, ("flow",))
    hift = release_yaml_entries(release, ("hift",))
    for kept in (flow, hift):
        assert "sample_rate: 24000" in kept and "chunk_size: 25" in kept
        assert "llm" not in kept and "seed" not in kept and "feat_extractor" not in kept
    assert "CausalMaskedDiffWithDiT" in flow and "CausalHiFTGenerator" not in flow
    assert "CausalHiFTGenerator" in hift and "CausalMaskedDiffWithDiT" not in hift
    with pytest.raises(ValueError, match="no hift entry"):
        release_yaml_entries(release.replace("hift:", "vocoder:"), ("hift",))
