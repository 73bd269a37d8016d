"""One service's autoscaling pass: sample Prometheus, decide, write what changed.

The decision and what it writes are pure (`autoscaling/evaluation.py`); this module does the
I/O around them: the Prometheus sample (the only request it makes besides its status), the
metrics, and the status and Events through the applier. It writes no replica count into any
Deployment: `status.autoscaling.desiredReplicas` is written here, and the service's own pass
sizes the Deployments once that count reaches the cache (see routing.py).

The service's pods and Deployments carry its label whether they serve or route: the router's
(``app.kubernetes.io/component: router``) are neither counted in the fleet nor read as Triton
pods. In mode Router the router pods' figures are the signal (policy rule 4c) and the loop
also reads how many utterances the service's clients send per stream (orchestrator requests
over router streams): a gauge, and a Warning Event (at most one an hour per service) when
they send more than one per stream.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cosyvoice_operator.api import labels
from cosyvoice_operator.api.effects import PatchStatus, PostEvent
from cosyvoice_operator.api.spec import ROUTER, ServiceSpec, SpecError, parse
from cosyvoice_operator.autoscaling import evaluation, policy
from cosyvoice_operator.autoscaling import sample as samples
from cosyvoice_operator.autoscaling.policy import Decision, Observation, Recommendation
from cosyvoice_operator.autoscaling.sample import RouterSample, Sample
from cosyvoice_operator.render import triton
from cosyvoice_operator.shell import metrics
from cosyvoice_operator.shell.apply import Applier
from cosyvoice_operator.shell.caches import Caches
from cosyvoice_operator.shell.prometheus_source import PrometheusSources

# Our own unavailable reason: mode Router, and no router pod Ready to read.
NO_ROUTER = "NoReadyRouter"


def is_router(obj: Mapping[str, Any]) -> bool:
    """A router object or pod of a service (it carries the service's label too)."""
    found = (obj.get("metadata") or {}).get("labels") or {}
    return found.get(labels.COMPONENT_LABEL) == labels.ROUTER_COMPONENT


def status_effects(
    body: Mapping[str, Any],
    changes: Mapping[str, Any],
    events: Sequence[tuple[str, str, str]],
) -> tuple[PatchStatus | None, tuple[PostEvent, ...]]:
    """What `evaluation.status_update` returns, as the effects the applier carries out."""
    if not changes:
        return None, ()
    version = str(body["metadata"].get("resourceVersion") or "")
    return PatchStatus(dict(changes), version), tuple(PostEvent(*e) for e in events)


class Autoscaler:
    """The autoscaling passes of every service, with what they remember between passes:
    each service's recent recommendations (its stabilization windows)."""

    def __init__(
        self,
        caches: Caches,
        applier: Applier,
        prometheus_url: str,
        window_seconds: int,
        clock: Callable[[], dt.datetime],
        allowed_prometheus_urls: Sequence[str] = (),
    ) -> None:
        self.caches = caches
        self.applier = applier
        self.prometheus_url = prometheus_url
        self.window_seconds = window_seconds
        self.clock = clock
        self.recommendations: dict[tuple[str, str], tuple[Recommendation, ...]] = {}
        # When each service's clients were last warned of many utterances per stream.
        self.utterances_warned: dict[tuple[str, str], dt.datetime] = {}
        # Only the operator's own Prometheus and the ones it is configured to allow: a
        # service's prometheusUrl is otherwise a request from the operator's pod to anywhere.
        # A bounded set of clients, closed when dropped.
        self.sources = PrometheusSources(
            (prometheus_url, *allowed_prometheus_urls), window_seconds=window_seconds
        )

    async def evaluate(self, namespace: str, name: str) -> float | None:
        """One evaluation: sample, decide, write what changed; the next one after the
        service's evaluation interval. Stops (no requeue) when the service goes or turns its
        autoscaler off. Raises Conflict when the service changed meanwhile."""
        body = self.caches.services.get(namespace, name)
        ref = (namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.forget(namespace, name)
            return None
        try:
            svc = parse(body.get("spec") or {})
        except SpecError:
            return None
        if not svc.autoscaling.enabled:
            self.forget(namespace, name)
            return None
        interval = float(svc.autoscaling.evaluation_interval_seconds)
        deployments = [
            d for d in self.caches.world.deployments(namespace, name) if not is_router(d)
        ]
        if not deployments:
            return interval  # nothing serves yet: nothing to scale
        labelled = self.caches.world.serving_pods(namespace, name)
        pods = [p for p in labelled if not is_router(p)]
        routers = [p for p in labelled if is_router(p)] if svc.routing.mode == ROUTER else None
        fleet = evaluation.fleet(deployments, pods)
        now = self.clock()
        obs, sample, router = await self._observe(
            svc,
            namespace,
            evaluation.ready_pod_names(pods),
            None if routers is None else evaluation.ready_pod_names(routers),
            now,
        )
        decision = policy.decide(
            svc.autoscaling, obs, fleet, self.recommendations.get(ref, ()), now
        )
        names = {str(d["metadata"]["name"]) for d in deployments}
        autoscalers = [
            h for h in self.caches.autoscalers if h["metadata"].get("namespace") == namespace
        ]
        found = evaluation.conflicts(name, svc, autoscalers, names)
        _record(namespace, name, svc, decision, obs, fleet.ready, len(found))
        generation = int(body["metadata"].get("generation") or 0)
        changes, events = evaluation.status_update(
            body.get("status") or {}, svc, decision, obs, found, generation, now
        )
        status, posts = status_effects(body, changes, events)
        await self.applier.report(body, status, posts)
        # Kept only once the evaluation counts (a conflict retried must not record twice).
        self.recommendations[ref] = decision.history
        await self._utterances(body, ref, sample, router, now)
        return interval

    def forget(self, namespace: str, name: str) -> None:
        self.recommendations.pop((namespace, name), None)
        self.utterances_warned.pop((namespace, name), None)
        metrics.forget(namespace, name)

    async def _observe(
        self,
        svc: ServiceSpec,
        namespace: str,
        ready: list[str],
        routers: list[str] | None,
        now: dt.datetime,
    ) -> tuple[Observation, Sample | None, RouterSample | None]:
        """The observation, with the Triton and router samples it came from (None where
        none was taken). ``routers`` is None without a router (modes Service, GatewayAPI)."""
        url = svc.autoscaling.prometheus_url or self.prometheus_url
        if not url:
            return (
                evaluation.unavailable(
                    evaluation.NO_PROMETHEUS,
                    "no Prometheus to read: set spec.autoscaling.prometheusUrl or the "
                    "operator's COSYVOICE_PROMETHEUS_URL (chart value config.prometheusUrl)",
                    now,
                ),
                None,
                None,
            )
        if routers is None and not ready:
            return (
                evaluation.unavailable(
                    evaluation.NO_PODS, "no serving pod is Ready yet: nothing to measure", now
                ),
                None,
                None,
            )
        model = triton.orchestrator(svc.model.variant)
        sample = (
            await self.sources.sample(url, namespace, ready, model)
            if ready
            else samples.unavailable(evaluation.NO_PODS, "no serving pod is Ready yet")
        )
        if routers is None:
            return evaluation.observation(sample, now), sample, None
        router = (
            await self.sources.sample_router(url, namespace, routers)
            if routers
            else samples.router_unavailable(
                NO_ROUTER,
                "no router pod is Ready: the router's figures are the signal in "
                "spec.routing.mode Router (holding; never a scale-down without them)",
            )
        )
        return evaluation.observation(sample, now, router), sample, router

    async def _utterances(
        self,
        body: Mapping[str, Any],
        ref: tuple[str, str],
        sample: Sample | None,
        router: RouterSample | None,
        now: dt.datetime,
    ) -> None:
        """Utterances per stream (mode Router): the gauge, and the rate-limited Warning."""
        namespace, name = ref
        if sample is None or router is None or not (sample.available and router.available):
            metrics.record_utterances_per_stream(namespace, name, None)
            return
        per_stream = evaluation.utterances_per_stream(
            sample.completion_rate,
            router.completed_stream_rate,
            router.in_flight,
            self.window_seconds,
        )
        metrics.record_utterances_per_stream(namespace, name, per_stream)
        warning = evaluation.utterance_warning(
            per_stream,
            sample.completion_rate,
            self.window_seconds,
            self.utterances_warned.get(ref),
            now,
        )
        if warning is not None:
            self.utterances_warned[ref] = now
            await self.applier.carry_out(namespace, PostEvent(*warning), body)


def _record(
    namespace: str,
    name: str,
    svc: ServiceSpec,
    decision: Decision,
    obs: Observation,
    ready: int,
    conflicts: int,
) -> None:
    a = svc.autoscaling
    metrics.record_evaluation(
        namespace,
        name,
        decision.direction,
        a.mode,
        decision.replicas,
        ready,
        obs.queue_latency_ms,
        "" if obs.available else obs.unavailable_reason,
    )
    metrics.record_autoscaling_spec(
        namespace,
        name,
        a.target_queue_latency_milliseconds,
        a.min_replicas,
        a.max_replicas,
        conflicts,
    )
