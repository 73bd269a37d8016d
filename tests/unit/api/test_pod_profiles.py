"""The pod profiles the SLO sizing and the simulator fall back on (issue 20, item 6)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cosyvoice_operator.api import pod_profiles, spec
from cosyvoice_operator.api.pod_profiles import UPSTREAM_L20, PodProfile


@pytest.fixture
def measured_h200(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PodProfile]:
    path = tmp_path / "pod_profiles.json"
    fields: dict[str, Any] = {
        "slots": 16,
        "rtf": 0.3,
        "overhead_s": 0.0,
        "first_chunk_s": 0.33,
        "first_chunk_per_stream_s": 0.08,
        "first_chunk_busy_ms": 1530,
        "source": "sweep run X",
    }
    path.write_text(json.dumps({"profiles": {"H200": fields}}))
    monkeypatch.setattr(pod_profiles, "MEASURED", path)
    pod_profiles.measured.cache_clear()
    yield PodProfile(gpu="H200", **fields)
    pod_profiles.measured.cache_clear()


def _slo(products: list[str], slo: dict[str, Any]) -> spec.SloSpec:
    raw = {
        "model": {"uri": "hf://org/model", "variant": "cosyvoice2"},
        "engine": {"cacheClaimName": "engines", "gpuProducts": products},
        "autoscaling": {"slo": {"firstAudioMilliseconds": 3000, **slo}},
    }
    return spec.parse(raw).autoscaling.slo


def test_l20_is_upstreams_published_figure() -> None:
    assert pod_profiles.profile("NVIDIA-L20") == UPSTREAM_L20
    assert UPSTREAM_L20.first_chunk_busy_ms == 1107


def test_unmeasured_family_falls_back_to_l20_and_says_so(measured_h200: PodProfile) -> None:
    found = pod_profiles.profile("NVIDIA-H100-80GB-HBM3")
    assert found.first_chunk_busy_ms == 1107
    assert found.source.startswith("no profile for H100")


def test_measured_family_is_used_by_product_label(measured_h200: PodProfile) -> None:
    assert pod_profiles.profile("NVIDIA-H200") == measured_h200
    assert pod_profiles.profile("H200") == measured_h200


def test_a_fleet_of_two_products_sizes_for_the_slower_first_chunk(
    measured_h200: PodProfile,
) -> None:
    both = pod_profiles.for_products(("NVIDIA-H200", "NVIDIA-L20"))
    assert both == measured_h200  # 1530 ms busy > L20's 1107
    assert pod_profiles.for_products(()) == UPSTREAM_L20


def test_unset_first_chunk_comes_from_the_gpu_products(measured_h200: PodProfile) -> None:
    slo = _slo(["NVIDIA-H200"], {})
    assert slo.first_chunk_milliseconds == 1530
    assert "H200" in slo.first_chunk_source and "sweep run X" in slo.first_chunk_source
    assert _slo([], {}).first_chunk_milliseconds == 1107


def test_a_set_first_chunk_wins_over_the_profile(measured_h200: PodProfile) -> None:
    slo = _slo(["NVIDIA-H200"], {"firstChunkMilliseconds": 900})
    assert slo.first_chunk_milliseconds == 900
    assert slo.first_chunk_source == "spec.autoscaling.slo.firstChunkMilliseconds"


def test_a_profile_above_the_slo_is_a_clear_error(measured_h200: PodProfile) -> None:
    with pytest.raises(spec.SpecError, match="firstChunkMilliseconds"):
        _slo(["NVIDIA-H200"], {"firstAudioMilliseconds": 1500})


def test_the_packaged_profiles_parse() -> None:
    # whatever calibrate.py wrote (or nothing yet): every entry is a complete profile
    for name, found in pod_profiles.measured().items():
        assert found.gpu == name and found.slots > 0 and found.first_chunk_busy_ms > 0


def test_named_is_exact_and_lists_the_known_names() -> None:
    # The benchmark's --pod asks for one pod; unlike profile(), no fallback to the L20.
    assert pod_profiles.named("L20") is pod_profiles.UPSTREAM_L20
    for name, measured in pod_profiles.measured().items():
        assert pod_profiles.named(name) == measured
    with pytest.raises(KeyError, match=r"no pod profile 'B300'; known: .*L20"):
        pod_profiles.named("B300")
    assert pod_profiles.profile("B300").source.startswith("no profile for B300")
