"""What the operator writes for a new service on its way to EngineReady (issue 18, item 7):
the build Job, a status, the engine record, the EngineReady status, and nothing else; serving
starts from the record, after. A build that runs past REPORT_RUNNING_AFTER (10 s: every real
one, kwok's are shorter) costs one status write more: the running report. A watch that lags
behind the writes changes nothing (issue 31, item 4)."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from cosyvoice_operator.plan.engine_state import REPORT_RUNNING_AFTER
from tests.unit.lifecycle_driver import STARTED, Driver

SHORT = STARTED + dt.timedelta(seconds=3)  # as kwok's builds: done before the report is due
LONG = STARTED + dt.timedelta(minutes=5)  # as real builds


def built(now: dt.datetime, lagging: bool = False) -> tuple[Driver, dict[str, int]]:
    """A new service driven from apply to serving; the writes of each stage."""
    driver = Driver(now=now, lagging=lagging)
    return driver, asyncio.run(driver.build("s0"))


def path_to_engine_ready(driver: Driver) -> list[tuple[str, str]]:
    """The writes up to the status write that says EngineReady: the first after the record."""
    writes = driver.cluster.writes
    record = next(i for i, w in enumerate(writes) if w[:2] == ("POST", "ConfigMap"))
    ready = writes.index(("PATCH", "CosyVoiceService", "s0"), record)
    return [(verb, kind) for verb, kind, _ in writes[: ready + 1]]


def test_a_build_under_ten_seconds_costs_four_writes_until_the_engine_is_ready() -> None:
    assert SHORT - STARTED < REPORT_RUNNING_AFTER
    driver, stages = built(SHORT)
    path = path_to_engine_ready(driver)
    assert path == [
        ("POST", "Job"),
        ("PATCH", "CosyVoiceService"),  # BuildingEngine
        ("POST", "ConfigMap"),  # the engine record
        ("PATCH", "CosyVoiceService"),  # EngineReady
    ]
    assert driver.cluster.events == []  # a build that just works: the status says it
    # The build pod pending, scheduled and running (for less than REPORT_RUNNING_AFTER)
    # changes nothing a user reads: no write.
    assert stages["building"] == 0
    assert "running on" not in driver.statuses["building"]["engines"][0]["message"]
    # Then serving, from the record: the repository, the Deployment, its Service,
    # PodDisruptionBudget and NetworkPolicy and one status; one more once replicas are Ready.
    after = [(verb, kind) for verb, kind, _ in driver.cluster.writes[len(path) :]]
    assert after[-2:] == [("PATCH", "CosyVoiceService")] * 2
    assert {kind for _, kind in after[:-2]} >= {"ConfigMap", "Deployment", "Service"}
    assert driver.status("s0")["phase"] == "Ready"


def test_a_build_over_ten_seconds_costs_five_writes_until_the_engine_is_ready() -> None:
    driver, stages = built(LONG)
    assert path_to_engine_ready(driver) == [
        ("POST", "Job"),
        ("PATCH", "CosyVoiceService"),  # BuildingEngine
        ("PATCH", "CosyVoiceService"),  # the running report: the build's node and start
        ("POST", "ConfigMap"),  # the engine record
        ("PATCH", "CosyVoiceService"),  # EngineReady
    ]
    assert stages["building"] == 1
    [engine] = driver.statuses["building"]["engines"]
    assert engine["state"] == "Building"
    assert "running on gpu-0 since 2026-12-03T12:00:00Z" in engine["message"]
    assert driver.cluster.events == []
    assert driver.status("s0")["phase"] == "Ready"
    # Serving costs what it costs after a short build: the build's length is not in it.
    _, short = built(SHORT)
    assert (stages["built"], stages["serving"]) == (short["built"], short["serving"])


@pytest.mark.parametrize("now", [SHORT, LONG], ids=["short-build", "long-build"])
def test_a_watch_behind_the_writes_costs_no_write_more(now: dt.datetime) -> None:
    """The operator's own writes come back one pass late, overtaken by the build pod's and
    the Job's changes: every pass plans on what it wrote (Cache.wrote) and the late events
    do not take the caches back to older copies; the same writes, in the same order."""
    lagging, _ = built(now, lagging=True)
    at_once, _ = built(now)
    assert lagging.cluster.held > 0  # events were held back, and delivered late
    assert lagging.cluster.writes == at_once.cluster.writes
    assert lagging.status("s0")["phase"] == "Ready"


def test_services_built_side_by_side_cost_no_more_each() -> None:
    async def run() -> Driver:
        driver = Driver()
        for i in range(10):
            driver.cluster.put(_body(i))
        await driver.settle()
        jobs = driver.jobs()
        for job in jobs:
            driver.build_pod(job, "Running", "gpu-0")
        await driver.settle()
        for job in jobs:
            driver.build_pod(job, "Succeeded", "gpu-0")
            driver.complete(job)
        await driver.settle()
        return driver

    driver = asyncio.run(run())
    assert all(driver.engine_ready(f"s{i}") for i in range(10))
    writes = driver.cluster.writes
    assert sum(1 for w in writes if w[:2] == ("POST", "Job")) == 10
    assert sum(1 for w in writes if w[:2] == ("POST", "ConfigMap")) == 10  # the records
    for i in range(10):
        # BuildingEngine, EngineReady, serving applied (no replica Ready in this test):
        # interleaved passes never write twice nor conflict
        assert writes.count(("PATCH", "CosyVoiceService", f"s{i}")) == 3
    assert driver.cluster.events == []


def _body(i: int) -> dict[str, object]:
    from tests.unit.lifecycle_driver import service_body

    return service_body(f"s{i}")
