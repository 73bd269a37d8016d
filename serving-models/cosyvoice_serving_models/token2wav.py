"""CosyVoice2's token2wav on upstream's library: the flow (speech tokens -> mel) and HiFT
(mel -> 24 kHz audio), built from the release's ``cosyvoice2.yaml``, ``flow.pt`` and
``hift.pt`` alone.

Only the ``flow`` and ``hift`` entries of the yaml are built (with the top-level scalars they
refer to): not the LLM, whose construction loads a whole Qwen2 from ``CosyVoice-BlankEN``,
nor the tokenizer, the data pipeline or the GAN losses.

A stream's vocoder state (the last 8 mel frames, the matching excitation source and the
last 160 ms of audio, withheld for the cross-fade with the next chunk) is not kept here: it
is returned with each chunk's audio and given back with the next chunk (:class:`HiftState`),
so any instance can serve any chunk. The algorithm is upstream's streaming token2wav
(``CosyVoice2Model.token2wav``); ``tests/serving_models`` checks that a stream served chunk by
chunk by two different engines equals upstream's own in-process synthesis of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MEL_CACHE_FRAMES = 8
SAMPLES_PER_MEL_FRAME = 480
SOURCE_CACHE_SAMPLES = MEL_CACHE_FRAMES * SAMPLES_PER_MEL_FRAME
BUILT = ("flow", "hift")
# The flow's longest input, in mel frames: a prompt of up to 10 s (250 tokens) and the 750
# speech tokens upstream's LLM may generate at most, 2 frames each.
MAX_FLOW_FRAMES = 2 * (250 + 750)


def release_yaml_entries(text: str, built: tuple[str, ...]) -> str:
    """The part of a release's hyperpyyaml that builds the top-level entries ``built``: their
    blocks and every one-line top-level scalar (which ``!ref`` may name). Entries with a tag
    (``!new``, ``!name``, ``!apply``: the LLM, the tokenizer, the feature extractor, the seeds)
    are left out, so nothing else is imported or built."""
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#") and ":" in line:
            blocks.append((line.split(":", 1)[0].strip(), [line]))
        elif blocks:
            blocks[-1][1].append(line)
    kept: list[str] = []
    for key, lines in blocks:
        value = lines[0].split(":", 1)[1].split("#", 1)[0].strip()
        body = [b for b in lines[1:] if b.strip() and not b.lstrip().startswith("#")]
        if key in built or (value and not value.startswith("!") and not body):
            kept.extend(lines)
    missing = [k for k in built if not any(line.startswith(f"{k}:") for line in kept)]
    if missing:
        raise ValueError(f"the release's yaml has no {', '.join(missing)} entry")
    return "\n".join(kept) + "\n"


def flow_and_hift_yaml(text: str) -> str:
    """CosyVoice2's token2wav: the ``flow`` and ``hift`` entries (:func:`release_yaml_entries`)."""
    return release_yaml_entries(text, BUILT)


def estimator_plan(manifest: str, plans_dir: str) -> str:
    """The flow estimator's prebuilt TensorRT plan the engine's manifest names
    (``layout.flowEstimatorPlan`` under ``plans_dir``); empty when there is none."""
    import json

    try:
        with open(manifest) as f:
            layout = json.load(f).get("layout", {})
    except FileNotFoundError:
        return ""
    name = layout.get("flowEstimatorPlan", "")
    return str(Path(plans_dir) / name) if name else ""


@dataclass
class HiftState:
    """What the next chunk of a stream needs from this one (NumPy, host memory)."""

    mel: Any  # [80, 8] float32
    source: Any  # [3840] float32
    speech: Any  # [3840] float32


