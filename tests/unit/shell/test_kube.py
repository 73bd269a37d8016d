"""``shell/kube.py``'s mapping of answers to results and errors, through the real ``Kube``,
the real ``kubernetes.aio`` client and aiohttp, against an in-process HTTP server.

The server here stands in for what a real API server does not do on demand: answer 5xx,
answer a body that is not JSON or has no ``message``, split a watch stream's lines across
chunks, drop a connection mid-stream, refuse credentials (401/403) on ``/version``, or be
down. What a real API server does on demand (404, 409 on a name or a uid precondition, 422,
a watch of a missing resource, a token it refuses) is checked against one in
``tests/cluster/test_kube.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from kubernetes.aio import client
from kubernetes.aio.config import kube_config

from cosyvoice_operator.shell.kube import CONFIG_MAPS, ConnectError, Kube, KubeError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
NS = "voices"


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    """A ``Status`` as the API server writes it for a refused request."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    """An HTTP server on a free loopback port answering every request with ``handler``;
    its base URL."""

    async def route(request: web.Request) -> web.StreamResponse:
        return await handler(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", route)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def kube_at(url: str) -> Kube:
    return Kube(client.ApiClient(client.Configuration(host=url)))


@contextlib.asynccontextmanager
async def api(handler: Handler) -> AsyncIterator[Kube]:
    async with serving(handler) as url:
        kube = kube_at(url)
        try:
            yield kube
        finally:
            await kube.close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def answer(status: int, body: bytes | str | dict[str, Any]) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        if isinstance(body, dict):
            return web.json_response(body, status=status)
        text = body.encode() if isinstance(body, str) else body
        return web.Response(status=status, body=text, content_type="text/plain")

    return handler


# ---- request: status -> KubeError ------------------------------------------------------------

PATH = CONFIG_MAPS.path(NS, "voice")


@pytest.mark.parametrize(
    ("status", "body", "reason", "message"),
    [
        (
            404,
            status_body(404, "NotFound", 'configmaps "voice" not found'),
            "Not Found",
            'configmaps "voice" not found',
        ),
        (
            409,
            status_body(409, "AlreadyExists", 'configmaps "voice" already exists'),
            "Conflict",
            'configmaps "voice" already exists',
        ),
        (
            422,
            status_body(422, "Invalid", 'ConfigMap "Voice" is invalid: metadata.name: ...'),
            "Unprocessable Entity",
            'ConfigMap "Voice" is invalid: metadata.name: ...',
        ),
        # Not JSON (a proxy's page, etcd's words): the body itself, as text.
        (
            503,
            "etcdserver: request timed out",
            "Service Unavailable",
            "etcdserver: request timed out",
        ),
        # JSON without a message: the whole body.
        (500, {"kind": "Status", "code": 500}, "Internal Server Error", '{"kind": "Status"'),
        # No body at all.
        (429, b"", "Too Many Requests", ""),
    ],
)
def test_a_refusal_is_a_kube_error_with_the_status_reason_and_the_servers_message(
    status: int, body: str | bytes | dict[str, Any], reason: str, message: str
) -> None:
    async def call() -> KubeError:
        async with api(answer(status, body)) as kube:
            with pytest.raises(KubeError) as caught:
                await kube.request("GET", PATH)
            return caught.value

    error = asyncio.run(call())
    assert (error.status, error.reason, error.verb, error.path) == (status, reason, "GET", PATH)
    assert error.message.startswith(message)
    assert error.api_message == f"{status} {reason}: {error.message}".rstrip(": ")
    assert str(error) == f"GET {PATH}: {status} {reason}: {error.message}".rstrip(": ")


def test_a_long_non_json_body_is_cut_to_500_characters() -> None:
    async def call() -> KubeError:
        async with api(answer(502, "x" * 2000)) as kube:
            with pytest.raises(KubeError) as caught:
                await kube.request("GET", PATH)
            return caught.value

    assert asyncio.run(call()).message == "x" * 500


def test_an_answer_is_its_json_and_an_empty_answer_is_none() -> None:
    bodies = iter([b'{"kind": "ConfigMap", "data": {"a": "1"}}', b""])

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=200, body=next(bodies), content_type="application/json")

    async def calls() -> list[Any]:
        async with api(handler) as kube:
            return [await kube.request("GET", PATH), await kube.request("DELETE", PATH)]

    assert asyncio.run(calls()) == [{"kind": "ConfigMap", "data": {"a": "1"}}, None]


# ---- no answer: status 0 ---------------------------------------------------------------------


def test_a_server_that_is_not_there_is_status_0() -> None:
    async def call() -> KubeError:
        kube = kube_at(f"http://127.0.0.1:{closed_port()}")
        try:
            with pytest.raises(KubeError) as caught:
                await kube.request("GET", PATH)
            return caught.value
        finally:
            await kube.close()

    error = asyncio.run(call())
    assert error.status == 0 and error.verb == "GET" and error.path == PATH
    assert error.reason == "ClientConnectorError", error
    assert "127.0.0.1" in error.message


def test_an_answer_that_does_not_come_in_time_is_status_0() -> None:
    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(1)
        return web.json_response({})

    async def call() -> KubeError:
        async with api(slow) as kube:
            with pytest.raises(KubeError) as caught:
                await kube.request("GET", PATH, limit=0.3)
            return caught.value

    error = asyncio.run(call())
    assert error.status == 0 and "Timeout" in error.reason, error


def test_a_connection_dropped_mid_answer_is_status_0() -> None:
    async def dropped(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.content_length = 1000
        response.content_type = "application/json"
        await response.prepare(request)
        await response.write(b'{"kind": "ConfigMap", "da')
        assert request.transport is not None
        request.transport.close()
        return response

    async def call() -> KubeError:
        async with api(dropped) as kube:
            with pytest.raises(KubeError) as caught:
                await kube.request("GET", PATH)
            return caught.value

    error = asyncio.run(call())
    assert error.status == 0 and error.reason == "ClientPayloadError", error


# ---- the writes: which refusals are results --------------------------------------------------


class Recorder:
    """A handler answering statuses in turn, recording each request (method, path, headers,
    JSON body)."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.seen: list[tuple[str, str, str, Any]] = []

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.seen.append(
            (request.method, request.path_qs, request.content_type, json.loads(raw or b"null"))
        )
        status = self.statuses.pop(0)
        if status >= 400:
            reason = {404: "NotFound", 409: "Conflict", 422: "Invalid"}.get(status, "")
            return web.json_response(
                status_body(status, reason, f"answered {status}"), status=status
            )
        return web.json_response({"kind": "Status", "status": "Success"}, status=status)


