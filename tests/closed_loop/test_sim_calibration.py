"""The simulator's service model against a real CPU Triton: measured streams, overhead, and
the first-audio p95 of the same arrivals within 10 % (issue 10). Results of the longer run:
``bench/sim_calibration.py`` -> ``bench/results/sim_calibration.json``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.closed_loop.calibration import calibrate


@pytest.mark.timeout(300)
def test_the_simulated_replica_matches_a_real_triton(tmp_path: Path) -> None:
    result = calibrate(tmp_path, service_seconds=1.0, rates=(1.2,), seconds=40.0)
    print(result.to_json())
    assert result.streams == result.instances == 2
    assert 0.0 <= result.total_overhead_s < 0.5
    [agreement] = result.agreements
    assert agreement.requests >= 30
    # Queueing shows: the p95 is well above the first chunk of an idle pod.
    assert agreement.real_p95_s > 1.5 * result.model.first_chunk_s
    assert abs(agreement.gap) <= 0.10, result.to_json()
