"""The work queue: de-duplication, one worker per key, delayed and rate-limited adds."""

from __future__ import annotations

import asyncio

from cosyvoice_operator.shell.workqueue import WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_key_added_many_times_is_processed_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    for _ in range(5):
        q.add("a")
    q.add("b")
    assert len(q) == 2
    assert q.take_nowait() == "a"
    assert q.take_nowait() == "b"
    assert q.take_nowait() is None


def test_a_key_is_never_handed_out_twice_at_once_and_is_redone_when_added_meanwhile() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    assert q.take_nowait() == "a"
    q.add("a")  # an event while a worker holds it
    assert q.take_nowait() is None  # not handed to a second worker
    q.done("a")
    assert q.take_nowait() == "a"  # processed again, after
    q.done("a")
    assert q.take_nowait() is None


def test_add_after_waits_and_the_earliest_schedule_wins() -> None:
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add_after("a", 10)
    q.add_after("a", 30)  # later: ignored
    q.add_after("a", 5)  # sooner: wins
    assert q.take_nowait() is None
    clock.now += 4.9
    assert q.take_nowait() is None
    clock.now += 0.2
    assert q.take_nowait() == "a"
    q.done("a")
    clock.now += 30
    assert q.take_nowait() is None  # the superseded schedules do not fire again


def test_rate_limited_adds_back_off_exponentially_up_to_a_cap_and_forget_resets() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=0.5, max_delay=4.0, clock=Clock())
    delays = [q.add_rate_limited("a") for _ in range(6)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert q.failures("a") == 6
    q.forget("a")
    assert q.failures("a") == 0
    assert q.add_rate_limited("a") == 0.5


def test_get_wakes_up_for_an_add_and_for_a_due_key() -> None:
    async def scenario() -> list[str]:
        q: WorkQueue[str] = WorkQueue()
        got: list[str] = []

        async def worker() -> None:
            while len(got) < 2:
                key = await q.get()
                got.append(key)
                q.done(key)

        task = asyncio.create_task(worker())
        await asyncio.sleep(0.01)
        q.add_after("later", 0.05)
        q.add("now")
        await asyncio.wait_for(task, timeout=2)
        return got

    assert asyncio.run(scenario()) == ["now", "later"]


def test_a_waiting_worker_is_woken_by_a_key_falling_due_while_it_looked() -> None:
    async def scenario() -> str:
        clock = Clock()
        q: WorkQueue[str] = WorkQueue(clock=clock)
        q.add_after("due", 1.0)
        clock.now += 2.0  # due before the worker first looks
        return await asyncio.wait_for(q.get(), timeout=1)

    assert asyncio.run(scenario()) == "due"
