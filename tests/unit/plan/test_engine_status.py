"""engine_status.engine_status / engine_entries / engine_summary: what `kubectl get cvs` shows."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from cosyvoice_operator.api.engine_identity import EnginePlan, EngineTarget, RejectedProduct
from cosyvoice_operator.api.gpus import UnknownGPUProduct
from cosyvoice_operator.plan import engine_status
from cosyvoice_operator.plan.engine_state import EngineState
from cosyvoice_operator.plan.engine_status import Blocker
from tests.unit.objects import T0, identity

SM89 = EngineTarget(identity(gpu_arch="sm_89"), ("NVIDIA-L20", "NVIDIA-L40S"))
SM90 = EngineTarget(identity(gpu_arch="sm_90"), ("NVIDIA-H100-80GB-HBM3",))

READY = EngineState("Ready", "built by job-a1 at 2025-03-01T12:00:00Z", job="job-a1", attempts=1)
BUILDING = EngineState("Building", "job-a1 running on gpu-3 (attempt 1)", job="job-a1", attempts=1)
PENDING = EngineState("Pending", "job-a1 waits for a GPU node: 0/4 nodes", job="job-a1", attempts=1)
FAILED = EngineState(
    "Failed",
    "attempt 3/3 failed (BackoffLimitExceeded): step convert: OOM. Gave up",
    job="j-a3",
    attempts=3,
)


def _plan(
    *targets: EngineTarget,
    unknown: Sequence[str] = (),
    rejected: Sequence[RejectedProduct] = (),
    source: str = "nodes",
) -> EnginePlan:
    unknowns = [
        RejectedProduct(p, "", "UnknownGPUProduct", str(UnknownGPUProduct(p))) for p in unknown
    ]
    return EnginePlan(tuple(targets), (*unknowns, *rejected), source)


# The fields engine_status writes: serving.py writes Available, Progressing, the replica
# counts and the READY column, so none of those may come from here.
ENGINE_FIELDS = {"observedGeneration", "phase", "engines", "engineSummary", "conditions"}
INVALID_SPEC_FIELDS = ENGINE_FIELDS - {"engines"}


def _status(
    plan: EnginePlan | None,
    states: Mapping[str, EngineState] | None = None,
    *,
    blockers: Sequence[Blocker] = (),
    spec_error: str | None = None,
    previous: Mapping[str, Any] | None = None,
    generation: int = 3,
    now: dt.datetime = T0,
) -> dict[str, Any]:
    """engine_status as plan_service calls it, checked to have the shape production writes."""
    st = engine_status.engine_status(
        plan, states or {}, blockers, spec_error, previous or {}, generation, now
    )
    assert set(st) == (ENGINE_FIELDS if spec_error is None else INVALID_SPEC_FIELDS)
    kept = {c["type"] for c in (previous or {}).get("conditions") or []}
    assert {c["type"] for c in st["conditions"]} == {"EngineReady"} | kept
    return st


def _cond(st: Mapping[str, Any], kind: str) -> dict[str, Any]:
    (cond,) = [c for c in st["conditions"] if c["type"] == kind]
    assert isinstance(cond, dict)
    return cond


# ---- phase, EngineReady reason and summary, table-driven ---------------------------------

PHASE_CASES: list[tuple[str, EnginePlan, dict[str, EngineState], str, str, str, str]] = [
    # id, plan, states, phase, EngineReady status, reason, engineSummary
    ("all-ready", _plan(SM89, SM90), {SM89.key: READY, SM90.key: READY},
     "Deploying", "True", "EnginesBuilt", "Ready 2/2"),
    ("one-ready", _plan(SM90), {SM90.key: READY}, "Deploying", "True", "EnginesBuilt", "Ready"),
    ("one-building", _plan(SM89, SM90), {SM89.key: READY, SM90.key: BUILDING},
     "BuildingEngine", "False", "Building", "Building 1/2"),
    ("pending", _plan(SM90), {SM90.key: PENDING},
     "BuildingEngine", "False", "Building", "Pending 0/1"),
    ("pending-and-building", _plan(SM89, SM90), {SM89.key: PENDING, SM90.key: BUILDING},
     "BuildingEngine", "False", "Building", "Building 0/2"),
    ("only-failed", _plan(SM90), {SM90.key: FAILED},
     "Failed", "False", "BuildFailed", "Failed 1/1"),
    ("failed-and-ready", _plan(SM89, SM90), {SM89.key: READY, SM90.key: FAILED},
     "Degraded", "False", "BuildFailed", "Failed 1/2"),
    ("failed-while-another-builds", _plan(SM89, SM90), {SM89.key: BUILDING, SM90.key: FAILED},
     "BuildingEngine", "False", "BuildFailed", "Building 0/2"),
    ("failed-while-another-pending", _plan(SM89, SM90), {SM89.key: PENDING, SM90.key: FAILED},
     "BuildingEngine", "False", "BuildFailed", "Pending 0/2"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("plan", "states", "phase", "ready", "reason", "summary"),
    [c[1:] for c in PHASE_CASES],
    ids=[c[0] for c in PHASE_CASES],
)
def test_phase_condition_and_summary(
    plan: EnginePlan,
    states: dict[str, EngineState],
    phase: str,
    ready: str,
    reason: str,
    summary: str,
) -> None:
    st = _status(plan, states)
    assert st["phase"] == phase
    cond = _cond(st, "EngineReady")
    assert (cond["status"], cond["reason"]) == (ready, reason)
    assert st["engineSummary"] == summary
    assert st["observedGeneration"] == 3


def test_engines_built_message_names_the_architectures() -> None:
    st = _status(_plan(SM89, SM90), {SM89.key: READY, SM90.key: READY})
    assert _cond(st, "EngineReady")["message"] == "engines ready for sm_89, sm_90"


def test_building_message_is_every_unfinished_engines_message() -> None:
    st = _status(_plan(SM89, SM90), {SM89.key: PENDING, SM90.key: BUILDING})
    message = _cond(st, "EngineReady")["message"]
    assert PENDING.message in message and BUILDING.message in message
    assert READY.message not in message


def test_build_failed_message_is_the_failed_engines_message() -> None:
    st = _status(_plan(SM89, SM90), {SM89.key: READY, SM90.key: FAILED})
    assert _cond(st, "EngineReady")["message"] == FAILED.message


def test_only_the_engine_fields_and_engine_ready_are_written() -> None:
    # Available, Progressing, replicas and readySummary are serving.py's to write.
    for states in ({SM90.key: READY}, {SM90.key: BUILDING}):
        st = _status(_plan(SM90), states)
        assert set(st) == ENGINE_FIELDS
        assert [c["type"] for c in st["conditions"]] == ["EngineReady"]


# ---- entries --------------------------------------------------------------------------------


def test_one_entry_per_product_products_of_one_arch_share_a_key() -> None:
    entries = engine_status.engine_entries(_plan(SM89, SM90), {SM89.key: READY, SM90.key: BUILDING})
    assert [e["gpuProduct"] for e in entries] == [
        "NVIDIA-H100-80GB-HBM3",
        "NVIDIA-L20",
        "NVIDIA-L40S",
    ]  # sorted by product
    by_product = {e["gpuProduct"]: e for e in entries}
    assert by_product["NVIDIA-L20"]["key"] == by_product["NVIDIA-L40S"]["key"] == SM89.key
    assert by_product["NVIDIA-H100-80GB-HBM3"]["key"] == SM90.key != SM89.key
    assert by_product["NVIDIA-L20"] == {
        "gpuProduct": "NVIDIA-L20",
        "gpuArch": "sm_89",
        "key": SM89.key,
        "state": "Ready",
        "job": "job-a1",
        "message": READY.message,
        "attempts": 1,
    }
    assert by_product["NVIDIA-H100-80GB-HBM3"]["state"] == "Building"
    assert by_product["NVIDIA-H100-80GB-HBM3"]["gpuArch"] == "sm_90"


def test_entry_has_next_retry_time_while_waiting_to_retry() -> None:
    waiting = EngineState(
        "Failed", "attempt 1/3 failed", job="j-a1", attempts=1,
        next_retry=dt.datetime(2025, 3, 1, 20, 1, tzinfo=dt.timezone(dt.timedelta(hours=8))),
    )  # fmt: skip
    (entry,) = engine_status.engine_entries(_plan(SM90), {SM90.key: waiting})
    assert entry["nextRetryTime"] == "2025-03-01T12:01:00Z"
    (plain,) = engine_status.engine_entries(_plan(SM90), {SM90.key: BUILDING})
    assert "nextRetryTime" not in plain


def test_status_engines_are_the_entries() -> None:
    states = {SM89.key: READY, SM90.key: BUILDING}
    st = _status(_plan(SM89, SM90), states)
    assert st["engines"] == engine_status.engine_entries(_plan(SM89, SM90), states)


# ---- unknown products and no products -------------------------------------------------------


def test_unknown_product_only() -> None:
    st = _status(_plan(unknown=["Tesla-T4"]))
    assert st["phase"] == "Failed"
    cond = _cond(st, "EngineReady")
    assert (cond["status"], cond["reason"]) == ("False", "UnknownGPUProduct")
    assert "'Tesla-T4'" in cond["message"] and "nvidia.com/gpu.product" in cond["message"]
    (entry,) = st["engines"]
    assert entry["gpuProduct"] == "Tesla-T4"
    assert entry["state"] == "Failed"
    assert entry["gpuArch"] == "" and entry["key"] == "" and entry["job"] == ""
    assert "'Tesla-T4'" in entry["message"]
    assert st["engineSummary"] == "Failed 1/1"


def test_unknown_products_named_in_the_spec_hold_the_engines_back() -> None:
    plan = _plan(SM90, unknown=["Tesla-T4", "NVIDIA-X9"], source="spec")
    st = _status(plan, {SM90.key: READY})
    cond = _cond(st, "EngineReady")
    assert (cond["status"], cond["reason"]) == ("False", "UnknownGPUProduct")
    assert "'Tesla-T4'" in cond["message"] and "(and 1 more)" in cond["message"]
    # The H100 engine is there: the service can run on part of what it asked for.
    assert st["phase"] == "Degraded"
    assert {e["gpuProduct"] for e in st["engines"]} == {
        "Tesla-T4",
        "NVIDIA-X9",
        "NVIDIA-H100-80GB-HBM3",
    }


def test_an_unknown_product_found_on_the_nodes_does_not_take_the_service_down() -> None:
    # A new GPU type joining the cluster must not fail every service without a nodeSelector.
    st = _status(_plan(SM90, unknown=["NVIDIA-X9"], source="nodes"), {SM90.key: READY})
    cond = _cond(st, "EngineReady")
    assert (cond["status"], cond["reason"]) == ("True", "EnginesBuilt")
    assert cond["message"].startswith("engines ready for sm_90; no engine for NVIDIA-X9: ")
    assert "'NVIDIA-X9'" in cond["message"]
    assert st["phase"] == "Degraded"
    entry = next(e for e in st["engines"] if e["gpuProduct"] == "NVIDIA-X9")
    assert entry["state"] == "Failed"


def test_unknown_products_beside_a_building_engine_keep_building() -> None:
    for source in ("spec", "nodes"):
        st = _status(_plan(SM90, unknown=["Tesla-T4"], source=source), {SM90.key: BUILDING})
        assert st["phase"] == "BuildingEngine"
        expected = "UnknownGPUProduct" if source == "spec" else "Building"
        assert _cond(st, "EngineReady")["reason"] == expected


def test_a_product_the_precision_cannot_run_on_is_reported_with_its_arch() -> None:
    a100 = RejectedProduct(
        "NVIDIA-A100-SXM4-80GB", "sm_80", "PrecisionUnsupported", "fp8 needs sm_89 or newer"
    )
    st = _status(_plan(SM90, rejected=[a100], source="spec"), {SM90.key: READY})
    cond = _cond(st, "EngineReady")
    assert (cond["status"], cond["reason"]) == ("False", "PrecisionUnsupported")
    assert cond["message"] == "fp8 needs sm_89 or newer"
    entry = next(e for e in st["engines"] if e["gpuProduct"] == "NVIDIA-A100-SXM4-80GB")
    assert (entry["state"], entry["gpuArch"], entry["key"]) == ("Failed", "sm_80", "")
    assert st["phase"] == "Degraded"
    only = _status(_plan(rejected=[a100], source="spec"))
    assert only["phase"] == "Failed"
    assert _cond(only, "EngineReady")["reason"] == "PrecisionUnsupported"


def test_no_eligible_gpu_nodes() -> None:
    st = _status(_plan())
    cond = _cond(st, "EngineReady")
    assert (cond["status"], cond["reason"]) == ("False", "NoEligibleGPUNodes")
    for word in ("nodeSelector", "affinity", "tolerations", "gpusPerReplica"):
        assert word in cond["message"]
    assert st["phase"] == "Pending"
    assert st["engines"] == []
    assert st["engineSummary"] == "None"


# ---- blockers -------------------------------------------------------------------------------

CACHE_MISSING = Blocker(
    "CacheClaimMissing",
    "PersistentVolumeClaim ml/cosyvoice-engines (spec.engine.cacheClaimName) does not exist",
)
SECRET_MISSING = Blocker(
    "CredentialsSecretMissing", "Secret ml/hf-token (spec.model.credentialsSecret) does not exist"
)


def test_cache_claim_missing_blocks_every_engine() -> None:
    # the handler marks every engine Pending with the first blocker's message
    states = {t.key: EngineState("Pending", CACHE_MISSING.message) for t in (SM89, SM90)}
    st = _status(_plan(SM89, SM90), states, blockers=[CACHE_MISSING])
    cond = _cond(st, "EngineReady")
    assert (cond["status"], cond["reason"]) == ("False", "CacheClaimMissing")
    assert cond["message"] == CACHE_MISSING.message
    assert st["phase"] == "Pending"  # nothing is building: the user must act
    assert all(e["message"] == CACHE_MISSING.message for e in st["engines"])
    assert st["engineSummary"] == "Pending 0/2"


def test_several_blockers_first_reason_all_messages() -> None:
    states = {SM90.key: EngineState("Pending", CACHE_MISSING.message)}
    st = _status(_plan(SM90), states, blockers=[CACHE_MISSING, SECRET_MISSING])
    cond = _cond(st, "EngineReady")
    assert cond["reason"] == "CacheClaimMissing"
    assert cond["message"] == f"{CACHE_MISSING.message}; {SECRET_MISSING.message}"
    (entry,) = st["engines"]
    assert entry["message"] == cond["message"]


def test_blocker_wins_over_unknown_products() -> None:
    st = _status(_plan(unknown=["Tesla-T4"]), blockers=[CACHE_MISSING])
    assert _cond(st, "EngineReady")["reason"] == "CacheClaimMissing"


# ---- invalid spec ---------------------------------------------------------------------------


def test_invalid_spec() -> None:
    error = "spec.engine.tensorParallelSize: must be 1, 2, 4 or 8, got 3"
    st = _status(None, spec_error=error, generation=7)
    assert st["phase"] == "Failed"
    assert st["engineSummary"] == "Invalid"
    assert st["observedGeneration"] == 7
    cond = _cond(st, "EngineReady")
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "InvalidSpec", error)
    assert cond["observedGeneration"] == 7


def test_invalid_spec_keeps_other_conditions() -> None:
    previous = {
        "conditions": [
            {
                "type": "Available",
                "status": "False",
                "reason": "EnginesNotReady",
                "message": "m",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
                "observedGeneration": 1,
            }
        ]
    }
    st = _status(None, spec_error="spec.model.uri: bad", previous=previous)
    assert _cond(st, "Available") == previous["conditions"][0]


# ---- generations, transitions --------------------------------------------------------------


def test_conditions_keep_their_transition_time_across_reconciles() -> None:
    first = _status(_plan(SM90), {SM90.key: BUILDING}, now=T0, generation=1)
    later = T0 + dt.timedelta(minutes=5)
    second = _status(
        _plan(SM90), {SM90.key: PENDING}, previous=first, now=later, generation=2
    )  # still not ready: status unchanged
    assert _cond(second, "EngineReady")["lastTransitionTime"] == "2025-03-01T12:00:00Z"
    assert _cond(second, "EngineReady")["observedGeneration"] == 2
    third = _status(_plan(SM90), {SM90.key: READY}, previous=second, now=later, generation=2)
    assert _cond(third, "EngineReady")["lastTransitionTime"] == "2025-03-01T12:05:00Z"
    assert _cond(third, "EngineReady")["status"] == "True"


# ---- engine_summary directly ----------------------------------------------------------------


def _entry(key: str, state: str, product: str = "P") -> dict[str, Any]:
    return {"key": key, "gpuProduct": product, "state": state}


@pytest.mark.parametrize(
    ("entries", "summary"),
    [
        ([], "None"),
        ([_entry("k1", "Ready")], "Ready"),
        # products sharing a key count once
        ([_entry("k1", "Ready", "L20"), _entry("k1", "Ready", "L40S")], "Ready"),
        ([_entry("k1", "Ready"), _entry("k2", "Ready")], "Ready 2/2"),
        ([_entry("k1", "Ready"), _entry("k2", "Building")], "Building 1/2"),
        ([_entry("k1", "Pending")], "Pending 0/1"),
        ([_entry("k1", "Failed"), _entry("k2", "Failed")], "Failed 2/2"),
        # unknown products (no key) count by product
        ([_entry("", "Failed", "T4"), _entry("", "Failed", "X9")], "Failed 2/2"),
        # issue 23: a failed build with a retry scheduled is not "Failed 1/1"
        ([{**_entry("k1", "Failed"), "nextRetryTime": "2026-12-03T12:01:00Z"}], "Retrying 0/1"),
        (
            [
                _entry("k1", "Ready"),
                {**_entry("k2", "Failed"), "nextRetryTime": "2026-12-03T12:01:00Z"},
            ],
            "Retrying 1/2",
        ),
        (
            [
                _entry("k1", "Failed"),
                {**_entry("k2", "Failed"), "nextRetryTime": "2026-12-03T12:01:00Z"},
            ],
            "Retrying 0/2",
        ),
    ],
)
def test_engine_summary(entries: list[dict[str, Any]], summary: str) -> None:
    assert engine_status.engine_summary(entries) == summary


# ---- retries and blockers of built engines ----------------------------------------------------


def test_a_failed_engine_waiting_to_retry_is_still_building() -> None:
    retry_at = T0 + dt.timedelta(minutes=2)
    waiting = EngineState(
        "Failed",
        "attempt 1/3 failed: step build: OOM. Retry at ...",
        job="j-a1",
        attempts=1,
        next_retry=retry_at,
    )
    st = _status(_plan(SM89), {SM89.key: waiting})
    assert st["phase"] == "BuildingEngine"
    assert _cond(st, "EngineReady")["reason"] == "BuildRetrying"
    assert {e["nextRetryTime"] for e in st["engines"]} == {"2025-03-01T12:02:00Z"}


def test_a_final_failure_beside_a_retrying_one_is_reported_as_failed() -> None:
    waiting = EngineState("Failed", "attempt 1/3 failed", job="x-a1", attempts=1, next_retry=T0)
    st = _status(_plan(SM89, SM90), {SM89.key: FAILED, SM90.key: waiting})
    assert _cond(st, "EngineReady")["reason"] == "BuildFailed"
    assert "Gave up" in _cond(st, "EngineReady")["message"]


def test_a_blocker_does_not_unready_engines_already_built() -> None:
    gone = Blocker("CredentialsSecretMissing", "Secret ml/hf-token does not exist")
    st = _status(_plan(SM89, SM90), {SM89.key: READY, SM90.key: READY}, blockers=[gone])
    assert _cond(st, "EngineReady")["status"] == "True"
    assert st["phase"] == "Deploying"
    assert {e["state"] for e in st["engines"]} == {"Ready"}
