"""kopf handlers: read the world, call the pure core, write the result back.

One reconcile function serves every trigger (create, spec update, operator restart, and a
periodic resync that follows Jobs the service itself never hears about). It is idempotent:
every write is create-if-absent or a status patch computed from scratch, so running it
twice, or in two operator processes at once, converges on the same objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.aio.client.exceptions import ApiException

from . import buildjob, config, engine, gpus, peering, status
from .kube import Kube, api_error
from .spec import ServiceSpec, SpecError, parse

GROUP, VERSION, PLURAL = "tts.cosyvoice.dev", "v1alpha1", "cosyvoiceservices"
CONFIG = config.load()


# The namespaces the operator serves (empty: all); set by `cosyvoice-operator run`.
SERVED_NAMESPACES: tuple[str, ...] = ()
# kopf peering (name, this process's priority), or None when the operator runs standalone.
PEERING: tuple[str, int] | None = None
log = logging.getLogger(__name__)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Handler progress in annotations, not in status: the CRD's status schema is strict
    # (unknown status fields would be pruned, and kopf would lose track of its handlers).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # kopf posts an Event per handler run at INFO; the operator posts its own meaningful ones.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.peering.lifetime = CONFIG.peering_lifetime_seconds
    memo.kube = await Kube.connect()
    memo.resync = asyncio.create_task(
        resync_forever(memo.kube, SERVED_NAMESPACES, CONFIG.resync_seconds, PEERING)
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    task: asyncio.Task[None] | None = getattr(memo, "resync", None)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    kube: Kube | None = getattr(memo, "kube", None)
    if kube is not None:
        await kube.close()


async def _blockers(
    kube: Kube, spec: ServiceSpec, namespace: str
) -> tuple[list[status.Blocker], buildjob.Cache | None]:
    """What keeps any build from starting (checked before a Job is made, so none storms),
    and the engine cache claim when it exists."""
    found: list[status.Blocker] = []
    claim = spec.engine.cache_claim_name
    uid = await kube.claim_uid(namespace, claim)
    if uid is None:
        found.append(
            status.Blocker(
                "CacheClaimMissing",
                f"PersistentVolumeClaim {namespace}/{claim} (spec.engine.cacheClaimName) does not "
                "exist: create a ReadWriteMany claim of that name for the engine cache",
            )
        )
    model_claim = spec.model.pvc_claim
    if model_claim and await kube.claim_uid(namespace, model_claim) is None:
        found.append(
            status.Blocker(
                "ModelClaimMissing",
                f"PersistentVolumeClaim {namespace}/{model_claim} (from spec.model.uri) "
                "does not exist",
            )
        )
    secret = spec.model.credentials_secret
    if secret and not await kube.secret_exists(namespace, secret):
        found.append(
            status.Blocker(
                "CredentialsSecretMissing",
                f"Secret {namespace}/{secret} (spec.model.credentialsSecret) does not exist",
            )
        )
    return found, (buildjob.Cache(claim, uid) if uid is not None else None)


async def _engine_state(
    kube: Kube,
    target: engine.EngineTarget,
    svc: ServiceSpec,
    namespace: str,
    body: Mapping[str, Any],
    previous: Mapping[str, Mapping[str, Any]],
    blockers: list[status.Blocker],
    cache: buildjob.Cache | None,
) -> buildjob.EngineState:
    """Assess one engine and carry out what the assessment asks for."""
    ident = target.identity
    settings = CONFIG.build
    if cache is None:  # CacheClaimMissing
        return buildjob.EngineState("Pending", blockers[0].message)
    record = await kube.get_config_map(namespace, buildjob.record_name(ident, cache))
    if record is None and blockers:
        # A built engine stays usable when, say, the download credentials go away; only a
        # build that has yet to happen is blocked.
        return buildjob.EngineState("Pending", blockers[0].message)
    jobs = (
        await kube.list_jobs(namespace, buildjob.selector(ident, cache)) if record is None else []
    )
    latest = buildjob.latest_job(jobs)
    pods: list[dict[str, Any]] = []
    if latest is not None:
        pods = await kube.list_pods(namespace, f"job-name={latest['metadata']['name']}")
    now = dt.datetime.now(dt.UTC)
    st = buildjob.assess(ident, record, jobs, pods, now, settings)
    if st.action == "create":
        job = buildjob.render_job(target, svc, namespace, st.next_attempt, settings, cache)
        name = job["metadata"]["name"]
        try:
            created = await kube.create_if_absent(job)
        except ApiException as exc:
            # A quota, an admission webhook or a field the API rejects: say so on the
            # service (the operator's log is not where users look) and try again next pass.
            message = (
                f"the API server refused build Job {name}: {api_error(exc)}; "
                "retried on every resync"
            )
            # One Event when it starts, not one per resync.
            if (previous.get(ident.key) or {}).get("message") != message:
                await kube.post_event(body, "Warning", "JobCreateFailed", message)
            return buildjob.EngineState(
                "Pending", message, attempts=st.next_attempt - 1, reason="JobCreateFailed"
            )
        if created:
            await kube.post_event(
                body,
                "Normal",
                "EngineBuildStarted",
                f"{name}: building engine {ident.key} for {ident.gpu_arch} "
                f"({', '.join(target.products)}), attempt {st.next_attempt}",
            )
        st = buildjob.EngineState(
            "Building",
            f"{name} {'created' if created else 'joined (already in flight)'} "
            f"(attempt {st.next_attempt})",
            job=name,
            attempts=st.next_attempt,
        )
    elif st.action in ("record", "record-failure"):
        failed = st.action == "record-failure"
        record_body = buildjob.render_record(
            ident,
            namespace,
            st.job,
            st.message if failed else st.result,
            now,
            cache,
            state="Failed" if failed else "Ready",
        )
        await kube.create_if_absent(record_body)
    if (previous.get(ident.key) or {}).get("state") != st.state:
        if st.state == "Ready":
            await kube.post_event(
                body,
                "Normal",
                "EngineReady",
                f"engine {ident.key} ({ident.gpu_arch}): {st.message}",
            )
        elif st.state == "Failed":
            await kube.post_event(
                body, "Warning", "EngineBuildFailed", f"engine {ident.key}: {st.message}"
            )
    return st


async def gpu_nodes(kube: Kube) -> list[gpus.GPUNode]:
    """The nodes that carry a GPU product label."""
    found = (gpus.GPUNode.from_node(raw) for raw in await kube.list_nodes())
    return [node for node in found if node is not None]


async def reconcile(
    kube: Kube, body: Mapping[str, Any], nodes: list[gpus.GPUNode] | None = None
) -> dict[str, Any]:
    """The status fields that change for this service, after acting on its engines.

    `nodes` lets a caller that reconciles many services read the nodes once for all.
    """
    meta = body.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    generation = int(meta.get("generation") or 0)
    previous = dict(body.get("status") or {})
    prev_entries = {e.get("key", ""): e for e in previous.get("engines") or []}
    now = dt.datetime.now(dt.UTC)
    try:
        svc = parse(body.get("spec") or {})
    except SpecError as exc:
        new = status.engine_status(None, {}, [], str(exc), previous, generation, 0, now)
        return _changes(previous, new)
    if svc.engine.gpu_products:
        nodes = []  # the products are given: no need to look at the nodes
    elif nodes is None:
        nodes = await gpu_nodes(kube)
    plan = engine.plan(svc, nodes, CONFIG.build.default_builder_image)
    blockers, cache = await _blockers(kube, svc, namespace)
    states: dict[str, buildjob.EngineState] = {}
    for target in plan.targets:
        states[target.key] = await _engine_state(
            kube, target, svc, namespace, body, prev_entries, blockers, cache
        )
    new = status.engine_status(
        plan, states, blockers, None, previous, generation, svc.replicas, now
    )
    reason = next((c["reason"] for c in new["conditions"] if c["type"] == "EngineReady"), "")
    if (
        blockers
        and reason == blockers[0].reason
        and previous.get("engineSummary") != new.get("engineSummary")
    ):
        await kube.post_event(body, "Warning", blockers[0].reason, blockers[0].message)
    return _changes(previous, new)


def _changes(previous: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Only what changed: an unchanged status makes no API call at all."""
    return {key: value for key, value in new.items() if previous.get(key) != value}


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def on_change(body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, **_: Any) -> None:
    patch.status.update(await reconcile(memo.kube, body))


