"""The operator's own configuration, read once from its environment (set by the Helm chart)."""

from __future__ import annotations

import json
import math
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from cosyvoice_operator.plan.service import Limits
from cosyvoice_operator.render.build_job import BuildSettings
from cosyvoice_operator.render.workloads import ServingSettings


class ConfigError(ValueError):
    """A bad operator setting; names the environment variable."""


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a number") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name}={raw!r}: expected a finite, non-negative number")
    return value


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = _float(env, name, default)
    if value != int(value):
        raise ConfigError(f"{name}={env.get(name)!r}: expected a non-negative integer")
    return int(value)


@dataclass(frozen=True)
class OperatorConfig:
    build: BuildSettings = field(default_factory=BuildSettings)
    serving: ServingSettings = field(default_factory=ServingSettings)
    # Image prefixes services may name for the builder and serving images (empty: any).
    allowed_image_prefixes: tuple[str, ...] = ()
    # Where the default builder and serving images are pulled from (COSYVOICE_IMAGE_REGISTRY,
    # the chart's imageRegistry; empty: as named).
    image_registry: str = ""
    # How long an engine no service references is kept before it is removed.
    engine_retention_seconds: float = 7 * 24 * 3600.0
    # How long a build Job no service asks for any more may run on before it is deleted.
    superseded_grace_seconds: float = 30.0
    # Reconciles run at once (each service by one at a time).
    workers: int = 4
    # The rate window of the autoscaler's Prometheus queries.
    metrics_window_seconds: int = 60
    prometheus_url: str = ""
    # With kopf peering: how long a replica that stopped touching the peering object is
    # still taken for alive (kopf's lifetime); a standby takes over after it.
    peering_lifetime_seconds: int = 60
    # Prometheus URLs a service's spec.autoscaling.prometheusUrl may name besides
    # prometheus_url (which is always allowed): any other is refused without a request.
    allowed_prometheus_urls: tuple[str, ...] = ()
    # What one service may ask for (COSYVOICE_MAX_*).
    limits: Limits = field(default_factory=Limits)

    @property
    def prometheus_urls(self) -> tuple[str, ...]:
        """Every URL the autoscaler may query: the operator's own and the allowed ones."""
        own = (self.prometheus_url,) if self.prometheus_url else ()
        return own + self.allowed_prometheus_urls


def load(env: Mapping[str, str] | None = None) -> OperatorConfig:
    env = os.environ if env is None else env
    annotations = _pod_annotations(env)
    pull = tuple(s for s in env.get("COSYVOICE_IMAGE_PULL_SECRETS", "").split(",") if s)
    prefixes = _image_prefixes(env)
    registry = _image_registry(env)
    retention = _float(env, "COSYVOICE_ENGINE_RETENTION_SECONDS", 7 * 24 * 3600.0)
    grace = _float(env, "COSYVOICE_SUPERSEDED_GRACE_SECONDS", 30.0)
    workers = _int(env, "COSYVOICE_WORKERS", 4)
    window = _int(env, "COSYVOICE_METRICS_WINDOW_SECONDS", 60)
    if window < 2:
        raise ConfigError("COSYVOICE_METRICS_WINDOW_SECONDS: at least 2 (two scrapes)")
    if workers < 1:
        raise ConfigError("COSYVOICE_WORKERS: at least 1")
    lifetime = _int(env, "COSYVOICE_PEERING_LIFETIME_SECONDS", 60)
    if lifetime < 10:
        # kopf renews its entry 5 to 10 s before it lapses: a shorter lifetime would let
        # the active replica lapse between renewals and two replicas act at once.
        raise ConfigError(
            f"COSYVOICE_PEERING_LIFETIME_SECONDS={env.get('COSYVOICE_PEERING_LIFETIME_SECONDS')!r}"
            ": must be at least 10"
        )
    build = _build_settings(env, annotations, pull)
    if registry:
        build = replace(
            build, default_builder_image=rebase_image(build.default_builder_image, registry)
        )
    _check_allowed("COSYVOICE_BUILDER_IMAGE", build.default_builder_image, prefixes)
    serving_defaults = ServingSettings()
    serving_image = env.get("COSYVOICE_SERVING_IMAGE") or serving_defaults.default_image
    router_image = env.get("COSYVOICE_ROUTER_IMAGE") or serving_defaults.router_image
    serving = ServingSettings(
        default_image=rebase_image(serving_image, registry) if registry else serving_image,
        router_image=rebase_image(router_image, registry) if registry else router_image,
        network_policy=_bool(env, "COSYVOICE_NETWORK_POLICY", serving_defaults.network_policy),
        scraper_namespace_labels=_labels(env, "COSYVOICE_NETWORK_POLICY_SCRAPER_NAMESPACE_LABELS"),
        gateway_api=_bool(env, "COSYVOICE_GATEWAY_API", serving_defaults.gateway_api),
    )
    _check_allowed("COSYVOICE_SERVING_IMAGE", serving.default_image, prefixes)
    _check_allowed("COSYVOICE_ROUTER_IMAGE", serving.router_image, prefixes)
    if env.get("COSYVOICE_VLLM_IMAGE"):
        # Services may not ask for vLLM (spec.model.llmRuntime, issue 19 item 9): an image
        # for it would be a setting nothing reads.
        raise ConfigError(
            "COSYVOICE_VLLM_IMAGE: vLLM is not served yet (spec.model.llmRuntime vllm is "
            "refused until a vLLM serving image exists); unset it"
        )
    prometheus_url = env.get("COSYVOICE_PROMETHEUS_URL", "")
    if prometheus_url:
        _check_url("COSYVOICE_PROMETHEUS_URL", prometheus_url)
    return OperatorConfig(
        build=build,
        serving=serving,
        allowed_image_prefixes=prefixes,
        image_registry=registry,
        engine_retention_seconds=retention,
        superseded_grace_seconds=grace,
        workers=workers,
        metrics_window_seconds=window,
        prometheus_url=prometheus_url,
        peering_lifetime_seconds=lifetime,
        allowed_prometheus_urls=_prometheus_urls(env),
        limits=_limits(env),
    )


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in ("true", "false"):
        raise ConfigError(f"{name}={env.get(name)!r}: expected true or false")
    return raw == "true"


