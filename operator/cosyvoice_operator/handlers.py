"""kopf handlers: read the world, call the pure core, write the result back.

One reconcile function serves every trigger (create, spec update, operator restart, and a
timer that follows Jobs the service itself never hears about). It is idempotent: every write
is create-if-absent or a status patch computed from scratch, so running it twice, or in two
operator processes at once, converges on the same objects.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from . import buildjob, config, engine, gpus, status
from .kube import Kube
from .spec import ServiceSpec, SpecError, parse

GROUP, VERSION, PLURAL = "tts.cosyvoice.dev", "v1alpha1", "cosyvoiceservices"
CONFIG = config.load()


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Handler progress in annotations, not in status: the CRD's status schema is strict
    # (unknown status fields would be pruned, and kopf would lose track of its handlers).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 300
    memo.kube = await Kube.connect()


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    kube: Kube | None = getattr(memo, "kube", None)
    if kube is not None:
        await kube.close()


async def _blockers(kube: Kube, spec: ServiceSpec, namespace: str) -> list[status.Blocker]:
    """What keeps any build from starting; checked before a Job is made, so none storms."""
    found: list[status.Blocker] = []
    claim = spec.engine.cache_claim_name
    if not await kube.exists("PersistentVolumeClaim", namespace, claim):
        found.append(
            status.Blocker(
                "CacheClaimMissing",
                f"PersistentVolumeClaim {namespace}/{claim} (spec.engine.cacheClaimName) does not "
                "exist: create a ReadWriteMany claim of that name for the engine cache",
            )
        )
    model_claim = spec.model.pvc_claim
    if model_claim and not await kube.exists("PersistentVolumeClaim", namespace, model_claim):
        found.append(
            status.Blocker(
                "ModelClaimMissing",
                f"PersistentVolumeClaim {namespace}/{model_claim} (from spec.model.uri) "
                "does not exist",
            )
        )
    secret = spec.model.credentials_secret
    if secret and not await kube.exists("Secret", namespace, secret):
        found.append(
            status.Blocker(
                "CredentialsSecretMissing",
                f"Secret {namespace}/{secret} (spec.model.credentialsSecret) does not exist",
            )
        )
    return found


async def _engine_state(
    kube: Kube,
    target: engine.EngineTarget,
    svc: ServiceSpec,
    namespace: str,
    body: kopf.Body,
    previous: Mapping[str, str],
) -> buildjob.EngineState:
    """Assess one engine and carry out what the assessment asks for."""
    ident = target.identity
    settings = CONFIG.build
    selector = f"{buildjob.KEY_LABEL}={ident.key}"
    record = await kube.get_config_map(namespace, buildjob.record_name(ident))
    jobs = await kube.list_jobs(namespace, selector) if record is None else []
    pods: list[dict[str, Any]] = []
    if jobs:
        latest = max(
            jobs, key=lambda j: int(j["metadata"]["labels"].get(buildjob.ATTEMPT_LABEL, 0))
        )
        pods = await kube.list_pods(namespace, f"job-name={latest['metadata']['name']}")
    now = dt.datetime.now(dt.UTC)
    st = buildjob.assess(ident, record, jobs, pods, now, settings)
    if st.action == "create":
        job = buildjob.render_job(target, svc, namespace, st.next_attempt, settings)
        created = await kube.create_if_absent(job)
        name = job["metadata"]["name"]
        if created:
            kopf.info(
                body,
                reason="EngineBuildStarted",
                message=f"{name}: building engine {ident.key} for {ident.gpu_arch} "
                f"({', '.join(target.products)}), attempt {st.next_attempt}",
            )
        st = buildjob.EngineState(
            "Building",
            f"{name} {'created' if created else 'joined (already in flight)'} "
            f"(attempt {st.next_attempt})",
            job=name,
            attempts=st.next_attempt,
        )
    elif st.action == "record":
        record_body = buildjob.render_record(ident, namespace, st.job, st.result, now)
        await kube.create_if_absent(record_body)
    if previous.get(ident.key) != st.state:
        if st.state == "Ready":
            kopf.info(
                body,
                reason="EngineReady",
                message=f"engine {ident.key} ({ident.gpu_arch}): {st.message}",
            )
        elif st.state == "Failed":
            kopf.warn(body, reason="EngineBuildFailed", message=f"engine {ident.key}: {st.message}")
    return st


async def reconcile(
    body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, logger: logging.Logger | kopf.Logger
) -> None:
    kube: Kube = memo.kube
    namespace = body.metadata.namespace or "default"
    generation = int(body.metadata.get("generation") or 0)
    previous = dict(body.get("status") or {})
    prev_states = {e.get("key", ""): e.get("state", "") for e in previous.get("engines") or []}
    now = dt.datetime.now(dt.UTC)
    try:
        svc = parse(body.get("spec") or {})
    except SpecError as exc:
        new = status.engine_status(None, {}, [], str(exc), previous, generation, 0, now)
        _write_status(patch, previous, new)
        return
    nodes: list[gpus.GPUNode] = []
    if not svc.engine.gpu_products:
        for raw in await kube.list_nodes():
            node = gpus.GPUNode.from_node(raw)
            if node is not None:
                nodes.append(node)
    plan = engine.plan(svc, nodes, CONFIG.build.default_builder_image)
    blockers = await _blockers(kube, svc, namespace)
    states: dict[str, buildjob.EngineState] = {}
    for target in plan.targets:
        if blockers:
            states[target.key] = buildjob.EngineState("Pending", blockers[0].message)
            continue
        states[target.key] = await _engine_state(kube, target, svc, namespace, body, prev_states)
    desired = svc.replicas
    new = status.engine_status(plan, states, blockers, None, previous, generation, desired, now)
    if blockers and previous.get("engineSummary") != new.get("engineSummary"):
        kopf.warn(body, reason=blockers[0].reason, message=blockers[0].message)
    _write_status(patch, previous, new)


def _write_status(patch: kopf.Patch, previous: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Patch only what changed: an unchanged status makes no API call at all."""
    for key, value in new.items():
        if previous.get(key) != value:
            patch.status[key] = value


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def on_change(
    body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, logger: kopf.Logger, **_: Any
) -> None:
    await reconcile(body, memo, patch, logger)


@kopf.timer(GROUP, VERSION, PLURAL, interval=CONFIG.resync_seconds, initial_delay=1.0, backoff=5)
async def resync(
    body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, logger: kopf.Logger, **_: Any
) -> None:
    await reconcile(body, memo, patch, logger)
