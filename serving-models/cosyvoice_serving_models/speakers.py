"""The orchestrator's speaker cache: prompt features per reference, on the CPU, bounded."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np

V = TypeVar("V")

DEFAULT_ENTRIES = 64


def speaker_key(reference_wav: Any, reference_text: str) -> str:
    """SHA-256 of the reference audio's samples and of its text: two voices that read the same
    text are two entries, and so are two texts read by one voice."""
    digest = hashlib.sha256()
    digest.update(memoryview(reference_wav.astype("<f4").tobytes()))
    digest.update(b"\0")
    digest.update(reference_text.encode("utf-8"))
    return digest.hexdigest()


class SpeakerCache(Generic[V]):
    """Least-recently-used, at most ``entries`` speakers (values are NumPy arrays: host
    memory, no device tensor kept between requests)."""

    def __init__(self, entries: int = DEFAULT_ENTRIES) -> None:
        if entries < 1:
            raise ValueError("a speaker cache holds at least one entry")
        self.entries = entries
        self._items: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: str) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: str, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.entries:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


# The default speaker's file (issue 19, item 5): what the engine builder computes from the
# audio and transcript of spec.speakers.default (``speaker_prompt.py``), one speaker's prompt
# features under the names of upstream's spk2info entries, as NumPy arrays (no pickle, no
# torch: the orchestrator reads it with NumPy alone). Shapes: speech tokens [n] int32, the
# prompt mel [2n, 80] float32 (the flow's 50 Hz frames, two per 25 Hz token), the speaker
# embedding [192] float32, the transcript a 0-d unicode array.
PROMPT_FIELDS = ("prompt_text", "flow_prompt_speech_token", "prompt_speech_feat", "flow_embedding")


class Prompt(NamedTuple):
    text: str
    speech_tokens: Any  # [n] int32
    speech_feat: Any  # [2n, 80] float32
    embedding: Any  # [192] float32

    def as_request_inputs(self) -> tuple[Any, Any, Any]:
        """(tokens [1, n] int32, mel [1, 2n, 80] float16, embedding [1, 192] float16): what
        the orchestrators pass to token2wav for a speaker."""
        return (
            self.speech_tokens.astype(np.int32).reshape(1, -1),
            self.speech_feat[None].astype(np.float16),
            self.embedding.astype(np.float16).reshape(1, -1),
        )


def aligned(text: str, tokens: Any, feat: Any, embedding: Any) -> Prompt:
    """A prompt with tokens and mel cut to the same length (upstream's frontend does the same
    for CosyVoice2 and 3: ``token_len = min(feat_len // 2, token_len)``)."""
    tokens = np.asarray(tokens).reshape(-1)
    feat = np.asarray(feat, dtype=np.float32).reshape(-1, np.asarray(feat).shape[-1])
    count = min(feat.shape[0] // 2, tokens.shape[0])
    return Prompt(
        text,
        tokens[:count].astype(np.int32),
        feat[: 2 * count],
        np.asarray(embedding, dtype=np.float32).reshape(-1),
    )


def save_prompt(path: Path, prompt: Prompt) -> None:
    with path.open("wb") as out:
        np.savez(
            out,
            prompt_text=np.array(prompt.text),
            flow_prompt_speech_token=prompt.speech_tokens.astype(np.int32),
            prompt_speech_feat=prompt.speech_feat.astype(np.float32),
            flow_embedding=prompt.embedding.astype(np.float32),
        )


def load_prompt(path: Path) -> Prompt:
    """The default speaker's file; ValueError naming the file when it is not one."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in PROMPT_FIELDS if name in data.files}
    except (OSError, EOFError, ValueError) as exc:  # ValueError: not an .npz (pickled data)
        raise ValueError(f"{path}: cannot read the default speaker: {exc}") from exc
    missing = [name for name in PROMPT_FIELDS if name not in arrays]
    if missing:
        raise ValueError(f"{path}: not a speaker prompt file (no {', '.join(missing)})")
    prompt = aligned(
        str(arrays["prompt_text"]),
        arrays["flow_prompt_speech_token"],
        arrays["prompt_speech_feat"],
        arrays["flow_embedding"],
    )
    if prompt.speech_tokens.size == 0 or prompt.speech_feat.shape[1] != 80:
        raise ValueError(
            f"{path}: the default speaker has {prompt.speech_tokens.size} speech tokens and "
            f"{prompt.speech_feat.shape[1]} mel bins (needs at least one token and 80 bins)"
        )
    return prompt
