"""config.load: the operator's settings from its environment (set by the Helm chart)."""

from __future__ import annotations

import pytest

from cosyvoice_operator.render.build_job import BuildSettings
from cosyvoice_operator.shell import config
from cosyvoice_operator.shell.config import ConfigError, OperatorConfig


def test_defaults_from_an_empty_environment() -> None:
    c = config.load({})
    assert c == OperatorConfig()
    assert c.build == BuildSettings()
    assert c.allowed_image_prefixes == ()
    assert c.engine_retention_seconds == 7 * 24 * 3600
    assert (c.superseded_grace_seconds, c.workers, c.metrics_window_seconds) == (30.0, 4, 60)
    assert c.prometheus_url == ""
    b = c.build
    assert b.default_builder_image.startswith("ghcr.io/cosyvoice-operator/engine-builder:")
    assert (b.backoff_limit, b.max_attempts, b.retry_base_seconds) == (2, 3, 60.0)
    assert (b.active_deadline_seconds, b.ttl_seconds_after_finished) == (4 * 3600, 24 * 3600)
    assert (b.service_account, dict(b.pod_annotations), b.image_pull_secrets) == ("", {}, ())


def test_empty_values_mean_defaults() -> None:
    """The chart renders every variable, empty when the value is unset."""
    names = [
        "COSYVOICE_BUILDER_IMAGE",
        "COSYVOICE_BUILD_BACKOFF_LIMIT",
        "COSYVOICE_BUILD_DEADLINE_SECONDS",
        "COSYVOICE_BUILD_TTL_SECONDS",
        "COSYVOICE_BUILD_MAX_ATTEMPTS",
        "COSYVOICE_BUILD_RETRY_BASE_SECONDS",
        "COSYVOICE_BUILD_SERVICE_ACCOUNT",
        "COSYVOICE_BUILD_POD_ANNOTATIONS",
        "COSYVOICE_IMAGE_PULL_SECRETS",
        "COSYVOICE_BUILD_SCRATCH_SIZE",
        "COSYVOICE_ENGINE_RETENTION_SECONDS",
        "COSYVOICE_SUPERSEDED_GRACE_SECONDS",
        "COSYVOICE_WORKERS",
        "COSYVOICE_ALLOWED_IMAGE_PREFIXES",
        "COSYVOICE_PEERING_LIFETIME_SECONDS",
        "COSYVOICE_PROMETHEUS_URL",
        "COSYVOICE_METRICS_WINDOW_SECONDS",
        "COSYVOICE_SERVING_IMAGE",
    ]
    assert config.load(dict.fromkeys(names, "")) == OperatorConfig()


@pytest.mark.parametrize(
    ("name", "raw", "attr", "value"),
    [
        ("COSYVOICE_BUILDER_IMAGE", "reg/builder:2", "default_builder_image", "reg/builder:2"),
        ("COSYVOICE_BUILD_BACKOFF_LIMIT", "5", "backoff_limit", 5),
        ("COSYVOICE_BUILD_BACKOFF_LIMIT", "0", "backoff_limit", 0),
        ("COSYVOICE_BUILD_DEADLINE_SECONDS", "7200", "active_deadline_seconds", 7200),
        # Helm renders big numbers in exponent form
        ("COSYVOICE_BUILD_TTL_SECONDS", "1e+06", "ttl_seconds_after_finished", 1_000_000),
        ("COSYVOICE_BUILD_TTL_SECONDS", "3600.0", "ttl_seconds_after_finished", 3600),
        ("COSYVOICE_BUILD_MAX_ATTEMPTS", "5", "max_attempts", 5),
        ("COSYVOICE_BUILD_MAX_ATTEMPTS", "0", "max_attempts", 1),  # at least one attempt
        ("COSYVOICE_BUILD_RETRY_BASE_SECONDS", "2.5", "retry_base_seconds", 2.5),
        ("COSYVOICE_BUILD_SERVICE_ACCOUNT", "builder", "service_account", "builder"),
        (
            "COSYVOICE_BUILD_POD_ANNOTATIONS",
            '{"sidecar.istio.io/inject": "false"}',
            "pod_annotations",
            {"sidecar.istio.io/inject": "false"},
        ),
        ("COSYVOICE_BUILD_POD_ANNOTATIONS", "{}", "pod_annotations", {}),
        ("COSYVOICE_IMAGE_PULL_SECRETS", "regcred", "image_pull_secrets", ("regcred",)),
        ("COSYVOICE_IMAGE_PULL_SECRETS", "a,b", "image_pull_secrets", ("a", "b")),
        ("COSYVOICE_IMAGE_PULL_SECRETS", "a,,b,", "image_pull_secrets", ("a", "b")),
    ],
)
def test_build_setting_from_env(name: str, raw: str, attr: str, value: object) -> None:
    build = config.load({name: raw}).build
    got = getattr(build, attr)
    assert (dict(got) if attr == "pod_annotations" else got) == value
    assert type(got) is type(value) or attr == "pod_annotations"
    # nothing else moved
    others = {k: v for k, v in vars(build).items() if k != attr}
    assert others == {k: v for k, v in vars(BuildSettings()).items() if k != attr}


