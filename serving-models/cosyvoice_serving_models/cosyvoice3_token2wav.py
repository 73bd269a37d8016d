"""CosyVoice3's two audio models on upstream's library: the flow (speech tokens -> mel, its
``CausalMaskedDiffWithDiT``) for ``token2wav`` and the causal HiFT (mel -> 24 kHz audio, its
``CausalHiFTGenerator``) for ``vocoder``, each built from the release's ``cosyvoice3.yaml``
and its own checkpoint alone (``flow.pt``, ``hift.pt``): one network per model, never the LLM
(a Qwen2 from ``CosyVoice-BlankEN``), the tokenizer or the other entries.

Neither keeps anything between requests. A stream's state is what the orchestrator sends
back: token2wav gets the stream's tokens so far and the offset of the chunk, and returns the
mel from there; the vocoder gets the stream's mel so far and returns all of its audio, of
which the orchestrator sends the part not sent yet (upstream's ``CosyVoice3Model.token2wav``
does the same in-process: ``hift_cache_dict[uuid]`` holds the mel and the speech offset).

What would make the audio depend on the instance is the vocoder's excitation: the causal
``SineGen2`` and ``SourceModuleHnNSF`` draw their initial phases and noise tables
(``rand_ini``, ``sine_waves``, ``uv``: 300 s of samples, plain attributes, not in the
checkpoint) from torch's generator when they are built. Upstream seeds it at the top of the
yaml (``torch.manual_seed(1986)``) and builds the LLM and the flow first, so its tables are
whatever that sequence leaves. Built alone, each instance would draw its own, and a stream
whose chunks go to different instances would change its noise and harmonic phases at every
switch. :class:`Vocoder` therefore builds HiFT under a fixed seed (in a forked generator,
leaving the process's own untouched): every instance, in every process, has the same tables,
and a stream's audio is the same whichever instances serve its chunks.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from .token2wav import release_yaml_entries

YAML = "cosyvoice3.yaml"
MEL_BINS = 80
# The seed upstream's yaml sets before it builds anything (``__set_seed3``).
EXCITATION_SEED = 1986


def _checkpoint(path: Path) -> dict[str, Any]:
    import torch

    state: dict[str, Any] = torch.load(path, map_location="cpu")
    return state


class Token2Mel:
    """CosyVoice3's flow of one release on one device (``cpu`` or ``cuda:<i>``)."""

    def __init__(self, model_dir: str | Path, device: str, yaml_name: str = YAML):
        import torch
        from hyperpyyaml import load_hyperpyyaml  # type: ignore[import-not-found]

        model_dir = Path(model_dir)
        configs = load_hyperpyyaml(
            release_yaml_entries((model_dir / yaml_name).read_text(), ("flow",))
        )
        self.torch = torch
        self.device = torch.device(device)
        self.flow = configs["flow"]
        self.flow.load_state_dict(_checkpoint(model_dir / "flow.pt"), strict=True)
        self.flow.to(self.device).eval()

    def mel(
        self,
        tokens: Any,
        prompt_tokens: Any,
        prompt_feat: Any,
        embedding: Any,
        offset: int | None,
        finalize: bool,
    ) -> Any:
        """Mel [80, T] float32 of ``tokens`` from ``offset`` on (all of them when ``offset`` is
        None: offline), less the look-ahead unless ``finalize``. A streamed chunk runs the flow
        in streaming mode (its chunk mask), as upstream's library does for every chunk of a
        stream, the last included."""
        torch, dev = self.torch, self.device

        def as_tensor(array: Any, dtype: Any, shape: tuple[int, ...]) -> Any:
            return torch.from_numpy(np.ascontiguousarray(np.asarray(array).reshape(shape))).to(
                dev, dtype
            )

        token = as_tensor(tokens, torch.int32, (1, -1))
        prompt_token = as_tensor(prompt_tokens, torch.int32, (1, -1))
        feat = as_tensor(np.asarray(prompt_feat, dtype=np.float32), torch.float32, (1, -1, 80))
        spk = as_tensor(np.asarray(embedding, dtype=np.float32), torch.float32, (1, -1))

        def length(t: Any) -> Any:
            return torch.tensor([t.shape[1]], dtype=torch.int32, device=dev)

        # On a GPU in float16 autocast, as upstream's library runs the flow with fp16 on.
        cast = (
            torch.autocast(device_type="cuda", dtype=torch.float16)
            if dev.type == "cuda"
            else nullcontext()
        )
        with torch.inference_mode(), cast:
            mel, _ = self.flow.inference(
                token=token,
                token_len=length(token),
                prompt_token=prompt_token,
                prompt_token_len=length(prompt_token),
                prompt_feat=feat,
                prompt_feat_len=length(feat),
                embedding=spk,
                streaming=offset is not None,
                finalize=finalize,
            )
        mel = mel[0, :, (offset or 0) * self.flow.token_mel_ratio :]
        return np.ascontiguousarray(mel.float().cpu().numpy())


class Vocoder:
    """CosyVoice3's causal HiFT of one release on one device, its excitation tables the same
    in every instance (:data:`EXCITATION_SEED`)."""

    def __init__(self, model_dir: str | Path, device: str, yaml_name: str = YAML):
        import torch
        from hyperpyyaml import load_hyperpyyaml

        model_dir = Path(model_dir)
        text = release_yaml_entries((model_dir / yaml_name).read_text(), ("hift",))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(EXCITATION_SEED)
            self.hift = load_hyperpyyaml(text)["hift"]
        self.torch = torch
        self.device = torch.device(device)
        state = _checkpoint(model_dir / "hift.pt")
        self.hift.load_state_dict(
            {k.replace("generator.", ""): v for k, v in state.items()}, strict=True
        )
        self.hift.to(self.device).eval()

    def speech(self, mel: Any, finalize: bool) -> Any:
        """Audio [S] float32 of a stream's mel so far ([80, T]); unless ``finalize``, less the
        samples its look-ahead still changes."""
        torch = self.torch
        feat = np.ascontiguousarray(np.asarray(mel, dtype=np.float32).reshape(1, MEL_BINS, -1))
        with torch.inference_mode():
            speech, _ = self.hift.inference(
                speech_feat=torch.from_numpy(feat).to(self.device), finalize=finalize
            )
        return speech.reshape(-1).float().cpu().numpy()
