"""serving.progress: a wedged stub is work in flight with no inference completing."""

from __future__ import annotations

from cosyvoice_engine_builder.serving.progress import Reading, StallWatch, reading

PAGE = """# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="cosyvoice2",version="1"} 4
nv_inference_request_success{model="token2wav",version="1"} 30
nv_inference_request_failure{model="token2wav",reason="BACKEND",version="1"} 2
nv_inference_request_failure_total_bogus 1000
nv_inference_pending_request_count{model="cosyvoice2",version="1"} 3
cosyvoice_active_streams{instance="cosyvoice2_0_0"} 1
cosyvoice_active_streams{instance="cosyvoice2_0_1"} 0
"""


def test_a_page_is_read_as_work_and_completed_inferences() -> None:
    assert reading(PAGE) == Reading(work=4, completed=36)
    assert reading("") == Reading(0, 0)


def test_work_without_progress_for_the_limit_is_a_stall() -> None:
    watch = StallWatch(10)
    assert watch.observe(0, Reading(1, 5)) is None
    assert watch.observe(9.9, Reading(1, 5)) is None
    assert watch.observe(10, Reading(1, 5)) == 10
    assert watch.observe(12, Reading(2, 5)) == 12


def test_any_completed_inference_restarts_the_clock() -> None:
    watch = StallWatch(10)
    watch.observe(0, Reading(1, 5))
    assert watch.observe(8, Reading(1, 6)) is None
    assert watch.observe(17, Reading(1, 6)) is None
    assert watch.observe(18, Reading(1, 6)) == 10


def test_no_work_is_never_a_stall_and_resets_the_clock() -> None:
    watch = StallWatch(10)
    watch.observe(0, Reading(1, 5))
    assert watch.observe(20, Reading(0, 5)) is None  # idle: nothing to progress on
    assert watch.observe(25, Reading(1, 5)) is None  # new work: its clock starts now
    assert watch.observe(34, Reading(1, 5)) is None
    assert watch.observe(35, Reading(1, 5)) == 10


def test_an_unreadable_page_proves_nothing() -> None:
    watch = StallWatch(10)
    watch.observe(0, Reading(1, 5))
    assert watch.observe(5, None) is None
    assert watch.observe(11, Reading(1, 5)) == 11


def test_zero_turns_the_watch_off() -> None:
    watch = StallWatch(0)
    assert watch.observe(0, Reading(1, 5)) is None
    assert watch.observe(1000, Reading(1, 5)) is None
