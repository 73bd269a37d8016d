"""kopf hooks: start the control loop, stop it, and report its health.

kopf hosts the process (logging, signals, the liveness endpoint, peering between replicas);
the control loop itself (controller.py) is not a set of kopf resource handlers. kopf's
handlers would make a second writer of each service (their progress and last-handled
annotations, a status patched from a copy without precondition) and could not follow the
Jobs, pods, records, claims and nodes a service depends on; the controller watches all of
them and writes each status from one place.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from cosyvoice_operator.plan import cleanup
from cosyvoice_operator.plan.service import Policy
from cosyvoice_operator.shell import config
from cosyvoice_operator.shell.controller import Controller, Settings
from cosyvoice_operator.shell.kube import ConnectError, Kube

CONFIG = config.load()

# The namespaces the operator serves (empty: all); set by `cosyvoice-operator run`.
SERVED_NAMESPACES: tuple[str, ...] = ()
# kopf peering (name, this process's priority), or None when the operator runs standalone.
PEERING: tuple[str, int] | None = None
log = logging.getLogger(__name__)


def settings_from(cfg: config.OperatorConfig, peering: tuple[str, int] | None) -> Settings:
    return Settings(
        policy=Policy(
            build=cfg.build,
            serving=cfg.serving,
            allowed_image_prefixes=cfg.allowed_image_prefixes,
            limits=cfg.limits,
        ),
        cleanup=cleanup.CleanupSettings(
            retention_seconds=cfg.engine_retention_seconds,
            superseded_grace_seconds=cfg.superseded_grace_seconds,
        ),
        workers=cfg.workers,
        peering=peering,
        prometheus_url=cfg.prometheus_url,
        metrics_window_seconds=cfg.metrics_window_seconds,
        allowed_prometheus_urls=cfg.allowed_prometheus_urls,
    )


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf posts an Event per handler run at INFO; the operator posts its own meaningful ones.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.peering.lifetime = CONFIG.peering_lifetime_seconds
    try:
        kube = await Kube.connect()
    except ConnectError as exc:
        # One clear line and a stop; kopf would otherwise retry with a traceback a minute.
        raise kopf.PermanentError(str(exc)) from None
    memo.kube = kube
    memo.controller = Controller(kube, SERVED_NAMESPACES, settings_from(CONFIG, PEERING))
    await memo.controller.start()


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    controller: Controller | None = getattr(memo, "controller", None)
    if controller is not None:
        await controller.stop()
    kube: Kube | None = getattr(memo, "kube", None)
    if kube is not None:
        await kube.close()


@kopf.on.probe(id="controlLoop")
def control_loop(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """The liveness probe's view: fails (HTTP 500) when the loop is dead or stuck."""
    controller: Controller | None = getattr(memo, "controller", None)
    if controller is None:
        raise kopf.PermanentError("the control loop has not started")
    problem = controller.health()
    if problem is not None:
        raise kopf.PermanentError(f"control loop unhealthy: {problem}")
    return {
        "active": controller.active.is_set(),
        "standby": controller.standby_reason,
        "queued": len(controller.queue),
        "passes": controller.passes,
        # What this process asked of the API server, by verb and resource (watches
        # included): the steady state should add nothing here but watch renewals.
        "requests": {f"{v} {r}": n for (v, r), n in sorted(controller.kube.requests.items())},
    }
