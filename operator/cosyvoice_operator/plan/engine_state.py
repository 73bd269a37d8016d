"""The state of one engine, read from what the cluster shows (pure).

An engine's record (the ConfigMap that outlives its Jobs), its build Jobs and the pods of its
latest Job say whether it is Pending, Building, Ready or Failed, and what the operator should
do next: create an attempt, record the outcome, or nothing. The Jobs and records themselves
are rendered by `render.build_job`; retries follow its docstring (the Job controller retries
a pod, the operator a failed Job, after ``retry_base_seconds * 2**(attempt-1)``, up to
``max_attempts``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cosyvoice_operator.api.conditions import parse_time
from cosyvoice_operator.api.engine_identity import EngineIdentity
from cosyvoice_operator.api.labels import ATTEMPT_LABEL, KEY_LABEL
from cosyvoice_operator.render.build_job import BuildSettings

# What the operator should do about an engine: nothing; create attempt `next_attempt`;
# record `job` as built; record that the builds of this key gave up.
EngineAction = Literal["none", "create", "record", "record-failure"]


@dataclass(frozen=True)
class EngineState:
    """What an engine is doing and what the operator should do about it."""

    state: str  # Pending | Building | Ready | Failed
    message: str
    job: str = ""
    attempts: int = 0
    action: EngineAction = "none"
    next_attempt: int = 0
    next_retry: dt.datetime | None = None
    result: str = ""
    # The EngineReady reason while this engine is not ready, when "Building" would mislead
    # (the API server refused the build Job, say).
    reason: str = ""
    # When the state changes with time alone (a build to report as running): look again then.
    look_again: dt.datetime | None = None
    # The sha256 of the engine's manifest.json as its build wrote it (the builder's
    # termination message, then the record): serving pods refuse any other ("" unknown).
    manifest_sha256: str = ""


def _attempt(job: Mapping[str, Any]) -> int:
    try:
        return int(job["metadata"]["labels"][ATTEMPT_LABEL])
    except (KeyError, ValueError, TypeError):
        return 0


def latest_job(jobs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The Job of the highest attempt (the one whose outcome counts)."""
    return max(jobs, key=_attempt) if jobs else None


def _condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def termination_message(pods: Sequence[Mapping[str, Any]]) -> str:
    """The builder's own last words: its termination message, newest pod first.

    The builder writes one line of JSON ({"result", "step", "message"}); anything else (the
    log tail Kubernetes falls back to) is taken as it is.
    """

    def started(pod: Mapping[str, Any]) -> str:
        return str((pod.get("metadata") or {}).get("creationTimestamp") or "")

    for pod in sorted(pods, key=started, reverse=True):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            text = (term.get("message") or "").strip()
            if not text:
                continue
            try:
                data = json.loads(text)
            except ValueError:
                return text[-1000:]
            if isinstance(data, dict):
                parts = [str(data[k]) for k in ("step", "message") if data.get(k)]
                if data.get("step"):
                    parts[0] = f"step {parts[0]}:"
                return " ".join(parts)[-1000:] or text[-1000:]
            return text[-1000:]
    return ""


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def valid_sha256(value: object) -> str:
    """``value`` if it is a sha256 in hex as the builder writes it, else "" (never trusted
    into a command line otherwise)."""
    return value if isinstance(value, str) and _SHA256.match(value) else ""


def built_manifest_sha256(pods: Sequence[Mapping[str, Any]]) -> str:
    """The manifest digest the builder reported on success (``manifestSha256`` of its
    termination message, newest pod first); "" from a builder that predates it."""

    def started(pod: Mapping[str, Any]) -> str:
        return str((pod.get("metadata") or {}).get("creationTimestamp") or "")

    for pod in sorted(pods, key=started, reverse=True):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            try:
                data = json.loads(str(term.get("message") or "").strip() or "null")
            except ValueError:
                continue
            if isinstance(data, dict) and data.get("result") == "ok":
                return valid_sha256(data.get("manifestSha256"))
    return ""


