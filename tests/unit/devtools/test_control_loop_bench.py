"""``bench/control_loop.py``'s arithmetic (writes per service up to its own EngineReady, the
median and range of the pairs), ``bench/request_log_operator.py``'s EngineReady test, and the
simulator's percentile refusing too few samples (issue 31)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cosyvoice_operator.api.effects import PatchStatus
from cosyvoice_operator.devtools.sim.engine import (
    MIN_PERCENTILE_SAMPLES,
    TooFewSamples,
    percentile,
    quantile,
)

BENCH = Path(__file__).resolve().parents[3] / "bench"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


control_loop = _load("control_loop")
request_log = _load("request_log_operator")

NS = "/apis/tts.cosyvoice.dev/v1alpha1/namespaces/fleet/cosyvoiceservices"


def line(
    verb: str, path: str, service: str | None, status: int = 200, ready: bool = False
) -> dict[str, Any]:
    return {"t": 0.0, "verb": verb, "path": path, "name": None, "status": status,
            "service": service, "engine_ready": ready}  # fmt: skip


def test_writes_are_counted_per_service_up_to_its_own_engine_ready() -> None:
    lines = [
        line("GET", "/api/v1/namespaces/fleet/configmaps", None),  # a read: not counted
        line("POST", "/apis/batch/v1/namespaces/fleet/jobs", "fleet/a"),
        line("POST", "/apis/batch/v1/namespaces/fleet/jobs", "fleet/b"),
        line("PATCH", f"{NS}/a/status", "fleet/a"),
        # b's EngineReady write conflicts (409): b is not ready yet, the write still counts.
        line("PATCH", f"{NS}/b/status", "fleet/b", status=409, ready=True),
        line("POST", "/api/v1/namespaces/fleet/configmaps", "fleet/a"),
        line("PATCH", f"{NS}/a/status", "fleet/a", ready=True),
        # a's serving objects, after its EngineReady: not in a's count.
        line("PATCH", "/apis/apps/v1/namespaces/fleet/deployments/cvs-a", "fleet/a"),
        line("PATCH", f"{NS}/b/status", "fleet/b", ready=True),
        line("POST", "/api/v1/namespaces/other/events", "other/x"),
        line("PATCH", "/api/v1/nodes/n1", None),
    ]
    found = control_loop.writes_per_service(lines, "fleet")
    assert found["services"] == 2
    # a: Job, status, record, the ready status; b: Job, the refused ready status, the ready one
    assert found["histogram"] == {"3": 1, "4": 1}
    assert (found["median"], found["min"], found["max"], found["mean"]) == (3.5, 3, 4, 3.5)
    assert found["refused_or_conflicting"] == 1
    assert found["unattributed_writes"] == 2
    assert found["by_request_per_service"]["PATCH cosyvoiceservices/status"] == 2.0
    assert "PATCH deployments" not in found["by_request_per_service"]


def test_a_service_that_never_wrote_engine_ready_is_not_averaged_in() -> None:
    lines = [
        line("POST", "/apis/batch/v1/namespaces/fleet/jobs", "fleet/a"),
        line("PATCH", f"{NS}/a/status", "fleet/a", ready=True),
        line("POST", "/apis/batch/v1/namespaces/fleet/jobs", "fleet/b"),
    ]
    found = control_loop.writes_per_service(lines, "fleet")
    assert (found["services"], found["services_without_an_engine_ready_write"]) == (1, 1)
    assert found["median"] == 2
    with pytest.raises(SystemExit):
        control_loop.writes_per_service(lines[2:], "fleet")


def test_only_a_status_patch_setting_engine_ready_true_is_the_milestone() -> None:
    ready = {"type": "EngineReady", "status": "True"}
    assert request_log.sets_engine_ready(PatchStatus({"conditions": [ready]}, "1"))
    assert not request_log.sets_engine_ready(
        PatchStatus({"conditions": [{**ready, "status": "False"}]}, "1")
    )
    assert not request_log.sets_engine_ready(PatchStatus({"phase": "Building"}, "1"))
    assert not request_log.sets_engine_ready(object())


def test_pairs_are_summed_up_by_median_and_range() -> None:
    assert control_loop.spread([1.4, 1.2, 1.9]) == {"median": 1.4, "min": 1.2, "max": 1.9}
    floor: dict[str, Any] = {
        "total_seconds": 100.0,
        "total_with_services_seconds": 110.0,
        "recorded_seconds": 40.0,
        "services_create_seconds": 10.0,
        "loadavg_start": [1.0, 1.0, 1.0],
        "loadavg_end": [2.0, 1.0, 1.0],
    }
    op: dict[str, Any] = {
        "apply_to_ready_seconds": 130.0,
        "apply_to_engine_ready_seconds": 75.0,
        "writes_to_own_engine_ready": {"median": 4},
        "loadavg_start": [2.0, 1.0, 1.0],
        "loadavg_end": [3.0, 2.0, 1.0],
    }
    pair = control_loop.pair_summary(1, floor, op)
    assert pair["ratio_to_floor"] == 1.3
    assert pair["ratio_to_floor_with_services"] == round(130 / 110, 3)
    assert pair["ratio_engines_only_with_services"] == 1.5
    assert pair["loadavg_operator"] == [[2.0, 1.0, 1.0], [3.0, 2.0, 1.0]]


def test_a_percentile_of_too_few_samples_is_refused() -> None:
    few = [float(i) for i in range(MIN_PERCENTILE_SAMPLES - 1)]
    with pytest.raises(TooFewSamples, match="p95 of 19 samples"):
        percentile(few, 0.95)
    enough = [float(i) for i in range(MIN_PERCENTILE_SAMPLES)]
    assert percentile(enough, 0.95) == 18.0  # nearest rank: ceil(0.95 * 20) = 19th
    assert quantile(few[:3], 0.5) == 1.0  # order statistics of a few seeds stay allowed
