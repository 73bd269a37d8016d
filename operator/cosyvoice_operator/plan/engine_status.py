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
    if plan.checkpoint is not None:
        # vLLM's checkpoint serves every product: one entry, without product or architecture.
        st = states[plan.checkpoint.key]
        entry = {
            "gpuProduct": "",
            "gpuArch": "",
            "artifact": "checkpoint",
            "key": plan.checkpoint.key,
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
    keys: dict[str, str] = {}
    for e in entries:
        keys[e["key"] or e["gpuProduct"]] = e["state"]
    if not keys:
        return "None"
    states = list(keys.values())
    ready = states.count("Ready")
    if ready == len(states):
        return "Ready" if len(states) == 1 else f"Ready {ready}/{len(states)}"
    if "Failed" in states and "Building" not in states and "Pending" not in states:
        return f"Failed {states.count('Failed')}/{len(states)}"
    if "Building" in states:
        return f"Building {ready}/{len(states)}"
    return f"Pending {ready}/{len(states)}"


def engine_status(
    plan: EnginePlan | None,
    states: Mapping[str, EngineState],
    blockers: Sequence[Blocker],
    spec_error: str | None,
    previous: Mapping[str, Any],
    generation: int,
    now: dt.datetime,
) -> dict[str, Any]:
    """The engine part of the status: engines, summary, phase and EngineReady (serving.py
    reports Available, Progressing, replicas and the READY column)."""
    prev_conditions = previous.get("conditions") or []
    if spec_error is not None:
        conds = conditions.merge(
            prev_conditions,
            [
                {
                    "type": "EngineReady",
                    "status": "False",
                    "reason": "InvalidSpec",
                    "message": spec_error,
                }
            ],
            generation,
            now,
        )
        return {
            "observedGeneration": generation,
            "phase": "Failed",
            "conditions": conds,
            "engineSummary": "Invalid",
        }
    assert plan is not None
    entries = engine_entries(plan, states)
    summary = engine_summary(entries)
    all_built = bool(plan.targets) and all(states[t.key].state == "Ready" for t in plan.builds)
    # Products asked for by name (spec.engine.gpuProducts) that get no engine make the
    # engines not ready: the user asked for them. Products merely found on the cluster's
    # nodes do not hold back the engines of the others (a new GPU type joining the
    # cluster must not take every service down); they are listed, and the phase says
    # Degraded.
    rejected = plan.rejected if plan.source == "spec" or not plan.targets else ()
    # A blocker only matters to engines still to be built.
    blockers = [] if all_built else list(blockers)
    if blockers:
        cond = {
            "type": "EngineReady",
            "status": "False",
            "reason": blockers[0].reason,
            "message": "; ".join(b.message for b in blockers),
        }
        for e in entries:
            if e["state"] != "Ready":
                e["message"] = cond["message"]
    elif not plan.targets and not rejected:
        cond = {
            "type": "EngineReady",
            "status": "False",
            "reason": "NoEligibleGPUNodes",
            "message": "no Ready GPU node matches the service's nodeSelector, affinity, "
            "tolerations and serving.gpusPerReplica (set spec.engine.gpuProducts to build "
            "ahead of the nodes)",
        }
    elif rejected:
        cond = {
            "type": "EngineReady",
            "status": "False",
            "reason": rejected[0].reason,
            "message": rejected[0].message
            + (f" (and {len(rejected) - 1} more)" if len(rejected) > 1 else ""),
        }
    else:
        by_state: dict[str, list[str]] = {}
        for t in plan.builds:
            by_state.setdefault(states[t.key].state, []).append(
                t.identity.gpu_arch or "the vLLM checkpoint"
            )
        if set(by_state) == {"Ready"}:
            message = f"engines ready for {', '.join(sorted(by_state['Ready']))}"
            for left_out in plan.rejected:
                message += f"; no engine for {left_out.product}: {left_out.message}"
            cond = {
                "type": "EngineReady",
                "status": "True",
                "reason": "EnginesBuilt",
                "message": message,
            }
        elif "Failed" in by_state:
            failed = [states[t.key] for t in plan.builds if states[t.key].state == "Failed"]
            final = [s for s in failed if s.next_retry is None and s.action != "create"]
            cond = {
                "type": "EngineReady",
                "status": "False",
                "reason": "BuildFailed" if final else "BuildRetrying",
                "message": (final or failed)[0].message,
            }
        else:
            pending = [s for s in by_state if s != "Ready"]
            reasons = [
                states[t.key].reason
                for t in plan.builds
                if states[t.key].state in pending and states[t.key].reason
            ]
            cond = {
                "type": "EngineReady",
                "status": "False",
                "reason": reasons[0] if reasons else "Building",
                "message": "; ".join(
                    states[t.key].message for t in plan.builds if states[t.key].state in pending
                ),
            }
    engines_ready = cond["status"] == "True"
    building = (
        any(e["state"] in ("Pending", "Building") for e in entries)
        or cond["reason"] == "BuildRetrying"
    ) and not blockers
    any_failed = any(e["state"] == "Failed" for e in entries)
    any_ready = any(e["state"] == "Ready" for e in entries)
    if engines_ready:
        phase = "Degraded" if any_failed else "Deploying"
    elif building:
        phase = "BuildingEngine"
    elif any_failed:
        # Some GPU products have an engine: the service can run there, on fewer products.
        phase = "Degraded" if any_ready else "Failed"
    else:
        phase = "Pending"
    return {
        "observedGeneration": generation,
        "phase": phase,
        "engines": entries,
        "engineSummary": summary,
        "conditions": conditions.merge(prev_conditions, [cond], generation, now),
    }