def pending_reason(pods: Sequence[Mapping[str, Any]]) -> str:
    """Why a build pod is not running yet (the scheduler's message), if it says."""
    for pod in pods:
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return str(cond.get("message") or cond.get("reason") or "")
    return ""


# A running build reports its node and start time once it has run this long (a long build
# shows it is alive; a short one finishes first and costs no status write for it).
REPORT_RUNNING_AFTER = dt.timedelta(seconds=10)

# What the kubelet says when it cannot resolve a secretKeyRef (CreateContainerConfigError):
# its secret manager's NotFound error, and its own text for a key the Secret lacks.
_SECRET_NOT_FOUND = re.compile(r'\bsecrets? "(?P<name>[^"]+)" not found', re.IGNORECASE)
_SECRET_KEY_MISSING = re.compile(
    r"couldn't find key (?P<key>\S+) in Secret (?P<namespace>[^/\s]+)/(?P<name>[^\s:;,]+)",
    re.IGNORECASE,
)


def _required_secret_keys(pod: Mapping[str, Any], container: str, secret: str) -> list[str]:
    """The keys of ``secret`` that a container of the pod requires (not ``optional``)."""
    keys: list[str] = []
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if c.get("name") != container:
            continue
        for env in c.get("env") or []:
            ref = (env.get("valueFrom") or {}).get("secretKeyRef") or {}
            if ref.get("name") == secret and not ref.get("optional") and ref.get("key"):
                keys.append(str(ref["key"]))
    return keys


