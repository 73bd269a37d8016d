"""``shell/informer.py`` where a real API server cannot be made to answer on demand.

Against the real kube-apiserver (``tests/cluster/test_informer.py``): paging with
``continue``, the watch's adds, changes and deletes, a handler that raises, a bookmark moving
the resume point, and a compacted resourceVersion answered with a 410 ERROR event, after
which the informer lists again and replaces its store.

Here, with a scripted stand-in for ``Kube`` (the informer calls only ``request`` and
``watch_lines``): a watch refused with HTTP status 410 (rather than the ERROR event the real
server sends), other ERROR events, a connection that fails, and the backoff between retries;
none of these can be had from a healthy local control plane when a test wants them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, cast

import pytest

from cosyvoice_operator.shell.informer import Cache, Informer, Refusals
from cosyvoice_operator.shell.kube import CONFIG_MAPS, Kube, KubeError

NS = "voices"
Change = tuple[str | None, str | None]  # (old name, new name) as a handler saw them


def config_map(name: str, version: int) -> dict[str, Any]:
    return {
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS, "resourceVersion": str(version)},
    }


def event(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": dict(obj)}


def expired() -> dict[str, Any]:
    return event("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "old"})


Step = list[dict[str, Any]] | Exception


class ScriptedKube:
    """Answers lists and watches from scripts, in order; records what was asked.

    ``lists``: one page (``items``, ``continue``, ``resourceVersion``) per list request.
    ``watches``: per watch request, its events, or an exception raised when it starts. When
    the script runs out, a watch blocks until the test cancels the informer.
    """

    def __init__(self, lists: list[dict[str, Any]], watches: list[Step]) -> None:
        self.lists = lists
        self.watches = watches
        self.list_queries: list[dict[str, Any]] = []
        self.watch_queries: list[dict[str, Any]] = []
        self.idle = asyncio.Event()  # set once the scripts are used up

    async def request(
        self, verb: str, path: str, query: Mapping[str, Any] | None = None, **_: Any
    ) -> Any:
        assert (verb, path) == ("GET", CONFIG_MAPS.path(NS))
        self.list_queries.append(dict(query or {}))
        page = self.lists.pop(0)
        meta = {"resourceVersion": page["version"], "continue": page.get("continue", "")}
        return {"kind": "ConfigMapList", "metadata": meta, "items": page["items"]}

    async def watch_lines(
        self, path: str, query: Mapping[str, Any], server_seconds: float
    ) -> AsyncIterator[dict[str, Any]]:
        self.watch_queries.append(dict(query))
        if not self.watches:
            self.idle.set()
            await asyncio.Event().wait()  # the watch stays open, with nothing to say
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        for item in step:
            yield item


def run(
    kube: ScriptedKube,
    on_change: Callable[[Any, Any], None] | None = None,
    timeout: float = 10.0,
) -> tuple[Informer, list[Change]]:
    """Run an informer until the scripts are used up; what its handler saw."""
    seen: list[Change] = []

    def record(old: Any, new: Any) -> None:
        seen.append(
            (old and old["metadata"]["name"], new and new["metadata"]["name"]),
        )
        if on_change is not None:
            on_change(old, new)

    informer = Informer(cast(Kube, kube), CONFIG_MAPS, NS, record)

    async def main() -> None:
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(kube.idle.wait(), timeout)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    return informer, seen


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The informer's backoff waits, recorded and not waited; its jitter fixed at x1."""
    recorded: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        recorded.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    monkeypatch.setattr(random, "random", lambda: 0.5)
    return recorded