def test_control_loop_settings() -> None:
    c = config.load(
        {
            "COSYVOICE_ENGINE_RETENTION_SECONDS": "3600",
            "COSYVOICE_SUPERSEDED_GRACE_SECONDS": "5",
            "COSYVOICE_WORKERS": "8",
            "COSYVOICE_BUILD_SCRATCH_SIZE": "20Gi",
        }
    )
    assert (c.engine_retention_seconds, c.superseded_grace_seconds, c.workers) == (3600, 5, 8)
    assert c.build.scratch_size == "20Gi"
    with pytest.raises(ConfigError, match="COSYVOICE_WORKERS"):
        config.load({"COSYVOICE_WORKERS": "0"})


def test_image_allowlist() -> None:
    env = {
        "COSYVOICE_ALLOWED_IMAGE_PREFIXES": (
            "ghcr.io/cosyvoice-operator/, nvcr.io/nvidia/, docker.io/library/haproxy:"
        )
    }
    assert config.load(env).allowed_image_prefixes == (
        "ghcr.io/cosyvoice-operator/",
        "nvcr.io/nvidia/",
        "docker.io/library/haproxy:",
    )
    # The router's default image (issue 30) too.
    with pytest.raises(ConfigError, match=r"COSYVOICE_ROUTER_IMAGE='docker\.io/library/haproxy"):
        config.load({"COSYVOICE_ALLOWED_IMAGE_PREFIXES": "ghcr.io/cosyvoice-operator/, nvcr.io/"})
    mirrored = config.load(
        {
            "COSYVOICE_ALLOWED_IMAGE_PREFIXES": "mirror.example/",
            "COSYVOICE_IMAGE_REGISTRY": "mirror.example/tts",
        }
    )
    assert mirrored.serving.router_image == "mirror.example/tts/haproxy:3.2"
    assert config.load({"COSYVOICE_GATEWAY_API": "true"}).serving.gateway_api
    assert not config.load({}).serving.gateway_api
    # A prefix that does not end at a boundary would admit a namesake registry path.
    with pytest.raises(ConfigError, match="must end with"):
        config.load({"COSYVOICE_ALLOWED_IMAGE_PREFIXES": "ghcr.io/cosyvoice"})
    # The operator's own default images must be allowed.
    with pytest.raises(ConfigError, match="COSYVOICE_BUILDER_IMAGE"):
        config.load({"COSYVOICE_ALLOWED_IMAGE_PREFIXES": "nvcr.io/nvidia/"})
    with pytest.raises(ConfigError, match="COSYVOICE_SERVING_IMAGE"):
        config.load(
            {
                "COSYVOICE_ALLOWED_IMAGE_PREFIXES": "ghcr.io/cosyvoice-operator/",
                "COSYVOICE_SERVING_IMAGE": "quay.io/me/triton:1",
            }
        )
    served = config.load({"COSYVOICE_SERVING_IMAGE": "registry.example/triton:2"})
    assert served.serving.default_image == "registry.example/triton:2"


def test_peering_lifetime() -> None:
    assert config.load({}).peering_lifetime_seconds == 60
    assert config.load({"COSYVOICE_PEERING_LIFETIME_SECONDS": "15"}).peering_lifetime_seconds == 15
    with pytest.raises(ConfigError, match="at least 10"):
        config.load({"COSYVOICE_PEERING_LIFETIME_SECONDS": "5"})


def test_prometheus_url() -> None:
    url = "http://prometheus.monitoring:9090"
    assert config.load({"COSYVOICE_PROMETHEUS_URL": url}).prometheus_url == url


