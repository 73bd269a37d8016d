"""The protobuf text format of Triton's model configs (``config.pbtxt``), written from plain
dicts (pure).

A message is a ``dict[str, Value]``: a scalar field is a str (quoted), int, bool or
:class:`EnumValue` (written bare), a repeated scalar a list of them, a nested message a dict,
a repeated message a list of dicts (each on one line when it fits, else as a block). Keys are
written in the dict's order, so the text is deterministic for golden files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True)
class EnumValue:
    """An enum value (``TYPE_FP32``, ``KIND_GPU``): written without quotes."""

    name: str


Value: TypeAlias = "str | int | bool | EnumValue | list[Value] | dict[str, Value]"


def _quote(text: str) -> str:
    if any(not ch.isprintable() for ch in text):
        raise ValueError(f"unprintable character in {text!r}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _scalar(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, EnumValue):
        return value.name
    if isinstance(value, str):
        return _quote(value)
    raise TypeError(f"not a scalar: {value!r}")


def _inline(message: dict[str, Value]) -> str:
    parts: list[str] = []
    for key, value in message.items():
        if isinstance(value, dict):
            parts.append(f"{key} {_inline(value)}")
        elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
            raise TypeError(f"{key}: a list of messages is not written inline")
        elif isinstance(value, list):
            parts.append(f"{key}: {_scalar_list(value)}")
        else:
            parts.append(f"{key}: {_scalar(value)}")
    return "{ " + ", ".join(parts) + " }"


def _scalar_list(values: list[Value]) -> str:
    return "[ " + "".join(f"{_scalar(v)}, " for v in values)[:-2] + " ]" if values else "[ ]"


_WIDTH = 110


def _lines(message: dict[str, Value], indent: str) -> list[str]:
    out: list[str] = []
    for key, value in message.items():
        if isinstance(value, dict):
            out += [f"{indent}{key} {{", *_lines(value, indent + "  "), f"{indent}}}"]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            # Each entry on one line when it fits (tensors, parameters), else as a block.
            out.append(f"{indent}{key} [")
            for i, item in enumerate(value):
                assert isinstance(item, dict)
                comma = "," if i < len(value) - 1 else ""
                one_line = f"{indent}  {_inline(item)}{comma}"
                if len(one_line) <= _WIDTH and not _nested_lists(item):
                    out.append(one_line)
                else:
                    out += [f"{indent}  {{", *_lines(item, indent + "    "), f"{indent}  }}{comma}"]
            out.append(f"{indent}]")
        elif isinstance(value, list):
            out.append(f"{indent}{key}: {_scalar_list(value)}")
        else:
            out.append(f"{indent}{key}: {_scalar(value)}")
    return out


def _nested_lists(message: dict[str, Value]) -> bool:
    return any(
        isinstance(v, list) and any(isinstance(x, dict) for x in v) for v in message.values()
    )


def message_text(message: dict[str, Value]) -> str:
    """The text of one message, as Triton reads a ``config.pbtxt``."""
    return "\n".join(_lines(message, "")) + "\n"
