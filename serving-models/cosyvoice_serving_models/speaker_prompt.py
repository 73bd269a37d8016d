"""The default speaker's prompt features, computed once by the engine builder (issue 19, item 5).

``python -m cosyvoice_serving_models.speaker_prompt --model-dir DIR --variant V --audio WAV
--transcript-file TXT --out FILE.npz`` is the tool of the builder's ``speaker`` step
(``engine-builder/README.md``): it runs in the builder image, where upstream's library is
installed, and writes what upstream's ``add_zero_shot_spk`` keeps in ``spk2info.pt`` for one
speaker, in :mod:`.speakers`' NumPy form:

- the speech tokens: upstream's ``CosyVoiceFrontEnd._extract_speech_token`` (Whisper's
  128-bin log-mel into the release's ``speech_tokenizer_v*.onnx``);
- the speaker embedding: ``CosyVoiceFrontEnd._extract_spk_embedding`` (Kaldi fbank into the
  release's ``campplus.onnx``);
- the prompt mel: :func:`.features.prompt_mel`, the same function the orchestrators apply to
  a request's reference audio (checked against the release's ``feat_extractor``).

The two frontend methods are called unbound, on an object that holds only the two ONNX
sessions they read, so neither the text frontend nor the LLM tokenizer is built.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from cosyvoice_serving_models import features, speakers

TOKENIZERS = {"cosyvoice2": "speech_tokenizer_v2.onnx", "cosyvoice3": "speech_tokenizer_v3.onnx"}
YAMLS = {"cosyvoice2": "cosyvoice2.yaml", "cosyvoice3": "cosyvoice3.yaml"}
MIN_SECONDS, MAX_SECONDS = 1.0, 30.0  # upstream's speech tokenizer refuses prompts over 30 s


def load_16k(path: Path) -> Any:
    """The audio as a [1, samples] float tensor at 16 kHz, mono."""
    import torchaudio  # type: ignore[import-not-found]

    wav, rate = torchaudio.load(str(path))
    wav = wav.mean(dim=0, keepdim=True)
    if rate != features.REFERENCE_RATE:
        wav = torchaudio.transforms.Resample(rate, features.REFERENCE_RATE)(wav)
    seconds = wav.shape[1] / features.REFERENCE_RATE
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise ValueError(
            f"{path}: {seconds:.1f} s of audio; a speaker's reference must be "
            f"{MIN_SECONDS:g}-{MAX_SECONDS:g} s"
        )
    return wav


def compute(model_dir: Path, variant: str, audio: Path, transcript: str) -> speakers.Prompt:
    import onnxruntime  # type: ignore[import-not-found]
    import torch  # type: ignore[import-not-found]
    from cosyvoice.cli.frontend import CosyVoiceFrontEnd  # type: ignore[import-not-found]

    features.check_release((model_dir / YAMLS[variant]).read_text())
    option = onnxruntime.SessionOptions()
    option.intra_op_num_threads = 1
    cpu = ["CPUExecutionProvider"]
    frontend = SimpleNamespace(
        device=torch.device("cpu"),
        speech_tokenizer_session=onnxruntime.InferenceSession(
            str(model_dir / TOKENIZERS[variant]), sess_options=option, providers=cpu
        ),
        campplus_session=onnxruntime.InferenceSession(
            str(model_dir / "campplus.onnx"), sess_options=option, providers=cpu
        ),
    )
    wav = load_16k(audio)
    tokens, _ = CosyVoiceFrontEnd._extract_speech_token(frontend, wav)
    embedding = CosyVoiceFrontEnd._extract_spk_embedding(frontend, wav)
    mel = features.prompt_mel(wav.numpy())
    return speakers.aligned(
        transcript, tokens.cpu().numpy(), mel, embedding.cpu().numpy().astype(np.float32)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speaker_prompt", description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--variant", choices=sorted(TOKENIZERS), required=True)
    parser.add_argument("--audio", type=Path, required=True)
    parser.add_argument("--transcript-file", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    transcript = args.transcript_file.read_text(encoding="utf-8")
    try:
        prompt = compute(args.model_dir, args.variant, args.audio, transcript)
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