def test_a_watch_refused_with_status_410_lists_again_at_once_and_replaces_the_store(
    waits: list[float],
) -> None:
    gone = KubeError(410, "Gone", "too old resource version", "WATCH", CONFIG_MAPS.path(NS))
    kube = ScriptedKube(
        lists=[
            {"version": "10", "items": [config_map("a", 5), config_map("b", 6)]},
            # Meanwhile: a deleted, b unchanged, c made.
            {"version": "20", "items": [config_map("b", 6), config_map("c", 15)]},
        ],
        watches=[gone],
    )
    informer, seen = run(kube)
    # Changes first, then deletes of what the new list no longer holds.
    assert seen == [(None, "a"), (None, "b"), (None, "c"), ("a", None)]
    assert sorted(informer.store) == [(NS, "b"), (NS, "c")]
    assert informer.lists == 2 and informer.errors == 0 and waits == []
    assert [q["resourceVersion"] for q in kube.watch_queries] == ["10", "20"]


def test_an_error_event_other_than_410_is_retried_from_the_same_version(
    waits: list[float],
) -> None:
    failure = {"kind": "Status", "code": 500, "reason": "InternalError", "message": "etcd hiccup"}
    kube = ScriptedKube(
        lists=[{"version": "10", "items": [config_map("a", 5)]}],
        watches=[[event("MODIFIED", config_map("a", 11)), event("ERROR", failure)]],
    )
    informer, seen = run(kube)
    assert seen == [(None, "a"), ("a", "a")]
    assert informer.lists == 1 and informer.errors == 1
    assert "500 InternalError: etcd hiccup" in informer.last_error
    # Resumed after the last event applied, not listed again.
    assert [q["resourceVersion"] for q in kube.watch_queries] == ["10", "11"]


def test_failures_back_off_doubling_to_30_seconds_and_keep_the_resume_point(
    waits: list[float],
) -> None:
    down = KubeError(0, "ClientConnectorError", "connection refused", "WATCH", "/")
    watches: list[Step] = [down] * 8
    watches.append([event("ADDED", config_map("a", 12))])
    kube = ScriptedKube(lists=[{"version": "10", "items": []}], watches=watches)
    informer, seen = run(kube)
    assert seen == [(None, "a")]
    assert informer.lists == 1 and informer.errors == 8
    assert informer.last_error.endswith("connection refused")
    # 0.5 s doubling, capped at 30 s (jitter: x0.5 to x1.5, fixed at x1 here).
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    versions = [q["resourceVersion"] for q in kube.watch_queries]
    assert versions == ["10"] * 9 + ["12"]


def test_a_failed_list_is_retried_before_anything_is_synced(waits: list[float]) -> None:
    class FailingFirstList(ScriptedKube):
        failed = False

        async def request(
            self, verb: str, path: str, query: Mapping[str, Any] | None = None, **_: Any
        ) -> Any:
            if not self.failed:
                self.failed = True
                raise KubeError(503, "Service Unavailable", "starting", verb, path)
            return await super().request(verb, path, query)

    kube = FailingFirstList(lists=[{"version": "7", "items": [config_map("a", 3)]}], watches=[])
    informer, seen = run(kube)
    assert seen == [(None, "a")] and informer.synced.is_set()
    assert informer.lists == 1 and informer.errors == 1 and waits == [0.5]


def test_the_list_follows_continue_tokens_with_the_same_selector_and_limit() -> None:
    kube = ScriptedKube(
        lists=[
            {"version": "9", "items": [config_map("a", 1)], "continue": "t1"},
            {"version": "10", "items": [config_map("b", 2)], "continue": "t2"},
            {"version": "11", "items": [config_map("c", 3)]},
        ],
        watches=[],
    )
    informer = Informer(
        cast(Kube, kube), CONFIG_MAPS, NS, lambda old, new: None, label_selector="app=tts"
    )

    async def main() -> None:
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(kube.idle.wait(), 10)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert kube.list_queries == [
        {"limit": 500, "labelSelector": "app=tts"},
        {"limit": 500, "labelSelector": "app=tts", "continue": "t1"},
        {"limit": 500, "labelSelector": "app=tts", "continue": "t2"},
    ]
    # The watch starts from the last page's version, with the selector and bookmarks.
    [watch] = kube.watch_queries
    assert watch["resourceVersion"] == "11" and watch["labelSelector"] == "app=tts"
    assert watch["allowWatchBookmarks"] is True
    assert sorted(informer.store) == [(NS, "a"), (NS, "b"), (NS, "c")]


