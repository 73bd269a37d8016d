"""``shell/informer.py`` against the real kube-apiserver (and its etcd).

- The list in pages: the server's own ``continue`` tokens, at a page size of 2.
- The watch after it: adds, changes and deletes, in order, past a handler that raises.
- Bookmarks: with writes elsewhere moving the resource's version on, the server sends
  BOOKMARK events near the end of each watch; the next watch resumes from the bookmark's
  version, and no handler is called for it.
- 410 Gone: an informer away while etcd was compacted resumes from a version that no longer
  exists; the server answers with an ERROR event of code 410 ("Expired"), and the informer
  lists again and replaces its store, so an object deleted while it was away is handed on as
  deleted. The compaction is etcd's own (what kube-apiserver does every 5 minutes, asked for
  at once here); the kind watched is core Events, which kube-apiserver serves from etcd
  without its watch cache, so the old version reaches etcd and is refused there.

What a healthy server does not do on demand (a 410 as the HTTP status, other ERROR events,
transport failures and the backoff) is in ``tests/unit/shell/test_informer.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import pytest
from kubernetes.aio import client, config

from cosyvoice_operator.devtools.localcluster.cluster import State
from cosyvoice_operator.shell import informer as informer_module
from cosyvoice_operator.shell.informer import Informer
from cosyvoice_operator.shell.kube import CONFIG_MAPS, EVENTS, Kube
from tests.conftest import Cluster

pytestmark = pytest.mark.cluster

Change = tuple[str | None, str | None]  # (old name, new name), as the handler saw them


class RecordingKube(Kube):
    """The real ``Kube``, keeping each watch request's query and the events it gave."""

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__(api)
        self.watches: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []

    async def watch_lines(
        self, path: str, query: Mapping[str, Any], server_seconds: float
    ) -> AsyncIterator[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        self.watches.append((dict(query), events))
        async for event in super().watch_lines(path, query, server_seconds):
            events.append(event)
            yield event


@contextlib.asynccontextmanager
async def kube_of(cluster: Cluster) -> AsyncIterator[RecordingKube]:
    configuration = client.Configuration()
    # The client's loader is untyped (kube.py is the one module allowed such calls).
    await config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=cluster.kubeconfig, client_configuration=configuration
    )
    kube = RecordingKube(client.ApiClient(configuration))
    try:
        yield kube
    finally:
        await kube.close()