def credentials_problem(pods: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) when a build pod cannot start for its credentials Secret.

    The build pod names only the keys the builder needs (``credential_env``), the required
    ones without ``optional``, so the kubelet itself reports a missing Secret or key: the
    container waits with reason CreateContainerConfigError. ``CredentialsSecretMissing`` is
    a Secret that does not exist, ``CredentialsSecretInvalid`` one without a required key;
    the message is the kubelet's, then what to do. Other CreateContainerConfigErrors (a
    secret cache that has not synced yet, a ConfigMap) are not credentials problems: None.
    """

    def started(pod: Mapping[str, Any]) -> str:
        return str((pod.get("metadata") or {}).get("creationTimestamp") or "")

    for pod in sorted(pods, key=started, reverse=True):
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        status = pod.get("status") or {}
        for cs in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") != "CreateContainerConfigError":
                continue
            text = str(waiting.get("message") or "").strip()
            missing_key = _SECRET_KEY_MISSING.search(text)
            if missing_key:
                key, name = missing_key.group("key"), missing_key.group("name")
                ns = missing_key.group("namespace")
                return (
                    "CredentialsSecretInvalid",
                    f"{text}. Add the key {key} to the Secret {ns}/{name} "
                    "(spec.model.credentialsSecret); the build pod waits and starts once "
                    "the key is there.",
                )
            not_found = _SECRET_NOT_FOUND.search(text)
            if not_found:
                name = not_found.group("name")
                keys = _required_secret_keys(pod, str(cs.get("name") or ""), name)
                where = f"{namespace}/{name}" if namespace else name
                with_keys = f" with the key{'s' if len(keys) > 1 else ''} {', '.join(keys)}"
                return (
                    "CredentialsSecretMissing",
                    f"{text}. Create the Secret {where}{with_keys if keys else ''} "
                    "(spec.model.credentialsSecret), or name an existing Secret there; the "
                    "build pod waits and starts once it exists.",
                )
    return None


def assess(
    identity: EngineIdentity,
    record: Mapping[str, Any] | None,
    jobs: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    now: dt.datetime,
    settings: BuildSettings,
) -> EngineState:
    """The state of one engine from its record, its Jobs and the pods of its latest Job."""
    latest = latest_job(jobs)
    if record is not None:
        return _recorded(record)
    if latest is None:
        return EngineState("Pending", "build Job to be created", action="create", next_attempt=1)
    name = latest["metadata"]["name"]
    attempt = _attempt(latest)
    if _condition(latest, "Complete") or _condition(latest, "SuccessCriteriaMet"):
        return EngineState(
            "Ready",
            f"built by {name}",
            job=name,
            attempts=attempt,
            action="record",
            result=termination_message(pods),
            manifest_sha256=built_manifest_sha256(pods),
        )
    failed = _condition(latest, "Failed")
    if failed:
        return _after_failure(identity, name, attempt, failed, pods, now, settings)
    waiting = pending_reason(pods)
    if waiting:
        return EngineState(
            "Pending", f"{name} waits for a GPU node: {waiting}", job=name, attempts=attempt
        )
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    since = _running_since(running[0]) if running else None
    if since is not None and now - since < REPORT_RUNNING_AFTER:
        # Not worth a status write yet: most short builds are done before it is due.
        started = f"{name} started (attempt {attempt})"
        return EngineState(
            "Building", started, job=name, attempts=attempt, look_again=since + REPORT_RUNNING_AFTER
        )
    if running:
        pod = running[0]
        node = (pod.get("spec") or {}).get("nodeName") or "?"
        msg = f"{name} running on {node}"
        if since is not None:
            # A fixed start time, not an elapsed one: the status does not change every resync.
            msg += f" since {since.strftime('%Y-%m-%dT%H:%M:%SZ')}"
    else:
        msg = f"{name} started"
    return EngineState("Building", f"{msg} (attempt {attempt})", job=name, attempts=attempt)


def _recorded(record: Mapping[str, Any]) -> EngineState:
    """An engine with a record: built, or given up on (the record outlives its Jobs)."""
    data = record.get("data") or {}
    built_by = str(data.get("job", ""))
    attempt_suffix = built_by.rpartition("-a")[2]
    attempts = int(attempt_suffix) if attempt_suffix.isdigit() else 0
    if data.get("state") == "Failed":
        return EngineState(
            "Failed", str(data.get("result") or "gave up"), job=built_by, attempts=attempts
        )
    return EngineState(
        "Ready",
        f"built by {built_by or '?'} at {data.get('builtAt', '?')}",
        job=built_by,
        attempts=attempts,
        manifest_sha256=valid_sha256(data.get("manifestSha256")),
    )


def _after_failure(
    identity: EngineIdentity,
    name: str,
    attempt: int,
    failed: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    now: dt.datetime,
    settings: BuildSettings,
) -> EngineState:
    """The latest Job failed: give up (recorded), retry now, or wait for the retry time."""
    why = termination_message(pods) or str(failed.get("message") or failed.get("reason") or "")
    base = f"attempt {attempt}/{settings.max_attempts} failed ({failed.get('reason', 'Failed')})"
    if why:
        base += f": {why}"
    # The builder's exit 2 (bad input: a repository, revision or path that does not
    # exist, credentials refused) fails the Job through its podFailurePolicy, whose
    # condition reason is PodFailurePolicy: another attempt would fail the same way.
    final = failed.get("reason") == "PodFailurePolicy"
    if final:
        base += ". The builder says a retry cannot fix this"
    if final or attempt >= settings.max_attempts:
        # Recorded, so that giving up outlives the Jobs' TTL instead of starting over.
        return EngineState(
            "Failed",
            f"{base}. Gave up; change the engine spec, or run `kubectl delete "
            f"jobs,configmaps -l {KEY_LABEL}={identity.key}` to retry.",
            job=name,
            attempts=attempt,
            action="record-failure",
        )
    failed_at = parse_time(failed.get("lastTransitionTime")) or now
    retry_at = failed_at + dt.timedelta(seconds=settings.retry_base_seconds * 2 ** (attempt - 1))
    if now >= retry_at:
        return EngineState(
            "Failed",
            f"{base}. Retrying as attempt {attempt + 1}.",
            job=name,
            attempts=attempt,
            action="create",
            next_attempt=attempt + 1,
        )
    return EngineState(
        "Failed",
        f"{base}. Retry at {retry_at.strftime('%Y-%m-%dT%H:%M:%SZ')}.",
        job=name,
        attempts=attempt,
        next_retry=retry_at,
    )


def _running_since(pod: Mapping[str, Any]) -> dt.datetime | None:
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        started = parse_time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
        if started is not None:
            return started.astimezone(dt.UTC)
    started = parse_time(status.get("startTime"))
    return started.astimezone(dt.UTC) if started else None
