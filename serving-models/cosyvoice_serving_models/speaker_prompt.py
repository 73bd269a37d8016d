"""The default speaker's prompt features, computed once by the engine builder (issue 19, item 5).

``python -m cosyvoice_serving_models.speaker_prompt --model-dir DIR --variant V --audio WAV
--transcript-file TXT --out FILE.npz`` is the tool of the builder's ``speaker`` step
(``engine-builder/README.md``). It writes what upstream's ``add_zero_shot_spk`` keeps in
``spk2info.pt`` for one speaker, in :mod:`.speakers`' NumPy form, computed by the same code
the serving pod runs for a request's reference audio, so the default speaker is exactly what
a request that sends this recording (and the transcript as its reference text) gets:

- the speech tokens: :mod:`.speech_tokenizer` (the ``audio_tokenizer`` model's code:
  ``s3tokenizer`` on the release's ``speech_tokenizer_v2.onnx`` / ``_v3.onnx``);
- the speaker embedding: :mod:`.speaker_embedding` (the ``speaker_embedding`` model's: Kaldi
  fbank into the release's ``campplus.onnx`` in ONNX Runtime), float16 as that model returns it;
- the prompt mel: :func:`.features.prompt_mel` (the orchestrators'), after the release's
  ``feat_extractor`` is checked against it.

On the CPU: one recording, once per build. The WAV is PCM (8, 16, 24 or 32-bit integers), any
sample rate (brought to 16 kHz with torchaudio's resampler, as upstream's ``load_wav``),
channels mixed to mono, 1 to 30 seconds.
"""

from __future__ import annotations

import argparse
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np

from cosyvoice_serving_models import features, speakers

YAMLS = {"cosyvoice2": "cosyvoice2.yaml", "cosyvoice3": "cosyvoice3.yaml"}
MIN_SECONDS, MAX_SECONDS = 1.0, 30.0  # upstream's speech tokenizer refuses prompts over 30 s


def read_wav(path: Path) -> tuple[Any, int]:
    """(mono float32 samples in [-1, 1), sample rate) of a PCM WAV file."""
    try:
        with wave.open(str(path), "rb") as wav:
            width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            raw = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"{path}: not a PCM WAV file ({exc})") from exc
    if width == 1:
        samples = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 3:
        bytes3 = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        ints = bytes3[:, 0] | (bytes3[:, 1] << 8) | (bytes3[:, 2] << 16)
        samples = (np.where(ints >= 1 << 23, ints - (1 << 24), ints) / float(1 << 23)).astype(
            np.float32
        )
    else:
        dtype = {2: "<i2", 4: "<i4"}[width]
        samples = np.frombuffer(raw, dtype=dtype).astype(np.float32) / float(1 << (8 * width - 1))
    return samples.reshape(-1, channels).mean(axis=1).astype(np.float32), rate


def load_16k(path: Path) -> Any:
    """The recording at 16 kHz, mono, float32; ValueError when it is too short or long."""
    samples, rate = read_wav(path)
    if rate != features.REFERENCE_RATE:
        import torch  # type: ignore[import-not-found]
        import torchaudio.functional  # type: ignore[import-not-found]

        resampled = torchaudio.functional.resample(
            torch.from_numpy(samples), rate, features.REFERENCE_RATE
        )
        samples = resampled.numpy().astype(np.float32)
    seconds = samples.shape[0] / features.REFERENCE_RATE
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise ValueError(
            f"{path}: {seconds:.1f} s of audio; a speaker's reference must be "
            f"{MIN_SECONDS:g}-{MAX_SECONDS:g} s"
        )
    return samples


def compute(model_dir: Path, variant: str, wav: Any, transcript: str) -> speakers.Prompt:
    from cosyvoice_serving_models import speaker_embedding, speech_tokenizer

    f_max = features.check_release((model_dir / YAMLS[variant]).read_text())
    tokenizer = speech_tokenizer.load(model_dir / speech_tokenizer.SPEECH_TOKENIZER[variant], "cpu")
    [tokens] = speech_tokenizer.tokenize(tokenizer, [wav], "cpu")
    network = speaker_embedding.session(str(model_dir / "campplus.onnx"), "cpu")
    embedding = speaker_embedding.embed(network, wav)
    return speakers.aligned(transcript, tokens, features.prompt_mel(wav, f_max), embedding)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speaker_prompt", description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--variant", choices=sorted(YAMLS), required=True)
    parser.add_argument("--audio", type=Path, required=True)
    parser.add_argument("--transcript-file", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    transcript = args.transcript_file.read_text(encoding="utf-8")
    try:
        prompt = compute(args.model_dir, args.variant, load_16k(args.audio), transcript)
    except (OSError, ValueError) as exc:
        print(f"speaker_prompt: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(args.out.name + ".partial")
    speakers.save_prompt(partial, prompt)
    partial.replace(args.out)
    print(
        f"speaker_prompt: {args.out}: {prompt.speech_tokens.size} speech tokens, "
        f"{prompt.speech_feat.shape[0]} mel frames, embedding of {prompt.embedding.size}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
