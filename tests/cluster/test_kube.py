"""``shell/kube.py`` against the real kube-apiserver: the refusals it gives on demand (404, 409
for a taken name and for a uid or resourceVersion precondition, 422, a watch of a resource
that does not exist, a token it does not know) and what ``Kube`` makes of each. What a
healthy server does not do on demand (5xx, bodies without JSON, dropped connections, a
server that is down) is in ``tests/unit/shell/test_kube.py``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.aio import client, config
from kubernetes.aio.config import kube_config

from cosyvoice_operator.shell.kube import CONFIG_MAPS, EVENTS, ConnectError, Kube, KubeError
from tests.conftest import Cluster

pytestmark = pytest.mark.cluster


@contextlib.asynccontextmanager
async def kube_of(cluster: Cluster) -> AsyncIterator[Kube]:
    """A ``Kube`` with the local cluster's admin credentials (the default configuration of
    the client is left alone)."""
    configuration = client.Configuration()
    # The client's loader is untyped (kube.py is the one module allowed such calls).
    await config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=cluster.kubeconfig, client_configuration=configuration
    )
    kube = Kube(client.ApiClient(configuration))
    try:
        yield kube
    finally:
        await kube.close()


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    name = cluster.namespace("kube")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def config_map(ns: str, name: str, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns},
        "data": data,
    }


def test_a_missing_object_is_404_with_the_servers_words(cluster: Cluster, ns: str) -> None:
    path = CONFIG_MAPS.path(ns, "nowhere")

    async def call() -> KubeError:
        async with kube_of(cluster) as kube:
            with pytest.raises(KubeError) as caught:
                await kube.request("GET", path)
            return caught.value

    error = asyncio.run(call())
    assert (error.status, error.reason, error.verb, error.path) == (404, "Not Found", "GET", path)
    assert error.message == 'configmaps "nowhere" not found'
    assert error.api_message == '404 Not Found: configmaps "nowhere" not found'


def test_a_taken_name_is_409_and_create_says_false(cluster: Cluster, ns: str) -> None:
    body = config_map(ns, "voice", a="1")

    async def calls() -> tuple[bool, bool, KubeError]:
        async with kube_of(cluster) as kube:
            made = await kube.create(body)
            again = await kube.create({**body, "data": {"a": "2"}})
            with pytest.raises(KubeError) as caught:
                await kube.request("POST", CONFIG_MAPS.path(ns), body=body)
            return made, again, caught.value

    made, again, conflict = asyncio.run(calls())
    assert (made, again) == (True, False)
    assert (conflict.status, conflict.reason) == (409, "Conflict")
    assert conflict.message == 'configmaps "voice" already exists'
    # The first one stands: create-if-absent wrote nothing the second time.
    data = cluster.kubectl("get", "configmap", "voice", "-n", ns, "-o", "jsonpath={.data.a}")
    assert data.stdout == "1"


def test_an_invalid_object_is_422_and_create_raises_it(cluster: Cluster, ns: str) -> None:
    async def call() -> KubeError:
        async with kube_of(cluster) as kube:
            with pytest.raises(KubeError) as caught:
                await kube.create(config_map(ns, "Not_A_Name"))
            return caught.value

    error = asyncio.run(call())
    assert (error.status, error.reason, error.verb) == (422, "Unprocessable Entity", "POST")
    assert 'ConfigMap "Not_A_Name" is invalid' in error.message
    assert "metadata.name" in error.message


def test_delete_removes_only_the_uid_asked_for(cluster: Cluster, ns: str) -> None:
    async def calls() -> tuple[bool, bool, bool]:
        async with kube_of(cluster) as kube:
            await kube.create(config_map(ns, "voice"))
            live = await kube.request("GET", CONFIG_MAPS.path(ns, "voice"))
            uid = live["metadata"]["uid"]
            # A namesake's uid: the server refuses (409 on the precondition), nothing goes.
            other = await kube.delete(CONFIG_MAPS, ns, "voice", "0" * 8 + uid[8:])
            still = await kube.request("GET", CONFIG_MAPS.path(ns, "voice"))
            assert still["metadata"]["uid"] == uid
            deleted = await kube.delete(CONFIG_MAPS, ns, "voice", uid)
            gone = await kube.delete(CONFIG_MAPS, ns, "voice", uid)  # 404
            return other, deleted, gone

    assert asyncio.run(calls()) == (False, True, False)
    assert cluster.kubectl("get", "configmap", "voice", "-n", ns, check=False).returncode != 0


def test_merge_patch_is_false_when_gone_or_stale_and_raises_when_invalid(
    cluster: Cluster, ns: str
) -> None:
    async def calls() -> tuple[bool, bool, bool, KubeError]:
        async with kube_of(cluster) as kube:
            missing = await kube.merge_patch(CONFIG_MAPS, ns, "nowhere", {"data": {"a": "2"}})
            await kube.create(config_map(ns, "voice", a="1"))
            live = await kube.request("GET", CONFIG_MAPS.path(ns, "voice"))
            version = live["metadata"]["resourceVersion"]
            fresh = await kube.merge_patch(
                CONFIG_MAPS,
                ns,
                "voice",
                {"metadata": {"resourceVersion": version}, "data": {"a": "2"}},
            )
            # The same version again: the object changed meanwhile (by the patch above).
            stale = await kube.merge_patch(
                CONFIG_MAPS,
                ns,
                "voice",
                {"metadata": {"resourceVersion": version}, "data": {"a": "3"}},
            )
            with pytest.raises(KubeError) as caught:
                await kube.merge_patch(
                    CONFIG_MAPS, ns, "voice", {"metadata": {"labels": {"bad": "not a value!"}}}
                )
            return missing, fresh, stale, caught.value

    missing, fresh, stale, invalid = asyncio.run(calls())
    assert (missing, fresh, stale) == (False, True, False)
    assert invalid.status == 422 and invalid.verb == "PATCH"
    assert "metadata.labels" in invalid.message
    data = cluster.kubectl("get", "configmap", "voice", "-n", ns, "-o", "jsonpath={.data.a}")
    assert data.stdout == "2"


def test_a_watch_of_a_resource_that_does_not_exist_is_a_watch_error(
    cluster: Cluster, ns: str
) -> None:
    path = f"/api/v1/namespaces/{ns}/nothings"

    async def call() -> KubeError:
        async with kube_of(cluster) as kube:
            with pytest.raises(KubeError) as caught:
                async for _ in kube.watch_lines(path, {"watch": True}, 5):
                    pass
            return caught.value

    error = asyncio.run(call())
    assert (error.status, error.verb, error.path) == (404, "WATCH", path)


def test_post_event_writes_an_event_and_never_raises(cluster: Cluster, ns: str) -> None:
    regarding = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "voice", "namespace": ns, "uid": "u-1"},
    }

    async def calls() -> None:
        async with kube_of(cluster) as kube:
            await kube.post_event(regarding, "Normal", "Tested", "an event")
            # A namespace that does not exist: 404, logged, not raised.
            await kube.post_event(
                {**regarding, "metadata": {"name": "x", "namespace": "no-such-namespace"}},
                "Warning",
                "Lost",
                "never stored",
            )
            listed = await kube.request("GET", EVENTS.path(ns))
            [stored] = [e for e in listed["items"] if e["source"].get("component")]
            assert (stored["reason"], stored["message"], stored["type"]) == (
                "Tested",
                "an event",
                "Normal",
            )
            assert stored["involvedObject"]["name"] == "voice"
            assert stored["source"]["component"] == "cosyvoice-operator"
            assert stored["metadata"]["name"].startswith("voice.")

    asyncio.run(calls())


@pytest.fixture
def kubeconfig_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Where ``connect`` looks for the kubeconfig (outside a pod); the client's default
    configuration, which ``connect`` replaces, restored afterwards."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    saved = client.Configuration._default
    try:
        yield path
    finally:
        client.Configuration._default = saved


def test_connect_with_the_clusters_kubeconfig_and_with_a_token_it_refuses(
    cluster: Cluster, kubeconfig_env: Path
) -> None:
    good = yaml.safe_load(Path(cluster.kubeconfig).read_text())

    async def connect() -> dict[str, Any]:
        kube = await Kube.connect(attempts=1)
        try:
            version: dict[str, Any] = await kube.request("GET", "/version")
            return version
        finally:
            await kube.close()

    kubeconfig_env.write_text(yaml.safe_dump(good))
    assert asyncio.run(connect())["major"] == "1"

    # The same server and CA, a bearer token it never issued: 401, one clear line, no retry.
    bad = {**good, "users": [{"name": "admin", "user": {"token": "not-a-token"}}]}
    kubeconfig_env.write_text(yaml.safe_dump(bad))
    server = good["clusters"][0]["cluster"]["server"]
    with pytest.raises(ConnectError) as caught:
        asyncio.run(connect())
    message = str(caught.value)
    assert f"the API server at {server} refused the credentials" in message
    assert "401 Unauthorized" in message