def test_load_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSYVOICE_BUILD_MAX_ATTEMPTS", "7")
    assert config.load().build.max_attempts == 7


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("COSYVOICE_BUILD_BACKOFF_LIMIT", "two"),
        ("COSYVOICE_BUILD_BACKOFF_LIMIT", "-1"),
        ("COSYVOICE_BUILD_BACKOFF_LIMIT", "1.5"),
        ("COSYVOICE_BUILD_DEADLINE_SECONDS", "4h"),
        ("COSYVOICE_BUILD_TTL_SECONDS", "-60"),
        ("COSYVOICE_BUILD_MAX_ATTEMPTS", "three"),
        ("COSYVOICE_BUILD_MAX_ATTEMPTS", "2.5"),
        ("COSYVOICE_BUILD_RETRY_BASE_SECONDS", "1m"),
        ("COSYVOICE_ENGINE_RETENTION_SECONDS", "a week"),
        ("COSYVOICE_SUPERSEDED_GRACE_SECONDS", "-1"),
        ("COSYVOICE_BUILD_POD_ANNOTATIONS", "not json"),
        ("COSYVOICE_BUILD_POD_ANNOTATIONS", "[1, 2]"),
        ("COSYVOICE_BUILD_POD_ANNOTATIONS", '"a string"'),
        ("COSYVOICE_BUILD_POD_ANNOTATIONS", '{"a": 1}'),
        ("COSYVOICE_BUILD_POD_ANNOTATIONS", '{"a": {"b": "c"}}'),
    ],
)
def test_bad_value_raises_config_error_naming_the_variable(name: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.load({name: raw})
    assert name in str(info.value)


@pytest.mark.parametrize(
    ("env", "name", "needle"),
    [
        ({"COSYVOICE_BUILD_DEADLINE_SECONDS": "0"}, "COSYVOICE_BUILD_DEADLINE_SECONDS", "1 second"),
        ({"COSYVOICE_BUILD_TTL_SECONDS": "0"}, "COSYVOICE_BUILD_TTL_SECONDS", "at least 150"),
        ({"COSYVOICE_BUILD_TTL_SECONDS": "59"}, "COSYVOICE_BUILD_TTL_SECONDS", "at least 150"),
        (
            # Default backoff (60 s base, 3 attempts): the Job of attempt 2
            # must still be there when attempt 3 is due, 120 s after it failed.
            {"COSYVOICE_BUILD_TTL_SECONDS": "120"},
            "COSYVOICE_BUILD_TTL_SECONDS",
            "at least 150",
        ),
        (
            {
                "COSYVOICE_BUILD_TTL_SECONDS": "3600",
                "COSYVOICE_BUILD_MAX_ATTEMPTS": "8",
                "COSYVOICE_BUILD_RETRY_BASE_SECONDS": "60",
            },
            "COSYVOICE_BUILD_TTL_SECONDS",
            "at least 3870",  # 60 * 2**6 + 30
        ),
    ],
)
def test_settings_that_would_lose_builds_are_refused(
    env: dict[str, str], name: str, needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        config.load(env)
    assert name in str(info.value) and needle in str(info.value)


def test_shortest_accepted_ttl() -> None:
    assert (
        config.load({"COSYVOICE_BUILD_TTL_SECONDS": "150"}).build.ttl_seconds_after_finished == 150
    )
    fast = {"COSYVOICE_BUILD_RETRY_BASE_SECONDS": "2"}
    assert (
        config.load({**fast, "COSYVOICE_BUILD_TTL_SECONDS": "60"}).build.ttl_seconds_after_finished
        == 60
    )
    one_attempt = {"COSYVOICE_BUILD_MAX_ATTEMPTS": "1", "COSYVOICE_BUILD_TTL_SECONDS": "60"}
    assert config.load(one_attempt).build.max_attempts == 1


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("COSYVOICE_BUILD_MAX_ATTEMPTS", "inf"),
        ("COSYVOICE_BUILD_BACKOFF_LIMIT", "nan"),
        ("COSYVOICE_BUILD_TTL_SECONDS", "infinity"),
    ],
)
def test_non_finite_integer_setting_is_a_config_error(name: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=name):
        config.load({name: raw})


