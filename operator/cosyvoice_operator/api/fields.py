"""Reading a spec's fields: typed readers that name the field in their errors (as the CRD's
messages do), and the shapes of the core Kubernetes types a spec embeds (affinity,
tolerations), checked against what a stored object really holds."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# What no path, revision or image may hold although the CRD's patterns may have let it in
# (objects stored before the CRD tightened them): control characters (NUL, ESC and the other
# C0/C1 ones, DEL, Unicode line separators), command substitution, '.'/'..' segments.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# An image reference: registry/path[:tag][@digest], no spaces, quotes or shell syntax.
IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,511}$")


class SpecError(ValueError):
    """An invalid spec; ``field`` is the full path of the offending field."""

    def __init__(self, field_path: str, message: str) -> None:
        self.field = field_path
        super().__init__(f"{field_path}: {message}")


def obj(raw: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{path}.{key}", "must be an object")
    return value


def integer(raw: Mapping[str, Any], key: str, path: str, default: int, lo: int, hi: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{path}.{key}", f"must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise SpecError(f"{path}.{key}", f"must be between {lo} and {hi}, got {value}")
    return value


def enum(
    raw: Mapping[str, Any], key: str, path: str, choices: tuple[str, ...], default: str | None
) -> str:
    value = raw.get(key, default)
    if value is None:
        raise SpecError(f"{path}.{key}", f"is required (one of {', '.join(choices)})")
    if value not in choices:
        raise SpecError(f"{path}.{key}", f"must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def string(raw: Mapping[str, Any], key: str, default: str = "") -> str:
    value = raw.get(key, default)
    return "" if value is None else str(value)


def image(raw: Mapping[str, Any], key: str, path: str) -> str:
    value = string(raw, key)
    if value and not IMAGE.match(value):
        raise SpecError(
            f"{path}.{key}",
            f"must be an image reference (registry/repository[:tag][@digest]), got {value!r}",
        )
    return value


# ---- shapes of the core Kubernetes types the spec embeds (affinity, tolerations) -----------
# A shape is ("str", max length) | ("int", lo, hi) | ("enum", values) | ("list", shape, max
# items) | ("map", value shape, max keys) | ("obj", {field: shape}, required fields). The
# bounds are the CRD's (crds/): the operator checks what a stored object really holds, since
# an object admitted before the CRD had them, or a schema bypassed, must not crash a pass.

Shape = tuple[Any, ...]


def shape_list(item: Shape, max_items: int) -> Shape:
    return ("list", item, max_items)


LABEL_VALUE: Shape = ("str", 63)
LABEL_KEY: Shape = ("str", 317)


def _requirement(operators: tuple[str, ...]) -> Shape:
    return (
        "obj",
        {
            "key": LABEL_KEY,
            "operator": ("enum", operators),
            "values": shape_list(LABEL_VALUE, 64),
        },
        ("key", "operator"),
    )


_NODE_TERM: Shape = (
    "obj",
    {
        "matchExpressions": shape_list(
            _requirement(("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")), 32
        ),
        "matchFields": shape_list(
            _requirement(("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")), 32
        ),
    },
    (),
)
_LABEL_SELECTOR: Shape = (
    "obj",
    {
        "matchLabels": ("map", LABEL_VALUE, 64),
        "matchExpressions": shape_list(_requirement(("In", "NotIn", "Exists", "DoesNotExist")), 32),
    },
    (),
)
_POD_TERM: Shape = (
    "obj",
    {
        "labelSelector": _LABEL_SELECTOR,
        "namespaceSelector": _LABEL_SELECTOR,
        "namespaces": shape_list(("str", 63), 64),
        "topologyKey": LABEL_KEY,
        "matchLabelKeys": shape_list(LABEL_KEY, 32),
        "mismatchLabelKeys": shape_list(LABEL_KEY, 32),
    },
    ("topologyKey",),
)
_WEIGHT: Shape = ("int", 1, 100)
_POD_AFFINITY: Shape = (
    "obj",
    {
        "requiredDuringSchedulingIgnoredDuringExecution": shape_list(_POD_TERM, 16),
        "preferredDuringSchedulingIgnoredDuringExecution": shape_list(
            (
                "obj",
                {"weight": _WEIGHT, "podAffinityTerm": _POD_TERM},
                ("weight", "podAffinityTerm"),
            ),
            16,
        ),
    },
    (),
)
AFFINITY: Shape = (
    "obj",
    {
        "nodeAffinity": (
            "obj",
            {
                "requiredDuringSchedulingIgnoredDuringExecution": (
                    "obj",
                    {"nodeSelectorTerms": shape_list(_NODE_TERM, 16)},
                    ("nodeSelectorTerms",),
                ),
                "preferredDuringSchedulingIgnoredDuringExecution": shape_list(
                    (
                        "obj",
                        {"weight": _WEIGHT, "preference": _NODE_TERM},
                        ("weight", "preference"),
                    ),
                    16,
                ),
            },
            (),
        ),
        "podAffinity": _POD_AFFINITY,
        "podAntiAffinity": _POD_AFFINITY,
    },
    (),
)
TOLERATION: Shape = (
    "obj",
    {
        "key": LABEL_KEY,
        "operator": ("enum", ("", "Equal", "Exists")),
        "value": LABEL_VALUE,
        "effect": ("enum", ("", "NoSchedule", "PreferNoSchedule", "NoExecute")),
        "tolerationSeconds": ("int", -(2**63), 2**63 - 1),
    },
    (),
)


def check_shape(value: Any, shape: Shape, path: str) -> None:
    """Raise SpecError at the first place ``value`` does not have ``shape``."""
    kind = shape[0]
    if kind == "str":
        if not isinstance(value, str):
            raise SpecError(path, f"must be a string, got {value!r:.80}")
        if len(value) > shape[1] or CONTROL.search(value):
            raise SpecError(path, f"must be at most {shape[1]} printable characters")
    elif kind == "int":
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not shape[1] <= value <= shape[2]
        ):
            raise SpecError(path, f"must be an integer between {shape[1]} and {shape[2]}")
    elif kind == "enum":
        if value not in shape[1]:
            choices = ", ".join(repr(c) for c in shape[1])
            raise SpecError(path, f"must be one of {choices}, got {value!r:.80}")
    elif kind == "list":
        if not isinstance(value, list | tuple):
            raise SpecError(path, f"must be a list, got {value!r:.80}")
        if len(value) > shape[2]:
            raise SpecError(path, f"must have at most {shape[2]} items, has {len(value)}")
        for i, item in enumerate(value):
            check_shape(item, shape[1], f"{path}[{i}]")
    elif kind == "map":
        if not isinstance(value, Mapping):
            raise SpecError(path, f"must be an object, got {value!r:.80}")
        if len(value) > shape[2]:
            raise SpecError(path, f"must have at most {shape[2]} keys, has {len(value)}")
        for k, v in value.items():
            check_shape(k, LABEL_KEY, f"{path} key")
            check_shape(v, shape[1], f"{path}.{k}")
    else:  # obj
        if not isinstance(value, Mapping):
            raise SpecError(path, f"must be an object, got {value!r:.80}")
        fields, required = shape[1], shape[2]
        for name in required:
            if name not in value:
                raise SpecError(f"{path}.{name}", "is required")
        for name, item in value.items():
            if name not in fields:
                raise SpecError(f"{path}.{name}", f"is not a field of {path} (unknown field)")
            check_shape(item, fields[name], f"{path}.{name}")


def boolean(raw: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(f"{path}.{key}", f"must be true or false, got {value!r}")
    return value


def number(
    raw: Mapping[str, Any], key: str, path: str, default: float, lo: float, hi: float
) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{path}.{key}", f"must be a number, got {value!r}")
    if not lo <= value <= hi:
        raise SpecError(f"{path}.{key}", f"must be between {lo:g} and {hi:g}, got {value}")
    return float(value)
