"""The graph-safe estimator forward (flow_graphs.estimate) equals upstream's forward, also on
right-padded frames, which is what lets one CUDA graph per bucket serve every length."""

from __future__ import annotations

import json
from pathlib import Path

from twins import debian_python

HERE = Path(__file__).resolve().parent


def test_padded_graph_forward_equals_upstreams_forward(release: Path) -> None:
    result = json.loads(debian_python(str(HERE / "graph_check.py"), str(release)).splitlines()[-1])
    assert result["compared_frames"] == 2 * (37 + 100 + 130)
    assert result["max_abs_value"] > 0.01  # the comparison is of real outputs, not zeros
    assert result["max_abs_diff"] < 1e-4 * max(1.0, result["max_abs_value"]), result
    assert result["bias_max_abs_diff"] == 0.0, result  # the graphs' bias is upstream's
