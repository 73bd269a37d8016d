"""Events for changes of the running fleet (pure): every change of the replica count the
serving Deployments are sized to is said, with where the count comes from (issue 23:
switching a service to DryRun shrank its fleet from 2 to 1 with no Event)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cosyvoice_operator.api.effects import PostEvent
from cosyvoice_operator.api.spec import ServiceSpec


def _desired_total(st: Mapping[str, Any]) -> int | None:
    entries = st.get("serving") or []
    return sum(int(e.get("desiredReplicas") or 0) for e in entries) if entries else None


def resize_event(
    previous: Mapping[str, Any], new: Mapping[str, Any], svc: ServiceSpec
) -> PostEvent | None:
    """The Event of a status whose serving shares add up to another total than before
    (`previous` and `new` are statuses): switching the autoscaler to DryRun or off resizes
    the running fleet to spec.replicas, back to Active to the autoscaler's count; in Active
    mode it follows the autoscaler's ScaledUp / ScaledDown (the decision) as the change of
    the fleet itself. None for no change, or before anything serves."""
    before, after = _desired_total(previous), _desired_total(new)
    if before is None or after is None or before == after:
        return None
    a = svc.autoscaling
    if a.enabled and a.mode == "Active":
        source = "the autoscaler's count (status.autoscaling.desiredReplicas)"
    elif a.enabled:
        source = (
            "spec.replicas, because spec.autoscaling.mode is DryRun: the autoscaler's "
            "decisions (status.autoscaling) are reported, not applied"
        )
    else:
        source = "spec.replicas (autoscaling is off)"
    return PostEvent("Normal", "Resized", f"serving replicas {before} -> {after}: {source}")
