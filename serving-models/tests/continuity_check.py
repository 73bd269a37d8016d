"""Run by ``test_upstream_library.py`` under the interpreter that has torch and upstream's library
(Debian's python3 with the twin's upstream site folder on ``PYTHONPATH``).

    continuity_check.py RELEASE_DIR

Prints one JSON object: a stream of speech tokens synthesised (a) chunk by chunk by our
``Token2Wav``, its chunks alternating between two engines (two instances) with the vocoder
state carried between them as NumPy, and (b) by upstream's library itself,
``CosyVoice2Model.token2wav`` in streaming mode with the state kept in-process under one
uuid: one continuous synthesis of the stream. The random source of HiFT is seeded the same
before every chunk of both. Also (c): the offline synthesis of all tokens at once.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from cosyvoice_serving_models.chunking import LOOKAHEAD_TOKENS, Chunking
from cosyvoice_serving_models.token2wav import Token2Wav


def main(release: Path) -> None:
    from cosyvoice.cli.model import CosyVoice2Model  # upstream's library

    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 6561, size=120).astype(np.int32)
    prompt_tokens = rng.integers(0, 6561, size=20).astype(np.int32)
    prompt_feat = rng.standard_normal((40, 80)).astype(np.float32)
    embedding = rng.standard_normal(192).astype(np.float32)
    schedule = Chunking(first=15, strategy="exponential").schedule(len(tokens))

    engines = [Token2Wav(release, "cpu"), Token2Wav(release, "cpu")]
    ours, state = [], None
    for index, (offset, end) in enumerate(schedule):
        finalize = index == len(schedule) - 1
        window = tokens if finalize else tokens[: end + LOOKAHEAD_TOKENS]
        torch.manual_seed(index)
        audio, state = engines[index % 2].synthesize(
            window, prompt_tokens, prompt_feat, embedding, offset, finalize, state
        )
        ours.append(audio)

    reference = Token2Wav(release, "cpu")
    model = CosyVoice2Model(None, reference.flow, reference.hift, fp16=False)
    model.hift_cache_dict["s"] = None
    theirs = []
    for index, (offset, end) in enumerate(schedule):
        finalize = index == len(schedule) - 1
        window = tokens if finalize else tokens[: end + LOOKAHEAD_TOKENS]
        torch.manual_seed(index)
        speech = model.token2wav(
            token=torch.from_numpy(window).reshape(1, -1),
            prompt_token=torch.from_numpy(prompt_tokens).reshape(1, -1),
            prompt_feat=torch.from_numpy(prompt_feat).reshape(1, -1, 80),
            embedding=torch.from_numpy(embedding).reshape(1, -1),
            token_offset=offset,
            uuid="s",
            stream=True,
            finalize=finalize,
        )
        theirs.append(speech[0].numpy())
    torch.manual_seed(0)
    offline, _ = reference.synthesize(
        tokens, prompt_tokens, prompt_feat, embedding, None, True, None
    )
    a, b = np.concatenate(ours), np.concatenate(theirs)
    print(
        json.dumps(
            {
                "chunks": [len(x) for x in ours],
                "reference_chunks": [len(x) for x in theirs],
                "samples": len(a),
                "reference_samples": len(b),
                "offline_samples": len(offline),
                "tokens": len(tokens),
                "max_abs_difference": float(np.max(np.abs(a - b))),
                "peak": float(np.max(np.abs(b))),
                "built": sorted(
                    name for name in ("flow", "hift", "llm") if hasattr(reference, name)
                ),
            }
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
