"""token2wav per chunk on the GPU: upstream's flow and HiFT through our model code
(``cosyvoice_serving_models.token2wav``), the flow's estimator eager vs as CUDA graphs
(``flow_graphs``), on the full-size synthetic release (``full_release.py``).

    python3 token2wav_speed.py RELEASE_DIR > token2wav-speed.json

Per case (a stream's first chunk, a chunk 10 s into a stream, a whole 10-s utterance): the
milliseconds of a whole ``Token2Wav.synthesize`` call (flow + HiFT + the host copies), of
the flow alone, and the largest difference between the eager and graphed flow's mel (the
CFM noise is a fixed buffer, so both see the same inputs).

Issue 32: a third engine, ``cfm``, replays the whole CFM solve as one graph per padded length
(``cfm_graphs.py``), and two floors are timed per case: the estimator's own graph replayed 10
times (the 10 Euler steps with no work around them) and the whole-CFM graph's replay alone
(the flow's time less its encoder and host work).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "build" / "serving-models"))  # pack.py's copy
sys.path.insert(0, str(HERE))

PROMPT_TOKENS = 75  # a 3-s reference
REPEATS = 5


def timed(fn: Any, torch: Any, repeats: int = REPEATS) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(2):
        fn()
    sync()
    began = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return round(1000 * (time.perf_counter() - began) / repeats, 2)


class Case:
    """One token2wav call of a stream, through an engine: all of it, or the flow alone."""

    def __init__(
        self,
        engine: Any,
        tokens: Any,
        prompt: Any,
        feat: Any,
        embedding: Any,
        offset: int | None,
        finalize: bool,
    ) -> None:
        self.engine, self.tokens, self.prompt = engine, tokens, prompt
        self.feat, self.embedding, self.offset, self.finalize = feat, embedding, offset, finalize

    def synthesize(self) -> Any:
        return self.engine.synthesize(
            self.tokens, self.prompt, self.feat, self.embedding, self.offset, self.finalize, None
        )

    def flow(self) -> Any:
        import torch

        dev = self.engine.device

        def on(array: Any) -> Any:
            return torch.from_numpy(array).to(dev)

        def length(n: int) -> Any:
            return torch.tensor([n], device=dev, dtype=torch.int32)

        with torch.inference_mode():
            return self.engine.flow.inference(
                token=on(self.tokens),
                token_len=length(self.tokens.shape[1]),
                prompt_token=on(self.prompt),
                prompt_token_len=length(self.prompt.shape[1]),
                prompt_feat=on(self.feat),
                prompt_feat_len=length(self.feat.shape[1]),
                embedding=on(self.embedding),
                streaming=self.offset is not None,
                finalize=self.finalize,
            )[0]


def floors(engines: dict[str, Any], frames: int, torch: Any) -> dict[str, Any]:
    """What bounds the flow's time with graphs: the estimator's bucket graph replayed 10 times
    (the Euler steps alone, as ``graphs`` runs them) and the whole-CFM graph replayed once."""
    out: dict[str, Any] = {}
    graphed = engines["graphs"].graphed
    bucket = graphed.graphs.get(-(-frames // graphed.bucket) * graphed.bucket)
    if bucket is not None:

        def ten() -> None:
            for _ in range(10):
                bucket.graph.replay()

        out["estimator_graph_x10_ms"] = timed(ten, torch)
    cfm = engines.get("cfm")
    if cfm is not None:
        for (padded, _), graph in cfm.flow.decoder.graphs.items():
            if padded == -(-frames // 128) * 128:
                out["cfm_graph_replay_ms"] = timed(graph.graph.replay, torch)
    return out


def main() -> int:
    import numpy as np
    import torch

    from cosyvoice_serving_models.token2wav import Token2Wav

    release = Path(sys.argv[1])
    device = "cuda:0" if torch.cuda.is_available() else "cpu"  # cpu: a dry run, no graphs
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 6561, (1, PROMPT_TOKENS)).astype(np.int32)
    feat = rng.standard_normal((1, 2 * PROMPT_TOKENS, 80)).astype(np.float32)
    embedding = rng.standard_normal((1, 192)).astype(np.float32)
    cases = {  # name: (tokens so far incl. look-ahead, offset, finalize)
        "first_chunk_15_tokens": (18, 0, False),
        "chunk_at_10s_100_tokens": (353, 250, False),
        "utterance_10s_offline": (250, None, True),
    }
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if device != "cpu" else "cpu",
        "torch": torch.__version__,
    }
    engines = {}
    for mode in ("eager", "graphs", "cfm"):
        began = time.monotonic()
        try:
            engines[mode] = Token2Wav(release, device, graphs=(mode != "eager"))
            if mode == "cfm":
                from cfm_graphs import graphed_cfm

                inner = engines[mode].graphed.inner
                engines[mode].flow.decoder = graphed_cfm(engines[mode].flow.decoder, inner)
        except Exception as exc:  # the third engine is an experiment: report, go on
            out[f"{mode}_error"] = f"{type(exc).__name__}: {exc}"[:500]
            engines.pop(mode, None)
        out[f"{mode}_load_s"] = round(time.monotonic() - began, 1)
    out["graphed"] = engines["graphs"].graphed is not None
    mels: dict[tuple[str, str], Any] = {}
    for name, (count, offset, finalize) in cases.items():
        tokens = rng.integers(0, 6561, (1, count)).astype(np.int32)
        row: dict[str, Any] = {}
        for mode, engine in engines.items():
            case = Case(engine, tokens, prompt, feat, embedding, offset, finalize)
            try:
                repeats = REPEATS if mode == "eager" else 4 * REPEATS  # eager: ~0.6 s a call
                row[f"{mode}_synthesize_ms"] = timed(case.synthesize, torch, repeats)
                row[f"{mode}_flow_ms"] = timed(case.flow, torch, repeats)
                mels[(name, mode)] = case.flow().float()
            except Exception as exc:
                row[f"{mode}_error"] = f"{type(exc).__name__}: {exc}"[:500]
        for mode in ("graphs", "cfm"):
            if (name, mode) in mels and (name, "eager") in mels:
                diff = (mels[(name, "eager")] - mels[(name, mode)]).abs().max().item()
                row[f"{mode}_mel_max_abs_diff"] = round(diff, 6)
                row[f"{mode}_speedup_flow"] = round(
                    row["eager_flow_ms"] / row[f"{mode}_flow_ms"], 1
                )
                row[f"{mode}_speedup_synthesize"] = round(
                    row["eager_synthesize_ms"] / row[f"{mode}_synthesize_ms"], 1
                )
        row["mel_max_abs"] = round(mels[(name, "eager")].abs().max().item(), 3)
        frames = 2 * (PROMPT_TOKENS + count - (0 if finalize else 3))
        row["frames"] = frames
        if device != "cpu":
            row.update(floors(engines, frames, torch))
        out[name] = row
    graphed = engines["graphs"].graphed
    if graphed is not None:
        out["graph_replays"], out["graph_eager_calls"] = graphed.replays, graphed.eager
    if device != "cpu":
        out["gpu_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