CONFIG_MAP = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "voice", "namespace": NS},
    "data": {"a": "1"},
}


def test_create_is_false_for_a_name_taken_and_raises_for_other_refusals() -> None:
    recorder = Recorder(201, 409, 422)

    async def calls() -> tuple[bool, bool, KubeError]:
        async with api(recorder) as kube:
            made, taken = await kube.create(CONFIG_MAP), await kube.create(CONFIG_MAP)
            with pytest.raises(KubeError) as caught:
                await kube.create(CONFIG_MAP)
            return made, taken, caught.value

    made, taken, invalid = asyncio.run(calls())
    assert (made, taken, invalid.status) == (True, False, 422)
    assert {(m, p) for m, p, _, _ in recorder.seen} == {("POST", CONFIG_MAPS.path(NS))}
    assert all(body == CONFIG_MAP for _, _, _, body in recorder.seen)


def test_delete_is_by_uid_and_false_when_gone_or_replaced() -> None:
    recorder = Recorder(200, 404, 409, 500)

    async def calls() -> tuple[list[bool], KubeError]:
        async with api(recorder) as kube:
            results = [await kube.delete(CONFIG_MAPS, NS, "voice", "uid-1") for _ in range(3)]
            with pytest.raises(KubeError) as caught:
                await kube.delete(CONFIG_MAPS, NS, "voice", "uid-1")
            return results, caught.value

    results, failed = asyncio.run(calls())
    assert results == [True, False, False] and failed.status == 500
    method, path, _, body = recorder.seen[0]
    assert (method, path) == ("DELETE", PATH)
    assert body["preconditions"] == {"uid": "uid-1"}
    assert body["propagationPolicy"] == "Background"