def test_a_410_error_event_mid_stream_lists_again_without_counting_an_error(
    waits: list[float],
) -> None:
    kube = ScriptedKube(
        lists=[
            {"version": "10", "items": [config_map("a", 5)]},
            {"version": "30", "items": [config_map("a", 25)]},
        ],
        watches=[[event("MODIFIED", config_map("a", 12)), expired()]],
    )
    informer, seen = run(kube)
    # The relist finds a changed since the watch's last event: one change, no delete.
    assert seen == [(None, "a"), ("a", "a"), ("a", "a")]
    assert informer.get(NS, "a") == config_map("a", 25)
    assert informer.lists == 2 and informer.errors == 0 and waits == []


def test_refused_reads_are_one_line_per_backoff_step_for_every_informer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 23: a ServiceAccount without RBAC printed a warning per informer and retry, for
    ever. The refusals of a step are gathered into one line naming every kind."""
    now = [0.0]
    refusals = Refusals(clock=lambda: now[0], gather=0.01)
    forbidden = KubeError(403, "Forbidden", 'configmaps is forbidden: User "x"', "GET", "/")
    names = [f"kind{i} in all namespaces" for i in range(10)]

    async def step(delay: float) -> None:
        for name in names:
            refusals.refuse(name, forbidden, delay)
        await asyncio.sleep(0.05)  # the gathering window passes

    async def main() -> None:
        await step(0.5)
        now[0] += 0.2  # informers whose jittered retry came early: not a new step yet
        await step(1.0)
        now[0] += 1.0
        await step(1.0)
        for name in names:
            refusals.granted(name)

    with caplog.at_level("DEBUG", logger="cosyvoice_operator.shell.informer"):
        asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("the API server refuses 10 of the operator's reads (403")
    assert all(name in warnings[0] for name in names)
    assert "rbac.create=true" in warnings[0]
    infos = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert infos == ["the API server grants the operator's reads again"]


def test_events_older_than_a_copy_written_through_leave_the_store_as_written() -> None:
    """Cache.wrote stores what the operator wrote before its watch event comes; the events
    of its earlier writes, still on their way, must not take the store back (a pass would
    plan on the older copy and write again, or conflict)."""
    handed_on: list[str] = []
    informer = Informer(
        cast(Kube, None),
        CONFIG_MAPS,
        NS,
        lambda old, new: handed_on.append(
            str((new or {}).get("metadata", {}).get("resourceVersion"))
        ),
    )
    cache = Cache([informer])

    def stored() -> str:
        found = informer.get(NS, "a")
        assert found is not None
        return str(found["metadata"]["resourceVersion"])

    cache.deliver(event("ADDED", config_map("a", 1)))
    cache.wrote(config_map("a", 2), "1")  # a write; its event on its way
    cache.wrote(config_map("a", 3), "2")  # another, before the first one's event came
    cache.deliver(event("MODIFIED", config_map("a", 2)))  # the first write's event, late
    assert stored() == "3"
    cache.deliver(event("MODIFIED", config_map("a", 3)))  # the second's: caught up
    cache.deliver(event("MODIFIED", config_map("a", 4)))  # another client's change
    assert stored() == "4"
    assert handed_on == ["1", "2", "3", "4"]
    # A write that changed nothing (same version) awaits no event: the next one is stored.
    cache.wrote(config_map("a", 4), "4")
    cache.deliver(event("MODIFIED", config_map("a", 5)))
    assert stored() == "5"
    cache.deliver(event("DELETED", config_map("a", 6)))
    assert informer.get(NS, "a") is None
