"""engine_state.credentials_problem: a missing credentials Secret or key, read off the build pod.

The build pod references only the keys the builder needs, the required ones without
``optional``; the kubelet then refuses to start the container and says why in its waiting
state. The messages below are the kubelet's own wording (its secret manager's NotFound
error, and ``makeEnvironmentVariables``' text for a missing key).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from cosyvoice_operator.api import engine_identity
from cosyvoice_operator.api.engine_identity import EngineTarget
from cosyvoice_operator.plan.engine_state import credentials_problem
from cosyvoice_operator.render import build_job
from cosyvoice_operator.render.build_job import BuildSettings, render_job
from tests.unit.objects import CACHE, T0, service

NAMESPACE = "ml"


def _build_pod(
    uri: str,
    secret: str,
    *,
    waiting: dict[str, Any] | None = None,
    created: dt.datetime = T0,
    init: bool = False,
) -> dict[str, Any]:
    """A build pod as the API server returns it: the rendered template, plus a status."""
    svc = service(model={"uri": uri, "credentialsSecret": secret})
    ident = engine_identity.identity(svc, "sm_89", BuildSettings().default_builder_image)
    job = render_job(
        EngineTarget(ident, ("NVIDIA-L20",)), svc, NAMESPACE, 1, BuildSettings(), CACHE
    )
    template = job["spec"]["template"]
    state = {"waiting": waiting} if waiting else {"running": {"startedAt": "2025-03-01T12:00:00Z"}}
    status_key = "initContainerStatuses" if init else "containerStatuses"
    return {
        "metadata": {
            "name": f"{job['metadata']['name']}-x7k2p",
            "namespace": NAMESPACE,
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "labels": template["metadata"]["labels"],
        },
        "spec": template["spec"],
        "status": {
            "phase": "Pending",
            status_key: [
                {
                    "name": build_job.CONTAINER,
                    "image": ident.builder_image,
                    "ready": False,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        },
    }


def _config_error(message: str) -> dict[str, Any]:
    return {"reason": "CreateContainerConfigError", "message": message}


def test_missing_secret_of_an_hf_model() -> None:
    pod = _build_pod(
        "hf://org/model", "hf-token", waiting=_config_error('secret "hf-token" not found')
    )
    problem = credentials_problem([pod])
    assert problem is not None
    reason, message = problem
    assert reason == "CredentialsSecretMissing"
    assert message.startswith('secret "hf-token" not found. ')  # the kubelet's words first
    assert "Create the Secret ml/hf-token with the key HF_TOKEN" in message
    assert "spec.model.credentialsSecret" in message


def test_missing_secret_of_an_s3_model_names_only_the_required_keys() -> None:
    pod = _build_pod(
        "s3://models/cv3/", "s3-creds", waiting=_config_error('secret "s3-creds" not found')
    )
    problem = credentials_problem([pod])
    assert problem is not None
    reason, message = problem
    assert reason == "CredentialsSecretMissing"
    assert "with the keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY " in message
    assert "AWS_SESSION_TOKEN" not in message  # optional: not needed to start


def test_missing_key_in_an_existing_secret() -> None:
    text = "couldn't find key HF_TOKEN in Secret ml/hf-token"
    pod = _build_pod("hf://org/model", "hf-token", waiting=_config_error(text))
    problem = credentials_problem([pod])
    assert problem is not None
    reason, message = problem
    assert reason == "CredentialsSecretInvalid"
    assert message.startswith(text)
    assert "Add the key HF_TOKEN to the Secret ml/hf-token (spec.model.credentialsSecret)" in (
        message
    )


def test_missing_aws_secret_key() -> None:
    text = "couldn't find key AWS_SECRET_ACCESS_KEY in Secret team-a/s3-creds"
    pod = _build_pod("s3://models/cv3/", "s3-creds", waiting=_config_error(text))
    assert credentials_problem([pod]) == (
        "CredentialsSecretInvalid",
        f"{text}. Add the key AWS_SECRET_ACCESS_KEY to the Secret team-a/s3-creds "
        "(spec.model.credentialsSecret); the build pod waits and starts once the key is there.",
    )


@pytest.mark.parametrize(
    "message",
    [
        # The secret cache has not synced yet: transient, the kubelet retries.
        "failed to sync secret cache: timed out waiting for the condition",
        # A ConfigMap, not the credentials.
        'configmap "settings" not found',
        "couldn't find key level in ConfigMap ml/settings",
        # Not about references at all.
        "container has runAsNonRoot and image will run as root",
    ],
)
def test_other_config_errors_are_not_credentials_problems(message: str) -> None:
    pod = _build_pod("hf://org/model", "hf-token", waiting=_config_error(message))
    assert credentials_problem([pod]) is None


@pytest.mark.parametrize(
    "waiting",
    [
        None,  # running
        {"reason": "ContainerCreating"},
        {"reason": "ImagePullBackOff", "message": 'secret "regcred" not found'},
        {"reason": "ErrImagePull", "message": "pull access denied"},
    ],
)
def test_pods_not_held_by_their_config_are_not_credentials_problems(
    waiting: dict[str, Any] | None,
) -> None:
    assert credentials_problem([_build_pod("hf://org/model", "hf-token", waiting=waiting)]) is None


def test_no_pods_no_problem() -> None:
    assert credentials_problem([]) is None


def test_a_pod_without_container_statuses_yet() -> None:
    pod = _build_pod("hf://org/model", "hf-token")
    pod["status"] = {"phase": "Pending"}
    assert credentials_problem([pod]) is None


def test_the_newest_pod_speaks_first() -> None:
    old = _build_pod(
        "hf://org/model",
        "hf-token",
        waiting=_config_error('secret "hf-token" not found'),
        created=T0,
    )
    new = _build_pod(
        "hf://org/model",
        "hf-token",
        waiting=_config_error("couldn't find key HF_TOKEN in Secret ml/hf-token"),
        created=T0 + dt.timedelta(minutes=5),
    )
    for pods in ([old, new], [new, old]):
        problem = credentials_problem(pods)
        assert problem is not None and problem[0] == "CredentialsSecretInvalid"


def test_a_problem_in_an_older_pod_still_counts_when_the_newest_runs() -> None:
    # Only pods of the latest Job are passed; any that cannot start is worth reporting.
    held = _build_pod(
        "hf://org/model", "hf-token", waiting=_config_error('secret "hf-token" not found')
    )
    running = _build_pod("hf://org/model", "hf-token", created=T0 + dt.timedelta(minutes=1))
    problem = credentials_problem([running, held])
    assert problem is not None and problem[0] == "CredentialsSecretMissing"


def test_init_container_statuses_are_read_too() -> None:
    pod = _build_pod(
        "hf://org/model",
        "hf-token",
        waiting=_config_error('secret "hf-token" not found'),
        init=True,
    )
    problem = credentials_problem([pod])
    assert problem is not None and problem[0] == "CredentialsSecretMissing"