def test_merge_patch_is_false_when_gone_or_changed_meanwhile_and_raises_otherwise() -> None:
    recorder = Recorder(200, 404, 409, 422)
    patch = {"metadata": {"resourceVersion": "41"}, "data": {"a": "2"}}

    async def calls() -> tuple[list[bool], KubeError]:
        async with api(recorder) as kube:
            results = [
                await kube.merge_patch(CONFIG_MAPS, NS, "voice", patch, subresource="status")
                for _ in range(3)
            ]
            with pytest.raises(KubeError) as caught:
                await kube.merge_patch(CONFIG_MAPS, NS, "voice", patch)
            return results, caught.value

    results, invalid = asyncio.run(calls())
    assert results == [True, False, False] and invalid.status == 422
    method, path, content_type, body = recorder.seen[0]
    assert (method, path, content_type) == (
        "PATCH",
        PATH + "/status",
        "application/merge-patch+json",
    )
    assert body == patch
    assert recorder.seen[-1][1] == PATH


def test_apply_is_a_forced_server_side_apply_under_the_operators_field_manager() -> None:
    recorder = Recorder(200)

    async def call() -> None:
        async with api(recorder) as kube:
            await kube.apply(CONFIG_MAP)

    asyncio.run(call())
    [(method, path, content_type, body)] = recorder.seen
    assert method == "PATCH" and content_type == "application/apply-patch+yaml"
    assert path == f"{PATH}?fieldManager=cosyvoice-operator&force=true"
    assert body == CONFIG_MAP


# ---- watch_lines -----------------------------------------------------------------------------


def event(kind: str, name: str, version: int) -> dict[str, Any]:
    meta = {"name": name, "namespace": NS, "resourceVersion": str(version)}
    return {"type": kind, "object": {"kind": "ConfigMap", "metadata": meta}}


def streaming(chunks: list[bytes], then_drop: bool = False) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.content_type = "application/json"
        response.enable_chunked_encoding()
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk)
            await asyncio.sleep(0.01)  # separate reads on the client's side
        if then_drop:
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write_eof()
        return response

    return handler


def test_watch_lines_joins_lines_split_across_chunks_and_skips_blank_ones() -> None:
    events = [event("ADDED", "a", 10), event("MODIFIED", "a", 11), event("DELETED", "b", 12)]
    lines = [json.dumps(e).encode() + b"\n" for e in events]
    text = lines[0] + lines[1] + b"\n" + lines[2]  # a blank line before the third event
    # Cut inside the first event and inside the third: the second chunk ends one event,
    # holds the second whole, the blank line and the start of the third.
    first_cut = len(lines[0]) // 2
    second_cut = len(text) - len(lines[2]) // 2
    chunks = [text[:first_cut], text[first_cut:second_cut], text[second_cut:]]

    async def call() -> list[dict[str, Any]]:
        async with api(streaming(chunks)) as kube:
            query = {"watch": True, "resourceVersion": "9"}
            return [e async for e in kube.watch_lines(CONFIG_MAPS.path(NS), query, 5)]

    assert asyncio.run(call()) == events


def test_watch_lines_raises_the_http_refusal_as_a_watch_error() -> None:
    body = status_body(403, "Forbidden", 'configmaps is forbidden: User "x" cannot watch')

    async def call() -> KubeError:
        async with api(answer(403, body)) as kube:
            with pytest.raises(KubeError) as caught:
                async for _ in kube.watch_lines(CONFIG_MAPS.path(NS), {"watch": True}, 5):
                    pass
            return caught.value

    error = asyncio.run(call())
    assert (error.status, error.reason, error.verb) == (403, "Forbidden", "WATCH")
    assert error.message == body["message"]


def test_a_watch_dropped_mid_stream_is_status_0_after_the_events_that_came() -> None:
    first = json.dumps(event("ADDED", "a", 10)).encode() + b"\n"
    seen: list[dict[str, Any]] = []

    async def call() -> KubeError:
        async with api(streaming([first, b'{"type": "MOD'], then_drop=True)) as kube:
            with pytest.raises(KubeError) as caught:
                async for e in kube.watch_lines(CONFIG_MAPS.path(NS), {"watch": True}, 5):
                    seen.append(e)
            return caught.value

    error = asyncio.run(call())
    assert seen == [event("ADDED", "a", 10)]
    assert error.status == 0 and error.verb == "WATCH", error


# ---- post_event ------------------------------------------------------------------------------

SERVICE = {
    "apiVersion": "tts.cosyvoice.dev/v1alpha1",
    "kind": "CosyVoiceService",
    "metadata": {"name": "tts", "namespace": NS, "uid": "u-1"},
}


