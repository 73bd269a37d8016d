"""A service's status from what the reconcile found (pure).

The status is written for the two readers it has: ``kubectl get cvs`` (phase, READY, ENGINE
columns) and someone asking "why": every engine entry and condition carries a message that
says what is happening and what to do.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cosyvoice_operator.api import conditions
from cosyvoice_operator.api.engine_identity import EnginePlan
from cosyvoice_operator.plan.engine_state import EngineState


@dataclass(frozen=True)
class Blocker:
    """Something that keeps every engine of a service from being built (no Job is made)."""

    reason: str
    message: str


def engine_entries(plan: EnginePlan, states: Mapping[str, EngineState]) -> list[dict[str, Any]]:
    """``status.engines``: one entry per GPU product, engines shared by products of one arch."""
    entries: list[dict[str, Any]] = []
    for target in plan.targets:
        st = states[target.key]
        for product in target.products:
            entry: dict[str, Any] = {
                "gpuProduct": product,
                "gpuArch": target.identity.gpu_arch,
                "key": target.key,
                "state": st.state,
                "job": st.job,
                "message": st.message,
                "attempts": st.attempts,
            }
            if st.next_retry is not None:
                entry["nextRetryTime"] = conditions.timestamp(st.next_retry)
            entries.append(entry)
    for rejected in plan.rejected:
        entries.append(
            {
                "gpuProduct": rejected.product,
                "gpuArch": rejected.arch,
                "key": "",
                "state": "Failed",
                "job": "",
                "message": rejected.message,
                "attempts": 0,
            }
        )
    return sorted(entries, key=lambda e: e["gpuProduct"])


def engine_summary(entries: Sequence[Mapping[str, Any]]) -> str:
    """The ENGINE column: Ready, "Building 1/2", "Retrying 0/1", "Failed 1/1", "Pending 0/1"
    (ready engines over engines). A failed build with a retry scheduled (nextRetryTime) is
    Retrying, not Failed: Failed means the operator gave up."""
    keys: dict[str, str] = {}
    for e in entries:
        state = e["state"]
        if state == "Failed" and e.get("nextRetryTime"):
            state = "Retrying"
        keys[e["key"] or e["gpuProduct"]] = state
    if not keys:
        return "None"
    states = list(keys.values())
    ready = states.count("Ready")
    if ready == len(states):
        return "Ready" if len(states) == 1 else f"Ready {ready}/{len(states)}"
    if "Failed" in states and not {"Building", "Pending", "Retrying"} & set(states):
        return f"Failed {states.count('Failed')}/{len(states)}"
    if "Building" in states:
        return f"Building {ready}/{len(states)}"
    if "Retrying" in states:
        return f"Retrying {ready}/{len(states)}"
    return f"Pending {ready}/{len(states)}"


def engine_status(
    plan: EnginePlan | None,
    states: Mapping[str, EngineState],
    blockers: Sequence[Blocker],
    spec_error: str | None,
    previous: Mapping[str, Any],
    generation: int,
    now: dt.datetime,
    spec_reason: str = "InvalidSpec",
) -> dict[str, Any]:
    """The engine part of the status: engines, summary, phase and EngineReady (serving.py
    reports Available, Progressing, replicas and the READY column). A spec the operator
    refuses (`spec_error`) is InvalidSpec, or LimitExceeded when it is within the CRD but
    over one of the operator's limits."""
    prev_conditions = previous.get("conditions") or []
    if spec_error is not None:
        invalid = _condition("False", spec_reason, spec_error)
        return {
            "observedGeneration": generation,
            "phase": "Failed",
            "conditions": conditions.merge(prev_conditions, [invalid], generation, now),
            "engineSummary": "Invalid",
        }
    assert plan is not None
    entries = engine_entries(plan, states)
    summary = engine_summary(entries)
    all_built = bool(plan.targets) and all(states[t.key].state == "Ready" for t in plan.targets)
    # A blocker only matters to engines still to be built.
    blocking = [] if all_built else list(blockers)
    cond = _engine_ready_condition(plan, states, blocking)
    if blocking:
        for e in entries:
            if e["state"] != "Ready":
                e["message"] = cond["message"]
    return {
        "observedGeneration": generation,
        "phase": _phase(cond, entries, blocked=bool(blocking)),
        "engines": entries,
        "engineSummary": summary,
        "conditions": conditions.merge(prev_conditions, [cond], generation, now),
    }


