"""Run by test_flow_graphs.py under Debian's python3 with upstream's library: the estimator
forward of cosyvoice_serving_models.flow_graphs against upstream's own, on a release's flow.

Prints one JSON line: the largest difference between upstream's forward on T frames and ours
on the same frames right-padded to a bucket (for streaming and offline masks), and how many
frames were compared."""

import json
import sys
from pathlib import Path

import torch
from hyperpyyaml import load_hyperpyyaml

from cosyvoice_serving_models.flow_graphs import attention_bias, estimate, graphable, padded_bias
from cosyvoice_serving_models.token2wav import flow_and_hift_yaml

release = Path(sys.argv[1])
flow = load_hyperpyyaml(flow_and_hift_yaml((release / "cosyvoice2.yaml").read_text()))["flow"]
flow.load_state_dict(torch.load(release / "flow.pt", map_location="cpu"))
est = flow.decoder.estimator.eval()
assert graphable(est)
torch.manual_seed(0)
out = {"compared_frames": 0, "max_abs_diff": 0.0, "max_abs_value": 0.0, "bias_max_abs_diff": 0.0}
with torch.inference_mode():
    for frames, padded in ((37, 128), (100, 128), (130, 256)):
        for streaming in (True, False):
            x, mu, cond = (torch.randn(2, 80, frames) for _ in range(3))
            mask = torch.ones(2, 1, frames)
            t, spks = torch.rand(2), torch.randn(2, 80)
            ref = est(x, mask, mu, t, spks, cond, streaming=streaming)

            def pad(a: torch.Tensor, extra: int = padded - frames) -> torch.Tensor:
                return torch.nn.functional.pad(a, (0, extra))

            full = pad(mask)
            bias = attention_bias(est, full, streaming)
            out["bias_max_abs_diff"] = max(
                out["bias_max_abs_diff"],
                float((padded_bias(est, full, streaming) - bias).abs().max()),
            )
            ours = estimate(
                est, pad(x), full, pad(mu), t, spks, pad(cond), padded_bias(est, full, streaming)
            )[:, :, :frames]
            out["compared_frames"] += frames
            out["max_abs_diff"] = max(out["max_abs_diff"], float((ours - ref).abs().max()))
            out["max_abs_value"] = max(out["max_abs_value"], float(ref.abs().max()))
print(json.dumps(out))
