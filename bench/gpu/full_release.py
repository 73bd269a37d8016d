"""A synthetic CosyVoice2 release at the real dimensions, random weights (issue 20, item 2).

Run on the GPU machine (the weights are GBs; the code is carried):

    python3 full_release.py OUT_DIR [--llm]

Writes what the serving pod's model code opens, laid out as the engine builder lays out
``<engine>/model/`` (``serving-models/cosyvoice_serving_models/tiny_release.py`` is the tiny
twin of this script):

- ``cosyvoice2.yaml``: upstream's hyperpyyaml with the dimensions of
  ``examples/libritts/cosyvoice2/conf/cosyvoice2.yaml`` at the pinned commit ace7c47 (the
  release's ``cosyvoice2.yaml`` has the same ``flow`` and ``hift`` entries; the parameter
  counts below match the sizes of the release's ``flow.pt`` and ``hift.pt``, see
  ``../shared/probes/gpu-upstream-flow``);
- ``flow.pt`` (``CausalMaskedDiffWithXvec``: the causal conformer encoder and the causal
  conditional flow-matching decoder) and ``hift.pt`` (``HiFTGenerator``), built from that yaml
  by upstream's own classes, seeded, saved as upstream saves them (state dicts);
- ``llm/tokenizer.json``: the byte-level tokenizer with upstream's special tokens;
- with ``--llm``: ``CosyVoice-BlankEN/`` (a Qwen2-0.5B-shaped Hugging Face checkpoint:
  ``config.json`` + ``model.safetensors``, bfloat16) and ``llm.pt`` (upstream's ``Qwen2LM``
  around it). Nothing in the sweep reads them (its LLM stage is the torch stand-in of
  ``standins/cv_shapes.py``, of the same geometry); they are written to show the release's
  layout is complete and to time it.

Not written: ``speech_tokenizer_v2.onnx`` and ``campplus.onnx`` (the sweep's
``audio_tokenizer`` and ``speaker_embedding`` are GPU stand-ins, and with a cached speaker they
run once per voice) and ``spk2info.pt``. Prints a JSON summary (parameter counts, sizes, time).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "build" / "serving-models"))  # pack.py's copy

from cosyvoice_serving_models.tiny_release import UPSTREAM, release_yaml  # noqa: E402

# Upstream's conf at ace7c47, the entries the serving code builds or reads; seeds and the
# other training-only entries left out.
YAML = release_yaml(
    UPSTREAM,
    llm_training="    length_normalized_loss: True\n    lsm_weight: 0\n    mix_ratio: [5, 15]\n",
)

# Qwen2-0.5B's config.json (the geometry upstream's CosyVoice-BlankEN carries).
QWEN2_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
}


def millions(module: object) -> float:
    return round(sum(p.numel() for p in module.parameters()) / 1e6, 1)  # type: ignore[attr-defined]


def write_llm(out: Path, summary: dict[str, object]) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    began = time.monotonic()
    blank = out / "CosyVoice-BlankEN"
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_05B)).to(torch.bfloat16)
    model.save_pretrained(blank)
    summary["qwen2_params_M"] = millions(model)
    del model
    from hyperpyyaml import load_hyperpyyaml  # type: ignore[import-not-found]

    text = YAML.replace("'CosyVoice-BlankEN'", repr(str(blank)))
    try:
        llm = load_hyperpyyaml(text)["llm"]
        torch.save(llm.state_dict(), out / "llm.pt")
        summary["llm_params_M"] = millions(llm)
    except Exception as exc:  # upstream's Qwen2Encoder against this transformers
        summary["llm_pt_error"] = f"{type(exc).__name__}: {exc}"[:300]
    summary["llm_seconds"] = round(time.monotonic() - began, 1)


def main() -> int:
    import torch
    from hyperpyyaml import load_hyperpyyaml  # type: ignore[import-not-found]

    from cosyvoice_serving_models.tiny_release import write_tokenizer
    from cosyvoice_serving_models.token2wav import flow_and_hift_yaml

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    (out / "cosyvoice2.yaml").write_text(YAML)
    torch.manual_seed(1986)
    configs = load_hyperpyyaml(flow_and_hift_yaml(YAML))
    torch.save(configs["flow"].state_dict(), out / "flow.pt")
    torch.save(configs["hift"].state_dict(), out / "hift.pt")
    write_tokenizer(out / "llm" / "tokenizer.json")
    summary: dict[str, object] = {
        "flow_params_M": millions(configs["flow"]),
        "hift_params_M": millions(configs["hift"]),
        "flow_estimator_params_M": millions(configs["flow"].decoder.estimator),
    }
    if "--llm" in sys.argv[2:]:
        write_llm(out, summary)
    summary["files_MiB"] = {
        str(p.relative_to(out)): round(p.stat().st_size / 2**20, 1)
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }
    summary["seconds"] = round(time.monotonic() - began, 1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