def _labels(env: Mapping[str, str], name: str) -> tuple[tuple[str, str], ...]:
    raw = env.get(name, "")
    try:
        found = json.loads(raw) if raw else {}
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a JSON object of labels") from None
    if not isinstance(found, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in found.items()
    ):
        raise ConfigError(f"{name}: expected a JSON object of strings")
    return tuple(sorted(found.items()))


_HF_URI = re.compile(r"^hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _companion_pins(env: Mapping[str, str]) -> tuple[tuple[str, str, str], ...]:
    """COSYVOICE_COMPANION_REVISIONS: {release URI: {companion URI: full commit}}."""
    name = "COSYVOICE_COMPANION_REVISIONS"
    raw = env.get(name, "")
    try:
        found = json.loads(raw) if raw else {}
    except ValueError:
        raise ConfigError(f"{name}: expected a JSON object") from None
    if not isinstance(found, dict):
        raise ConfigError(f"{name}: expected a JSON object of release URIs")
    pins: list[tuple[str, str, str]] = []
    for release, companions in found.items():
        if not isinstance(release, str) or not _HF_URI.match(release):
            raise ConfigError(f"{name}: {release!r} is not an hf://ORG/NAME release")
        if not isinstance(companions, dict):
            raise ConfigError(f"{name}: {release}: expected {{companion URI: commit}}")
        for companion, commit in companions.items():
            if not isinstance(companion, str) or not _HF_URI.match(companion):
                raise ConfigError(f"{name}: {companion!r} is not an hf://ORG/NAME repository")
            if not isinstance(commit, str) or not _COMMIT.match(commit):
                raise ConfigError(
                    f"{name}: {companion}: {commit!r} is not a full 40-character commit"
                )
            pins.append((release, companion, commit))
    return tuple(sorted(pins))


def _check_url(name: str, url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        raise ConfigError(f"{name}: {url!r} is not an http:// or https:// URL")


def _prometheus_urls(env: Mapping[str, str]) -> tuple[str, ...]:
    name = "COSYVOICE_ALLOWED_PROMETHEUS_URLS"
    urls = tuple(u.strip() for u in env.get(name, "").split(",") if u.strip())
    for url in urls:
        _check_url(name, url)
    return urls


def _limits(env: Mapping[str, str]) -> Limits:
    defaults = Limits()
    found = {
        "max_replicas": _int(env, "COSYVOICE_MAX_REPLICAS", defaults.max_replicas),
        "max_gpus_per_service": _int(
            env, "COSYVOICE_MAX_GPUS_PER_SERVICE", defaults.max_gpus_per_service
        ),
        "max_instances_per_pod": _int(
            env, "COSYVOICE_MAX_INSTANCES_PER_POD", defaults.max_instances_per_pod
        ),
        "max_spec_bytes": _int(env, "COSYVOICE_MAX_SPEC_BYTES", defaults.max_spec_bytes),
    }
    for attr, value in found.items():
        if value < 1:
            raise ConfigError(f"COSYVOICE_{attr.upper()}: at least 1")
    return Limits(**found)


def _pod_annotations(env: Mapping[str, str]) -> dict[str, str]:
    annotations_raw = env.get("COSYVOICE_BUILD_POD_ANNOTATIONS", "")
    try:
        annotations = json.loads(annotations_raw) if annotations_raw else {}
    except ValueError:
        raise ConfigError(
            f"COSYVOICE_BUILD_POD_ANNOTATIONS={annotations_raw!r}: expected a JSON object"
        ) from None
    if not isinstance(annotations, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
    ):
        raise ConfigError("COSYVOICE_BUILD_POD_ANNOTATIONS: expected a JSON object of strings")
    return annotations


def _image_prefixes(env: Mapping[str, str]) -> tuple[str, ...]:
    prefixes = tuple(
        p.strip() for p in env.get("COSYVOICE_ALLOWED_IMAGE_PREFIXES", "").split(",") if p.strip()
    )
    for prefix in prefixes:
        if not prefix.endswith(("/", ":", "@")):
            raise ConfigError(
                f"COSYVOICE_ALLOWED_IMAGE_PREFIXES: {prefix!r} must end with '/', ':' or '@' "
                f"(else {prefix + '-evil/...'!r} would be allowed too)"
            )
    return prefixes


# A registry host (lower case, an optional port) and an optional path of repository
# components: what goes before an image's name. No scheme, tag or digest.
_REGISTRY = re.compile(
    r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*$"
)


def rebase_image(image: str, registry: str) -> str:
    """`image` pulled from `registry`: all before its last "/" replaced by `registry`, its
    name, tag and digest kept (``ghcr.io/cosyvoice-operator/engine-builder:0.1.0-trtllm0.20.0``
    under ``registry.example/tts`` is ``registry.example/tts/engine-builder:0.1.0-trtllm0.20.0``).
    The chart does the same to the operator's own image (templates/deployment.yaml)."""
    return f"{registry.rstrip('/')}/{image.rsplit('/', 1)[-1]}"


def _image_registry(env: Mapping[str, str]) -> str:
    raw = env.get("COSYVOICE_IMAGE_REGISTRY", "").strip()
    registry = raw.rstrip("/")
    if raw and not _REGISTRY.match(registry):
        raise ConfigError(
            f"COSYVOICE_IMAGE_REGISTRY={raw!r}: expected a registry and optional path such as "
            "registry.example.com/team (lower case; no scheme, tag or digest)"
        )
    return registry


def _check_allowed(name: str, image: str, prefixes: tuple[str, ...]) -> None:
    if prefixes and not image.startswith(prefixes):
        raise ConfigError(
            f"{name}={image!r} is not under "
            f"COSYVOICE_ALLOWED_IMAGE_PREFIXES ({', '.join(prefixes)})"
        )


def _build_settings(
    env: Mapping[str, str], annotations: dict[str, str], pull: tuple[str, ...]
) -> BuildSettings:
    defaults = BuildSettings()
    deadline = _int(env, "COSYVOICE_BUILD_DEADLINE_SECONDS", defaults.active_deadline_seconds)
    if deadline < 1:
        raise ConfigError(
            f"COSYVOICE_BUILD_DEADLINE_SECONDS={env.get('COSYVOICE_BUILD_DEADLINE_SECONDS')!r}: "
            "a build needs at least 1 second (the API rejects 0)"
        )
    ttl = _int(env, "COSYVOICE_BUILD_TTL_SECONDS", defaults.ttl_seconds_after_finished)
    max_attempts = max(1, _int(env, "COSYVOICE_BUILD_MAX_ATTEMPTS", defaults.max_attempts))
    retry_base = _float(env, "COSYVOICE_BUILD_RETRY_BASE_SECONDS", defaults.retry_base_seconds)
    # A finished Job is what the operator counts attempts and backoff from: it must outlive
    # the longest wait before a retry (and half a minute more, for a busy operator to act),
    # or the count starts over and a failing build is retried forever.
    longest_wait = retry_base * 2 ** (max_attempts - 2) if max_attempts > 1 else 0
    min_ttl = max(60, math.ceil(longest_wait + 30))
    if ttl < min_ttl:
        raise ConfigError(
            f"COSYVOICE_BUILD_TTL_SECONDS={env.get('COSYVOICE_BUILD_TTL_SECONDS')!r}: must be at "
            f"least {min_ttl} (60 s, and the longest retry wait plus 30 s), or a "
            "finished build Job may be deleted before the operator records or retries it"
        )
    return BuildSettings(
        default_builder_image=env.get("COSYVOICE_BUILDER_IMAGE") or defaults.default_builder_image,
        backoff_limit=_int(env, "COSYVOICE_BUILD_BACKOFF_LIMIT", defaults.backoff_limit),
        active_deadline_seconds=deadline,
        ttl_seconds_after_finished=ttl,
        max_attempts=max_attempts,
        retry_base_seconds=retry_base,
        service_account=env.get("COSYVOICE_BUILD_SERVICE_ACCOUNT", ""),
        pod_annotations=annotations,
        image_pull_secrets=pull,
        scratch_size=env.get("COSYVOICE_BUILD_SCRATCH_SIZE") or defaults.scratch_size,
        companion_pins=_companion_pins(env),
    )
