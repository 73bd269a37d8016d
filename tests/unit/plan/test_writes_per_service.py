"""What the operator writes for a new service on its way to EngineReady (issue 18, item 7):
the build Job, a status, the engine record, the EngineReady status, and nothing else; serving
starts from the record, after."""

from __future__ import annotations

import asyncio

from tests.unit.lifecycle_driver import Driver


def test_a_new_service_costs_four_writes_until_its_engine_is_ready() -> None:
    driver = Driver()
    stages = asyncio.run(driver.build("s0"))
    writes = driver.cluster.writes
    path = writes[: writes.index(("PATCH", "CosyVoiceService", "s0"), 2) + 1]
    kinds = [(verb, kind) for verb, kind, _ in path]
    assert kinds == [
        ("POST", "Job"),
        ("PATCH", "CosyVoiceService"),  # BuildingEngine
        ("POST", "ConfigMap"),  # the engine record
        ("PATCH", "CosyVoiceService"),  # EngineReady
    ]
    assert driver.cluster.events == []  # a build that just works: the status says it
    # The build pod pending, scheduled and running (for less than REPORT_RUNNING_AFTER)
    # changes nothing a user reads: no write.
    assert stages["building"] == 0
    # Then serving, from the record: the repository, the Deployment, its Service,
    # PodDisruptionBudget and NetworkPolicy and one status; one more once replicas are Ready.
    after = [(verb, kind) for verb, kind, _ in writes[len(path) :]]
    assert after[-2:] == [("PATCH", "CosyVoiceService")] * 2
    assert {kind for _, kind in after[:-2]} >= {"ConfigMap", "Deployment", "Service"}
    assert driver.status("s0")["phase"] == "Ready"


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