def _condition(status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": "EngineReady", "status": status, "reason": reason, "message": message}


def _engine_ready_condition(
    plan: EnginePlan, states: Mapping[str, EngineState], blockers: Sequence[Blocker]
) -> dict[str, str]:
    """EngineReady: a blocker first, then no eligible node, then products asked for that get
    no engine, then what the builds say."""
    # Products asked for by name (spec.engine.gpuProducts) that get no engine make the
    # engines not ready: the user asked for them. Products merely found on the cluster's
    # nodes do not hold back the engines of the others (a new GPU type joining the
    # cluster must not take every service down); they are listed, and the phase says
    # Degraded.
    rejected = plan.rejected if plan.source == "spec" or not plan.targets else ()
    if blockers:
        return _condition("False", blockers[0].reason, "; ".join(b.message for b in blockers))
    if not plan.targets and not rejected:
        return _condition(
            "False",
            "NoEligibleGPUNodes",
            "no Ready GPU node matches the service's nodeSelector, affinity, "
            "tolerations and serving.gpusPerReplica (set spec.engine.gpuProducts to build "
            "ahead of the nodes)",
        )
    if rejected:
        more = f" (and {len(rejected) - 1} more)" if len(rejected) > 1 else ""
        return _condition("False", rejected[0].reason, rejected[0].message + more)
    return _builds_condition(plan, states)


def _builds_condition(plan: EnginePlan, states: Mapping[str, EngineState]) -> dict[str, str]:
    """EngineReady from the states of the engines to build: all Ready, some Failed (for good,
    or retrying), or still Pending or Building."""
    by_state: dict[str, list[str]] = {}
    for t in plan.targets:
        by_state.setdefault(states[t.key].state, []).append(t.identity.gpu_arch)
    if set(by_state) == {"Ready"}:
        message = f"engines ready for {', '.join(sorted(by_state['Ready']))}"
        for left_out in plan.rejected:
            message += f"; no engine for {left_out.product}: {left_out.message}"
        return _condition("True", "EnginesBuilt", message)
    if "Failed" in by_state:
        failed = [states[t.key] for t in plan.targets if states[t.key].state == "Failed"]
        final = [s for s in failed if s.next_retry is None and s.action != "create"]
        reason = "BuildFailed" if final else "BuildRetrying"
        return _condition("False", reason, (final or failed)[0].message)
    pending = [t for t in plan.targets if states[t.key].state != "Ready"]
    reasons = [states[t.key].reason for t in pending if states[t.key].reason]
    return _condition(
        "False",
        reasons[0] if reasons else "Building",
        "; ".join(states[t.key].message for t in pending),
    )


def _phase(cond: Mapping[str, str], entries: Sequence[Mapping[str, Any]], blocked: bool) -> str:
    """The phase the engines give the service (plan_service promotes Deploying to Ready once
    serving is)."""
    building = (
        any(e["state"] in ("Pending", "Building") for e in entries)
        or cond["reason"] == "BuildRetrying"
    ) and not blocked
    any_failed = any(e["state"] == "Failed" for e in entries)
    any_ready = any(e["state"] == "Ready" for e in entries)
    if cond["status"] == "True":
        return "Degraded" if any_failed else "Deploying"
    if building:
        return "BuildingEngine"
    if any_failed:
        # Some GPU products have an engine: the service can run there, on fewer products.
        return "Degraded" if any_ready else "Failed"
    return "Pending"
