"""What a reconcile asks the shell to do, as plain values (pure).

The planners (service, cleanup) return these; the controller carries them out. Tests
compare them as data, so "what would the operator do here" is a table, not a mock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CreateObject:
    """Create if absent (an object of that name already there counts as done)."""

    body: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])


@dataclass(frozen=True)
class DeleteObject:
    """Delete this exact object (by uid), saying why in the operator's log."""

    kind: str  # "Job" | "ConfigMap"
    namespace: str
    name: str
    uid: str
    why: str


@dataclass(frozen=True)
class PatchObject:
    """A JSON merge patch of an object the operator owns (e.g. an engine record)."""

    kind: str  # "ConfigMap"
    namespace: str
    name: str
    patch: Mapping[str, Any]


@dataclass(frozen=True)
class PostEvent:
    """An Event on the service being reconciled, or on `regarding` when given."""

    type: str  # Normal | Warning
    reason: str
    message: str
    regarding: Mapping[str, Any] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class PatchStatus:
    """Merge-patch the service's status, only if it is still at `resource_version`."""

    changes: Mapping[str, Any]
    resource_version: str


@dataclass(frozen=True)
class ApplyObject:
    """Server-side apply under the operator's field manager (the object as rendered)."""

    body: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])