@contextlib.asynccontextmanager
async def running(informer: Informer) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(informer.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(what: str, condition: Callable[[], object], within: float = 120.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {within:.0f}s: {what}")
        await asyncio.sleep(0.05)


def recorder() -> tuple[list[Change], Callable[[Any, Any], None]]:
    seen: list[Change] = []

    def on_change(old: Any, new: Any) -> None:
        seen.append((old and old["metadata"]["name"], new and new["metadata"]["name"]))

    return seen, on_change


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    name = cluster.namespace("informer")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def config_map(ns: str, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": dict(labels)},
        "data": {"v": "1"},
    }


def test_lists_in_pages_then_follows_adds_changes_and_deletes_past_a_failing_handler(
    cluster: Cluster, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(informer_module, "PAGE_SIZE", 2)
    labels = {"test": "paged"}
    for i in range(5):
        cluster.apply(ns, json.dumps(config_map(ns, f"cm-{i}", labels)))
    cluster.apply(ns, json.dumps(config_map(ns, "unlabelled", {})))
    seen, record = recorder()

    def on_change(old: Any, new: Any) -> None:
        record(old, new)
        if new is not None and new["metadata"]["name"] == "cm-1":
            raise RuntimeError("a handler's bug")  # logged; the stream goes on

    async def main() -> None:
        async with kube_of(cluster) as kube:
            informer = Informer(kube, CONFIG_MAPS, ns, on_change, label_selector="test=paged")
            async with running(informer):
                await until("the first list", informer.synced.is_set)
                # 5 objects at 2 a page: the server handed out two continue tokens.
                assert kube.requests[("GET", "configmaps")] == 3
                assert sorted(informer.store) == [(ns, f"cm-{i}") for i in range(5)]
                assert sorted(seen) == [(None, f"cm-{i}") for i in range(5)]
                seen.clear()
                await kube.merge_patch(CONFIG_MAPS, ns, "cm-1", {"data": {"v": "2"}})
                await kube.merge_patch(CONFIG_MAPS, ns, "cm-0", {"data": {"v": "2"}})
                live = await kube.request("GET", CONFIG_MAPS.path(ns, "cm-3"))
                await kube.delete(CONFIG_MAPS, ns, "cm-3", live["metadata"]["uid"])
                await kube.create(config_map(ns, "cm-5", labels))
                await kube.create(config_map(ns, "other", {}))  # not selected
                # A selected change after it: once the watch has brought this one, it has
                # passed the unselected object (a watch is in order).
                await kube.merge_patch(CONFIG_MAPS, ns, "cm-2", {"data": {"v": "3"}})
                await until("the change after the unselected object", lambda: len(seen) >= 5)
                assert seen == [
                    ("cm-1", "cm-1"),
                    ("cm-0", "cm-0"),
                    ("cm-3", None),
                    (None, "cm-5"),
                    ("cm-2", "cm-2"),
                ]
                obj = informer.get(ns, "cm-0")
                assert obj is not None and obj["data"] == {"v": "2"}
                assert "managedFields" not in obj["metadata"]  # the default transform
                assert sorted(n for _, n in informer.store) == [
                    "cm-0",
                    "cm-1",
                    "cm-2",
                    "cm-4",
                    "cm-5",
                ]
                assert informer.lists == 1 and informer.errors == 0

    asyncio.run(main())


def test_a_bookmark_moves_the_resume_point_and_calls_no_handler(cluster: Cluster, ns: str) -> None:
    elsewhere = cluster.namespace("informer-elsewhere")
    seen, on_change = recorder()
    cluster.apply(ns, json.dumps(config_map(ns, "quiet", {})))

    async def main() -> tuple[list[tuple[dict[str, Any], list[dict[str, Any]]]], str]:
        async with kube_of(cluster) as kube:
            informer = Informer(kube, CONFIG_MAPS, ns, on_change, watch_timeout=8)
            await kube.create(config_map(elsewhere, "busy", {}))

            def resumed_after_a_bookmark() -> bool:
                return any(
                    any(e["type"] == "BOOKMARK" for e in events) and i + 1 < len(kube.watches)
                    for i, (_, events) in enumerate(kube.watches)
                )

            async with running(informer):
                await until("the first list", informer.synced.is_set)
                listed = kube.watches[0][0]["resourceVersion"] if kube.watches else ""
                # Writes in another namespace move the configmaps' version on; this watch
                # sees none of them, so what it gets is bookmarks.
                i = 0
                while not resumed_after_a_bookmark():
                    i += 1
                    await kube.merge_patch(CONFIG_MAPS, elsewhere, "busy", {"data": {"i": str(i)}})
                    await asyncio.sleep(0.3)
                    assert i < 200, f"no watch resumed after a bookmark: {kube.watches}"
                return kube.watches, listed

    try:
        watches, listed = asyncio.run(main())
    finally:
        cluster.kubectl("delete", "namespace", elsewhere, "--wait=false")
    for (query, events), (after, _) in itertools.pairwise(watches):
        assert all(e["type"] == "BOOKMARK" for e in events), events
        if events:
            bookmark = events[-1]["object"]["metadata"]["resourceVersion"]
            assert after["resourceVersion"] == bookmark
            assert int(bookmark) > int(query["resourceVersion"])
        else:
            assert after["resourceVersion"] == query["resourceVersion"]
    assert int(watches[-1][0]["resourceVersion"]) > int(listed)
    assert all(query["allowWatchBookmarks"] is True for query, _ in watches)
    assert seen == [(None, "quiet")]  # the list's add; nothing for the bookmarks


def etcd_compact(cluster: Cluster) -> int:
    """Compact the cluster's etcd at its current revision (through etcd's HTTP gateway);
    the revision."""
    port = State.load(cluster.local.paths.state).ports["etcd"]

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            result: dict[str, Any] = json.loads(answer.read())
        return result

    revision = int(post("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision


def core_event(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": ns, "labels": {"test": "relist"}},
        "involvedObject": {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "namespace": ns},
        "reason": "Tested",
        "message": name,
        "type": "Normal",
    }


def test_a_version_compacted_away_is_410_and_the_relist_replaces_the_store(
    cluster: Cluster, ns: str
) -> None:
    seen, on_change = recorder()

    async def main() -> None:
        async with kube_of(cluster) as kube:
            for name in ("e1", "e2"):
                await kube.request("POST", EVENTS.path(ns), body=core_event(ns, name))
            informer = Informer(kube, EVENTS, ns, on_change, label_selector="test=relist")
            async with running(informer):
                await until("the first list", lambda: len(informer.store) == 2)
                await until("the watch", lambda: bool(kube.watches))
            # Away: one deleted, one made, and etcd compacted past the version it holds.
            resume = int(kube.watches[-1][0]["resourceVersion"])
            live = await kube.request("GET", EVENTS.path(ns, "e1"))
            assert await kube.delete(EVENTS, ns, "e1", live["metadata"]["uid"])
            await kube.request("POST", EVENTS.path(ns), body=core_event(ns, "e3"))
            assert etcd_compact(cluster) > resume
            seen.clear()
            watches_before = len(kube.watches)
            async with running(informer):
                await until("the list after the 410", lambda: informer.lists == 2)
                await until("a watch after it", lambda: len(kube.watches) > watches_before + 1)
            query, events = kube.watches[watches_before]
            assert int(query["resourceVersion"]) == resume
            assert [e["type"] for e in events] == ["ERROR"], events
            status = events[0]["object"]
            assert (status["code"], status["reason"]) == (410, "Expired"), status
            # What changed first, then what is gone.
            assert seen == [(None, "e3"), ("e1", None)]
            assert sorted(informer.store) == [(ns, "e2"), (ns, "e3")]
            assert informer.errors == 0
            # The new watch starts from the new list's version, past the compaction.
            assert int(kube.watches[watches_before + 1][0]["resourceVersion"]) > resume

    asyncio.run(main())
