"""The operator (`cosyvoice-operator ...`, same arguments) with a log of every request it
makes, attributed to the service whose pass made it: a benchmark instrument
(`control_loop.py` runs the operator through it).

    BENCH_REQUEST_LOG=requests.jsonl python bench/request_log_operator.py run -n NS ...

One JSON line per request the operator's client sends through `Kube.request` (every write
goes there; watches do not): `t` (Unix time after the answer), `verb`, `path` (for a POST, the
collection; `name` is the body's), `status` (the HTTP status, 0 when no answer came),
`service` (`namespace/name` of the service whose effect it carried out, or null for requests
outside an effect: lists, the version probe) and `engine_ready` (true on the status write
that sets the service's EngineReady condition to True). Nothing of the operator is changed
but these two methods wrapped; the cost is one line written per request (line-buffered, so
that a SIGKILLed operator's log is complete up to its last request).
"""

from __future__ import annotations

import contextvars
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

from cosyvoice_operator.api.effects import PatchStatus
from cosyvoice_operator.cli.main import main
from cosyvoice_operator.shell.apply import Applier
from cosyvoice_operator.shell.kube import Kube, KubeError

# (the service as namespace/name, whether this effect sets EngineReady=True)
_EFFECT: contextvars.ContextVar[tuple[str, bool] | None] = contextvars.ContextVar(
    "effect", default=None
)


def sets_engine_ready(effect: object) -> bool:
    """Whether a status patch sets the EngineReady condition to True."""
    if not isinstance(effect, PatchStatus):
        return False
    conditions = effect.changes.get("conditions") or []
    return any(
        isinstance(c, Mapping) and c.get("type") == "EngineReady" and c.get("status") == "True"
        for c in conditions
    )


def install(out: IO[str]) -> None:
    """Wrap `Applier.carry_out` (which service) and `Kube.request` (the line)."""
    carry_out = Applier.carry_out
    request = Kube.request

    async def logged_carry_out(
        self: Applier, namespace: str, effect: Any, service: Mapping[str, Any] | None = None
    ) -> None:
        name = ((service or {}).get("metadata") or {}).get("name")
        token = _EFFECT.set((f"{namespace}/{name}", sets_engine_ready(effect)) if name else None)
        try:
            await carry_out(self, namespace, effect, service)
        finally:
            _EFFECT.reset(token)

    async def logged_request(self: Kube, verb: str, path: str, *args: Any, **kwargs: Any) -> Any:
        body = kwargs.get("body", args[1] if len(args) > 1 else None)
        status = 200
        try:
            return await request(self, verb, path, *args, **kwargs)
        except KubeError as exc:
            status = exc.status
            raise
        finally:
            effect = _EFFECT.get()
            name = (body.get("metadata") or {}).get("name") if isinstance(body, Mapping) else None
            line = {
                "t": round(time.time(), 3),
                "verb": verb,
                "path": path,
                "name": name,
                "status": status,
                "service": effect[0] if effect else None,
                "engine_ready": bool(effect and effect[1]),
            }
            out.write(json.dumps(line) + "\n")

    Applier.carry_out = logged_carry_out  # type: ignore[method-assign]
    Kube.request = logged_request  # type: ignore[method-assign]


if __name__ == "__main__":
    with open(os.environ["BENCH_REQUEST_LOG"], "a", buffering=1) as log_file:
        install(log_file)
        sys.exit(main(sys.argv[1:]))