async def resync_forever(
    kube: Kube,
    namespaces: tuple[str, ...],
    interval: float,
    peering_of: tuple[str, int] | None = None,
) -> None:
    """Re-examine every service on a period: build Jobs finish, back-offs expire and GPU
    nodes come and go without the service itself changing.

    One loop for the operator rather than a kopf timer per object: kopf timers put a finalizer
    on every service, and a service would then hang on deletion whenever the operator is not
    running (uninstalled first, say). Nothing here needs to run at deletion: engines are
    shared and outlive services.
    """
    standing_by: str | None = None
    while True:
        await asyncio.sleep(interval)
        if peering_of is not None:
            # kopf pauses its handlers on a standby replica, but not this loop.
            name, priority = peering_of
            try:
                statuses = await kube.peering_statuses(name, namespaces)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("resync: reading the peering object %r failed", name)
                continue
            why = peering.standby_reason(statuses, priority, dt.datetime.now(dt.UTC))
            if why != standing_by:
                if why is not None:
                    log.info("resync paused: %s", why)
                else:
                    log.info("resync active: no live peer outranks priority %d", priority)
            standing_by = why
            if why is not None:
                continue
        try:
            services = await kube.list_services(namespaces)
            nodes = await gpu_nodes(kube)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("resync: listing services failed; next try in %.0fs", interval)
            continue
        for listed in services:
            listed_meta = listed.get("metadata") or {}
            namespace, name = listed_meta.get("namespace", ""), listed_meta.get("name", "")
            try:
                await resync_one(kube, namespace, name, nodes)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("resync of %s/%s failed", namespace, name)


async def resync_one(kube: Kube, namespace: str, name: str, nodes: list[gpus.GPUNode]) -> None:
    """Reconcile one service as it is now, and write its status only if it is still so.

    The service is read afresh rather than taken from the pass's listing: a spec edited
    while the pass went through other services must not get a build Job for its old
    engine. The status patch carries the resourceVersion that was read, so a change made
    meanwhile (an edit, kopf's own handler writing status) wins; the next pass redoes it.
    """
    body = await kube.get_service(namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return
    changes = await reconcile(kube, body, nodes)
    if not changes:
        return
    version = str(body["metadata"].get("resourceVersion") or "")
    if not await kube.patch_service_status(namespace, name, changes, version):
        log.debug("%s/%s changed while it was reconciled; the next pass redoes it", namespace, name)