def test_post_event_writes_a_core_event_about_the_object() -> None:
    recorder = Recorder(201)

    async def call() -> None:
        async with api(recorder) as kube:
            await kube.post_event(SERVICE, "Warning", "EngineBuildFailed", "m" * 2000)

    asyncio.run(call())
    [(method, path, _, body)] = recorder.seen
    assert (method, path) == ("POST", f"/api/v1/namespaces/{NS}/events")
    assert body["involvedObject"] == {
        "apiVersion": SERVICE["apiVersion"],
        "kind": "CosyVoiceService",
        "name": "tts",
        "namespace": NS,
        "uid": "u-1",
    }
    assert (body["type"], body["reason"], body["message"]) == (
        "Warning",
        "EngineBuildFailed",
        "m" * 1024,
    )
    assert body["metadata"] == {"generateName": "tts.", "namespace": NS}


@pytest.mark.parametrize("status", [403, 404, 500])
def test_post_event_never_raises_for_a_refusal(status: int) -> None:
    recorder = Recorder(status)

    async def call() -> None:
        async with api(recorder) as kube:
            await kube.post_event(SERVICE, "Normal", "Scaled", "up")

    asyncio.run(call())
    assert len(recorder.seen) == 1


def test_post_event_never_raises_without_a_server() -> None:
    async def call() -> None:
        kube = kube_at(f"http://127.0.0.1:{closed_port()}")
        try:
            await kube.post_event(SERVICE, "Normal", "Scaled", "up")
        finally:
            await kube.close()

    asyncio.run(call())


# ---- connect ---------------------------------------------------------------------------------


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Points ``KUBECONFIG`` at a kubeconfig for a server URL (with a token); outside a pod, so
    that ``connect`` takes the kubeconfig path. Restores the client's default configuration,
    which loading a kubeconfig replaces."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    path = tmp_path / "kubeconfig"
    monkeypatch.setenv("KUBECONFIG", str(path))
    # The client reads KUBECONFIG once, when it is imported.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))

    def point_at(url: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": url}}],
            "users": [{"name": "u", "user": {"token": "not-a-token"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
        path.write_text(yaml.safe_dump(config))

    saved = client.Configuration._default
    try:
        yield point_at
    finally:
        client.Configuration._default = saved


@pytest.mark.parametrize("status", [401, 403])
def test_connect_refused_credentials_is_one_connect_error_without_retrying(
    status: int, kubeconfig: Callable[[str], None]
) -> None:
    recorder = Recorder(status)

    async def call() -> str:
        async with serving(recorder) as url:
            kubeconfig(url)
            with pytest.raises(ConnectError) as caught:
                await Kube.connect(attempts=3, delay=0.01)
            return str(caught.value)

    message = asyncio.run(call())
    assert "refused the credentials" in message and f"{status} " in message, message
    assert [(m, p) for m, p, _, _ in recorder.seen] == [("GET", "/version")]


def test_connect_retries_an_api_server_that_is_not_ready_yet(
    kubeconfig: Callable[[str], None],
) -> None:
    recorder = Recorder(503, 503, 200)

    async def call() -> None:
        async with serving(recorder) as url:
            kubeconfig(url)
            kube = await Kube.connect(attempts=3, delay=0.01)
            await kube.close()

    asyncio.run(call())
    assert len(recorder.seen) == 3


def test_connect_to_nothing_says_where_it_looked_after_its_attempts(
    kubeconfig: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    kubeconfig(url)
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)  # connect's waits between tries

    async def call() -> str:
        with pytest.raises(ConnectError) as caught:
            await Kube.connect(attempts=3, delay=2.0)
        return str(caught.value)

    message = asyncio.run(call())
    assert url in message and "did not answer after 3 tries" in message, message
    assert waits == [2.0, 4.0]  # delay x attempt, none after the last


def test_connect_without_a_readable_kubeconfig_is_one_clear_line(
    kubeconfig: Callable[[str], None], tmp_path: Path
) -> None:
    # No file at KUBECONFIG: said as such (issue 23: it blamed a missing current-context).
    with pytest.raises(ConnectError) as caught:
        asyncio.run(Kube.connect(attempts=1))
    message = str(caught.value)
    assert f"KUBECONFIG names {tmp_path / 'kubeconfig'}, and no such file exists" in message
    assert "current-context" not in message
    # A file that is not a kubeconfig: the loader's words.
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(ConnectError, match=r"cannot load the kubeconfig .*kubeconfig"):
        asyncio.run(Kube.connect(attempts=1))