@pytest.mark.parametrize("raw", ["-60", "nan", "inf"])
def test_retry_base_must_be_a_finite_non_negative_number(raw: str) -> None:
    with pytest.raises(ConfigError, match="COSYVOICE_BUILD_RETRY_BASE_SECONDS"):
        config.load({"COSYVOICE_BUILD_RETRY_BASE_SECONDS": raw})


# ---- issue 21 -------------------------------------------------------------------------------


def test_a_vllm_default_image_is_refused_while_vllm_is_not_served() -> None:
    """Issue 19, item 9: spec.model.llmRuntime vllm is refused, so an image for it would be
    a setting nothing reads."""
    env = {
        "COSYVOICE_ALLOWED_IMAGE_PREFIXES": "registry.corp.example/",
        "COSYVOICE_BUILDER_IMAGE": "registry.corp.example/builder:1",
        "COSYVOICE_SERVING_IMAGE": "registry.corp.example/triton:1",
        "COSYVOICE_ROUTER_IMAGE": "registry.corp.example/haproxy:3.2",
    }
    with pytest.raises(ConfigError, match="COSYVOICE_VLLM_IMAGE: vLLM is not served yet"):
        config.load({**env, "COSYVOICE_VLLM_IMAGE": "registry.corp.example/triton:1-vllm"})
    assert config.load(env).serving.default_image == "registry.corp.example/triton:1"


def test_prometheus_urls_the_autoscaler_may_query() -> None:
    """H2: by default only the operator's own; more only by the operator's configuration."""
    own = "http://prometheus.monitoring:9090"
    assert config.load({}).prometheus_urls == ()
    assert config.load({"COSYVOICE_PROMETHEUS_URL": own}).prometheus_urls == (own,)
    c = config.load(
        {
            "COSYVOICE_PROMETHEUS_URL": own,
            "COSYVOICE_ALLOWED_PROMETHEUS_URLS": " https://thanos.example/q , http://p2:9090",
        }
    )
    assert c.prometheus_urls == (own, "https://thanos.example/q", "http://p2:9090")
    for bad in ("file:///etc/passwd", "gopher://x", "http://", "not a url"):
        with pytest.raises(ConfigError, match="COSYVOICE_ALLOWED_PROMETHEUS_URLS"):
            config.load({"COSYVOICE_ALLOWED_PROMETHEUS_URLS": bad})
    with pytest.raises(ConfigError, match="COSYVOICE_PROMETHEUS_URL"):
        config.load({"COSYVOICE_PROMETHEUS_URL": "ftp://x"})


def test_operator_limits() -> None:
    """M3: settings with safe defaults."""
    limits = config.load({}).limits
    assert (limits.max_replicas, limits.max_gpus_per_service) == (100, 128)
    assert (limits.max_instances_per_pod, limits.max_spec_bytes) == (1024, 65536)
    c = config.load(
        {
            "COSYVOICE_MAX_REPLICAS": "8",
            "COSYVOICE_MAX_GPUS_PER_SERVICE": "16",
            "COSYVOICE_MAX_INSTANCES_PER_POD": "64",
            "COSYVOICE_MAX_SPEC_BYTES": "8192",
        }
    ).limits
    assert (c.max_replicas, c.max_gpus_per_service, c.max_instances_per_pod) == (8, 16, 64)
    assert c.max_spec_bytes == 8192
    with pytest.raises(ConfigError, match="COSYVOICE_MAX_REPLICAS"):
        config.load({"COSYVOICE_MAX_REPLICAS": "0"})
    with pytest.raises(ConfigError, match="COSYVOICE_MAX_SPEC_BYTES"):
        config.load({"COSYVOICE_MAX_SPEC_BYTES": "lots"})


def test_companion_revisions_by_release() -> None:
    release = "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"
    companion = "hf://yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF"
    import json

    pins = {release: {companion: "c" * 40}}
    env = {"COSYVOICE_COMPANION_REVISIONS": json.dumps(pins)}
    assert config.load(env).build.companion_pins == ((release, companion, "c" * 40),)
    assert config.load({}).build.companion_pins == ()
    for bad in (
        {release: {companion: "main"}},
        {"s3://b/x": {companion: "c" * 40}},
        {release: {"yuekai/x": "c" * 40}},
        {release: "c" * 40},
    ):
        with pytest.raises(ConfigError, match="COSYVOICE_COMPANION_REVISIONS"):
            config.load({"COSYVOICE_COMPANION_REVISIONS": json.dumps(bad)})