class Token2Wav:
    """flow + HiFT of one release on one device (``cpu`` or ``cuda:<i>``)."""

    def __init__(
        self,
        model_dir: str | Path,
        device: str,
        yaml_name: str = "cosyvoice2.yaml",
        graphs: bool = True,
    ):
        import torch
        from hyperpyyaml import load_hyperpyyaml  # type: ignore[import-not-found]

        model_dir = Path(model_dir)
        configs = load_hyperpyyaml(flow_and_hift_yaml((model_dir / yaml_name).read_text()))
        self.torch = torch
        self.device = torch.device(device)
        self.flow = configs["flow"]
        self.hift = configs["hift"]
        flow_state = torch.load(model_dir / "flow.pt", map_location="cpu")
        self.flow.load_state_dict(flow_state, strict=True)
        hift_state = torch.load(model_dir / "hift.pt", map_location="cpu")
        self.hift.load_state_dict(
            {k.replace("generator.", ""): v for k, v in hift_state.items()}, strict=True
        )
        self.flow.to(self.device).eval()
        self.hift.to(self.device).eval()
        self.window = np.hamming(2 * SOURCE_CACHE_SAMPLES)
        self.graphed = None
        if graphs and self.device.type == "cuda":
            self.graphed = self._graph_estimator()

    def _graph_estimator(self) -> Any:
        """On a GPU, the flow's estimator runs as CUDA graphs (:mod:`.flow_graphs`): upstream's
        CFM solver calls it unchanged. None when the release's estimator has another layout."""
        from .flow_graphs import GraphedEstimator, graphable

        estimator = self.flow.decoder.estimator
        if not graphable(estimator):
            return None
        # float16, as upstream builds the estimator's TensorRT plan (fp16=True); the encoder
        # and HiFT stay float32, their matrix products in TF32.
        torch = self.torch
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        graphed = GraphedEstimator(estimator, MAX_FLOW_FRAMES, dtype=torch.float16)
        graphed.capture()
        self.flow.decoder.estimator = graphed
        return graphed

    def synthesize(
        self,
        tokens: Any,
        prompt_tokens: Any,
        prompt_feat: Any,
        embedding: Any,
        offset: int | None,
        finalize: bool,
        state: HiftState | None,
    ) -> tuple[Any, HiftState | None]:
        """Audio [S] float32 of ``tokens`` from ``offset`` on (all of them when ``offset`` is
        None: offline), less the look-ahead unless ``finalize``; and the state for the next
        chunk (None once finalized)."""
        from cosyvoice.utils.common import fade_in_out  # type: ignore[import-not-found]

        torch, dev = self.torch, self.device
        stream = offset is not None

        def as_tensor(array: Any, dtype: Any) -> Any:
            return torch.from_numpy(np.ascontiguousarray(array)).to(dev, dtype)

        token = as_tensor(np.asarray(tokens).reshape(1, -1), torch.int32)
        prompt_token = as_tensor(np.asarray(prompt_tokens).reshape(1, -1), torch.int32)
        feat = as_tensor(
            np.asarray(prompt_feat, dtype=np.float32).reshape(1, -1, 80), torch.float32
        )
        spk = as_tensor(np.asarray(embedding, dtype=np.float32).reshape(1, -1), torch.float32)

        def length(t: Any) -> Any:
            return torch.tensor([t.shape[1]], dtype=torch.int32, device=dev)

        with torch.inference_mode():
            mel, _ = self.flow.inference(
                token=token,
                token_len=length(token),
                prompt_token=prompt_token,
                prompt_token_len=length(prompt_token),
                prompt_feat=feat,
                prompt_feat_len=length(feat),
                embedding=spk,
                streaming=stream,
                finalize=finalize,
            )
            mel = mel[:, :, (offset or 0) * self.flow.token_mel_ratio :]
            if state is not None:
                mel = torch.concat([as_tensor(state.mel[None], torch.float32), mel], dim=2)
                source = as_tensor(state.source.reshape(1, 1, -1), torch.float32)
            else:
                source = torch.zeros(1, 1, 0, device=dev)
            speech, new_source = self.hift.inference(speech_feat=mel, cache_source=source)
            if state is not None:
                speech = fade_in_out(
                    speech, as_tensor(state.speech[None], torch.float32), self.window
                )
        if finalize:
            return speech[0].float().cpu().numpy(), None
        following = HiftState(
            mel=mel[0, :, -MEL_CACHE_FRAMES:].float().cpu().numpy(),
            source=new_source[0, 0, -SOURCE_CACHE_SAMPLES:].float().cpu().numpy(),
            speech=speech[0, -SOURCE_CACHE_SAMPLES:].float().cpu().numpy(),
        )
        return speech[0, :-SOURCE_CACHE_SAMPLES].float().cpu().numpy(), following
