"""Every change of the live fleet has an Event (issue 23: switching to DryRun shrank the fleet
from 2 to 1 with no Event), saying where the count comes from."""

from __future__ import annotations

from typing import Any

from cosyvoice_operator.api.effects import PostEvent
from cosyvoice_operator.api.spec import parse
from cosyvoice_operator.plan.fleet_events import resize_event


def svc(replicas: int = 1, **autoscaling: Any) -> Any:
    return parse(
        {
            "model": {"variant": "cosyvoice3", "uri": "hf://a/b"},
            "replicas": replicas,
            "autoscaling": {"minReplicas": 1, "maxReplicas": 8, **autoscaling},
        }
    )


def status(*shares: int, decision: tuple[int, int] | None = None) -> dict[str, Any]:
    st: dict[str, Any] = {
        "serving": [{"gpuArch": f"sm_{i}", "desiredReplicas": n} for i, n in enumerate(shares)]
    }
    if decision is not None:
        st["autoscaling"] = {"lastDecision": {"from": decision[0], "to": decision[1]}}
    return st


def test_switching_to_dry_run_resizes_to_spec_replicas_with_an_event() -> None:
    event = resize_event(status(1, 1, decision=(1, 2)), status(1), svc(enabled=True, mode="DryRun"))
    assert isinstance(event, PostEvent) and (event.type, event.reason) == ("Normal", "Resized")
    assert event.message.startswith("serving replicas 2 -> 1: spec.replicas, because")
    assert "DryRun" in event.message and "reported, not applied" in event.message


def test_autoscaling_off_and_kubectl_scale_resize_with_an_event() -> None:
    event = resize_event(status(2), status(3), svc(3))
    assert event is not None and event.message == (
        "serving replicas 2 -> 3: spec.replicas (autoscaling is off)"
    )


def test_the_autoscalers_count_applied_is_an_event_too() -> None:
    # After its ScaledUp (the decision), and back to Active from DryRun (no new decision).
    event = resize_event(status(1, decision=(1, 3)), status(2, 1), svc(enabled=True))
    assert event is not None and event.message == (
        "serving replicas 1 -> 3: the autoscaler's count (status.autoscaling.desiredReplicas)"
    )


def test_no_event_without_a_change_or_before_anything_serves() -> None:
    assert resize_event(status(2), status(1, 1), svc(2)) is None  # split, same total
    assert resize_event({}, status(2), svc(2)) is None  # first Deployments
