"""engine_state.assess: the state of one engine, and what the operator does next."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from cosyvoice_operator.plan import engine_state
from cosyvoice_operator.plan.engine_state import EngineState, assess
from cosyvoice_operator.render import build_job
from cosyvoice_operator.render.build_job import BuildSettings
from tests.unit.objects import CACHE, T0, identity, job, pod, record

IDENT = identity(gpu_arch="sm_90")
SETTINGS = BuildSettings(max_attempts=3, retry_base_seconds=60.0)
MINUTE = dt.timedelta(minutes=1)


def _name(attempt: int) -> str:
    return build_job.job_name(IDENT, attempt, CACHE)


@dataclass
class Case:
    id: str
    jobs: Sequence[dict[str, Any]] = ()
    pods: Sequence[dict[str, Any]] = ()
    record: dict[str, Any] | None = None
    now: dt.datetime = T0
    # expected
    state: str = ""
    action: str = "none"
    next_attempt: int = 0
    next_retry: dt.datetime | None = None
    job: str = ""
    attempts: int = 0
    message_has: Sequence[str] = field(default_factory=tuple)
    look_again: dt.datetime | None = None


CASES = [
    Case(
        "record-present",
        record=record(IDENT, _name(1), T0 - MINUTE),
        state="Ready",
        job=_name(1),
        attempts=1,  # read off the record's Job name: the handler lists no Jobs then
        message_has=(f"built by {_name(1)}", "2025-03-01T11:59:00Z"),
    ),
    Case(
        "record-present-with-failed-jobs",  # the record wins, whatever the Jobs say
        record=record(IDENT, _name(2), T0),
        jobs=[job(IDENT, 1, failed_at=T0 - 10 * MINUTE), job(IDENT, 2, complete_at=T0)],
        state="Ready",
        job=_name(2),
        attempts=2,
    ),
    Case(
        "no-jobs",
        state="Pending",
        action="create",
        next_attempt=1,
        message_has=("to be created",),
    ),
    Case(
        "active-unschedulable",
        jobs=[job(IDENT, 1)],
        pods=[pod(unschedulable_message="0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")],
        state="Pending",
        job=_name(1),
        attempts=1,
        message_has=(_name(1), "waits for a GPU node", "4 Insufficient nvidia.com/gpu."),
    ),
    Case(
        "active-no-pod-yet",
        jobs=[job(IDENT, 1)],
        state="Building",
        job=_name(1),
        attempts=1,
        message_has=(f"{_name(1)} started", "(attempt 1)"),
    ),
    Case(
        # Running for less than REPORT_RUNNING_AFTER: not worth a status write yet.
        "running-briefly",
        jobs=[job(IDENT, 2)],
        pods=[pod(phase="Running", node_name="gpu-h100-3")],
        now=T0 + 9 * dt.timedelta(seconds=1),
        state="Building",
        job=_name(2),
        attempts=2,
        message_has=(f"{_name(2)} started (attempt 2)",),
        look_again=T0 + 10 * dt.timedelta(seconds=1),
    ),
    Case(
        "running",
        jobs=[job(IDENT, 2)],
        pods=[pod(phase="Running", node_name="gpu-h100-3")],
        now=T0 + 10 * dt.timedelta(seconds=1),
        state="Building",
        job=_name(2),
        attempts=2,
        message_has=(
            f"{_name(2)} running on gpu-h100-3 since 2025-03-01T12:00:00Z",
            "(attempt 2)",
        ),
    ),
    Case(
        "complete",
        jobs=[job(IDENT, 1, complete_at=T0)],
        pods=[
            pod(
                phase="Succeeded",
                termination_message=json.dumps(
                    {"result": "built", "step": "publish", "message": "engine published"}
                ),
                exit_code=0,
            )
        ],
        state="Ready",
        action="record",
        job=_name(1),
        attempts=1,
        message_has=(f"built by {_name(1)}",),
    ),
    Case(
        "failed-attempt-1-before-backoff",
        jobs=[job(IDENT, 1, failed_at=T0)],
        now=T0 + 30 * dt.timedelta(seconds=1),
        state="Failed",
        job=_name(1),
        attempts=1,
        next_retry=T0 + 60 * dt.timedelta(seconds=1),
        message_has=(
            "attempt 1/3 failed (BackoffLimitExceeded)",
            "Retry at 2025-03-01T12:01:00Z",
        ),
    ),
    Case(
        "failed-attempt-1-at-backoff",
        jobs=[job(IDENT, 1, failed_at=T0)],
        now=T0 + MINUTE,
        state="Failed",
        action="create",
        next_attempt=2,
        job=_name(1),
        attempts=1,
        message_has=("Retrying as attempt 2",),
    ),
    Case(
        "failed-attempt-2-backoff-doubles",
        jobs=[job(IDENT, 1, failed_at=T0 - 10 * MINUTE), job(IDENT, 2, failed_at=T0)],
        now=T0 + 90 * dt.timedelta(seconds=1),
        state="Failed",
        job=_name(2),
        attempts=2,
        next_retry=T0 + 2 * MINUTE,
        message_has=("attempt 2/3 failed", "Retry at 2025-03-01T12:02:00Z"),
    ),
    Case(
        "failed-attempt-2-after-doubled-backoff",
        jobs=[job(IDENT, 1, failed_at=T0 - 10 * MINUTE), job(IDENT, 2, failed_at=T0)],
        now=T0 + 2 * MINUTE,
        state="Failed",
        action="create",
        next_attempt=3,
        job=_name(2),
        attempts=2,
    ),
    Case(
        "failed-last-attempt-gives-up",
        jobs=[
            job(IDENT, 1, failed_at=T0 - 20 * MINUTE),
            job(IDENT, 2, failed_at=T0 - 10 * MINUTE),
            job(IDENT, 3, failed_at=T0),
        ],
        now=T0 + 24 * 60 * MINUTE,
        state="Failed",
        job=_name(3),
        attempts=3,
        action="record-failure",
        message_has=(
            "attempt 3/3 failed",
            "Gave up",
            "change the engine spec",
            f"kubectl delete jobs,configmaps -l tts.cosyvoice.dev/engine-key={IDENT.key}",
        ),
    ),
    Case(
        "recorded-failure-stays-failed-without-jobs",
        record={
            "data": {
                "state": "Failed",
                "job": _name(3),
                "result": "attempt 3/3 failed (BackoffLimitExceeded). Gave up; ...",
            }
        },
        now=T0 + 48 * 60 * MINUTE,
        state="Failed",
        job=_name(3),
        attempts=3,
        message_has=("attempt 3/3 failed", "Gave up"),
    ),
    Case(
        "latest-attempt-wins-whatever-the-order",
        jobs=[job(IDENT, 3), job(IDENT, 1, failed_at=T0), job(IDENT, 2, failed_at=T0)],
        state="Building",
        job=_name(3),
        attempts=3,
    ),
    Case(
        "latest-attempt-10-sorts-numerically",
        jobs=[job(IDENT, 9, failed_at=T0), job(IDENT, 10)],
        state="Building",
        job=_name(10),
        attempts=10,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_assess(case: Case) -> None:
    st = assess(IDENT, case.record, case.jobs, case.pods, case.now, SETTINGS)
    assert st.state == case.state
    assert st.action == case.action
    assert st.next_attempt == case.next_attempt
    assert st.next_retry == case.next_retry
    assert st.job == case.job
    assert st.attempts == case.attempts
    assert st.look_again == case.look_again
    for text in case.message_has:
        assert text in st.message


def test_give_up_is_not_retried_however_long_one_waits() -> None:
    jobs = [job(IDENT, 3, failed_at=T0)]
    for later in (T0, T0 + dt.timedelta(days=30)):
        st = assess(IDENT, None, jobs, [], later, SETTINGS)
        # giving up is recorded once, and nothing more is created
        assert (st.state, st.action, st.next_retry) == ("Failed", "record-failure", None)


@pytest.mark.parametrize(
    ("attempt", "base", "delay"),
    [(1, 60.0, 60), (2, 60.0, 120), (3, 60.0, 240), (4, 60.0, 480), (1, 5.0, 5), (3, 5.0, 20)],
)
def test_retry_delay_is_base_times_two_to_the_attempt_minus_one(
    attempt: int, base: float, delay: int
) -> None:
    settings = BuildSettings(max_attempts=10, retry_base_seconds=base)
    st = assess(IDENT, None, [job(IDENT, attempt, failed_at=T0)], [], T0, settings)
    assert st.next_retry == T0 + dt.timedelta(seconds=delay)
    just_before = T0 + dt.timedelta(seconds=delay) - dt.timedelta(microseconds=1)
    assert (
        assess(IDENT, None, [job(IDENT, attempt, failed_at=T0)], [], just_before, settings).action
        == "none"
    )


def test_max_attempts_one_never_retries() -> None:
    st = assess(
        IDENT, None, [job(IDENT, 1, failed_at=T0)], [], T0 + MINUTE, BuildSettings(max_attempts=1)
    )
    assert (st.state, st.action) == ("Failed", "record-failure")
    assert "attempt 1/1 failed" in st.message and "Gave up" in st.message


def test_the_builders_exit_2_is_final_at_the_first_attempt() -> None:
    """Issue 21 L1: a Job failed by its podFailurePolicy (exit 2, bad input) is not retried:
    each retry would be scheduled on a GPU node only to fail the same way."""
    failed = job(
        IDENT,
        1,
        failed_at=T0,
        failed_reason="PodFailurePolicy",
        failed_message="Container builder for pod x failed with exit code 2",
    )
    for now in (T0, T0 + 60 * MINUTE):
        st = assess(IDENT, None, [failed], [], now, SETTINGS)
        assert (st.state, st.action, st.next_retry) == ("Failed", "record-failure", None)
        assert "attempt 1/3 failed (PodFailurePolicy)" in st.message
        assert "a retry cannot fix this" in st.message and "Gave up" in st.message


def test_failure_without_transition_time_retries_from_now() -> None:
    failed = job(IDENT, 1, failed_at=T0)
    for cond in failed["status"]["conditions"]:
        del cond["lastTransitionTime"]
    st = assess(IDENT, None, [failed], [], T0, SETTINGS)
    assert st.next_retry == T0 + dt.timedelta(seconds=60)


# ---- messages -----------------------------------------------------------------------------


def test_termination_message_json_of_the_newest_pod_is_in_the_failure_message() -> None:
    old = pod(
        "p-old",
        created=T0 - 10 * MINUTE,
        phase="Failed",
        termination_message=json.dumps(
            {"result": "failed", "step": "download", "message": "timeout talking to hf.co"}
        ),
    )
    new = pod(
        "p-new",
        created=T0 - MINUTE,
        phase="Failed",
        termination_message=json.dumps(
            {"result": "failed", "step": "convert", "message": "CUDA out of memory"}
        ),
    )
    st = assess(IDENT, None, [job(IDENT, 1, failed_at=T0)], [old, new], T0, SETTINGS)
    assert "step convert: CUDA out of memory" in st.message
    assert "hf.co" not in st.message
    # the same whatever order the API lists the pods in
    st2 = assess(IDENT, None, [job(IDENT, 1, failed_at=T0)], [new, old], T0, SETTINGS)
    assert st2.message == st.message


def test_non_json_termination_message_is_used_as_is() -> None:
    tail = "Traceback (most recent call last):\n  ...\nRuntimeError: engine build failed"
    p = pod(phase="Failed", termination_message=tail)
    st = assess(IDENT, None, [job(IDENT, 1, failed_at=T0)], [p], T0, SETTINGS)
    assert tail in st.message


def test_job_condition_message_when_pod_says_nothing() -> None:
    st = assess(
        IDENT,
        None,
        [
            job(
                IDENT,
                1,
                failed_at=T0,
                failed_reason="DeadlineExceeded",
                failed_message="Job was active longer than specified deadline",
            )
        ],
        [],
        T0,
        SETTINGS,
    )
    assert "(DeadlineExceeded)" in st.message
    assert "Job was active longer than specified deadline" in st.message


def test_complete_carries_the_builders_result_for_the_record() -> None:
    p = pod(
        phase="Succeeded",
        exit_code=0,
        termination_message=json.dumps({"result": "built", "step": "verify", "message": "ok"}),
    )
    st = assess(IDENT, None, [job(IDENT, 1, complete_at=T0)], [p], T0, SETTINGS)
    assert st.action == "record"
    assert st.result == "step verify: ok"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"result": "failed", "step": "fetch", "message": "404"}', "step fetch: 404"),
        ('{"result": "failed", "message": "no step"}', "no step"),
        ('{"result": "failed", "step": "fetch"}', "step fetch:"),
        ('{"result": "failed"}', '{"result": "failed"}'),
        ("[1, 2]", "[1, 2]"),
        ("plain log line", "plain log line"),
        ("  padded  \n", "padded"),
        ("", ""),
    ],
)
def test_termination_message_forms(text: str, expected: str) -> None:
    assert (
        engine_state.termination_message([pod(phase="Failed", termination_message=text)])
        == expected
    )


def test_termination_message_keeps_the_tail_of_long_text() -> None:
    text = "head " + "x" * 5000 + " the real error"
    out = engine_state.termination_message([pod(phase="Failed", termination_message=text)])
    assert len(out) == 1000
    assert out.endswith("the real error")


def test_termination_message_skips_pods_without_one() -> None:
    silent = pod("p-new", created=T0, phase="Failed")
    talking = pod("p-old", created=T0 - MINUTE, phase="Failed", termination_message="oom")
    assert engine_state.termination_message([silent, talking]) == "oom"
    assert engine_state.termination_message([]) == ""


def test_pending_reason_falls_back_to_the_reason() -> None:
    p = pod(unschedulable_message="")
    assert engine_state.pending_reason([p]) == "Unschedulable"
    assert engine_state.pending_reason([pod(phase="Running", node_name="n")]) == ""


def test_engine_state_defaults() -> None:
    st = EngineState("Pending", "m")
    assert (st.action, st.next_attempt, st.next_retry, st.job, st.attempts) == (
        "none",
        0,
        None,
        "",
        0,
    )
