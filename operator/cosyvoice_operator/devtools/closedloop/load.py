"""The closed loop's load: streaming gRPC requests to the orchestrator at a concurrency (closed
loop) and/or a rate (open loop, Poisson arrivals); each request's first-chunk latency and
completion recorded.

Through the router (``through=``, issue 30): every request is one ``ModelStreamInfer`` stream
on ONE client channel to HAProxy, as a gateway or a client with one channel sends them; the
router picks the pod per stream. Without it (kept for the tests of Triton on its own): the
generator picks a Triton process per request itself, round-robin, which no Kubernetes Service
does for gRPC."""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import tritonclient.grpc as grpcclient

from cosyvoice_operator.devtools.closedloop.cpu_twin import request_inputs
from cosyvoice_operator.devtools.closedloop.router import open_stream, stream_request

DEFAULT_TEXT = "Hello from the closed loop."


@dataclass(frozen=True)
class RequestRecord:
    """One streaming request, seen from the client (times from ``time.monotonic()``)."""

    server: str
    started: float  # when it was due (open loop) or sent (closed loop)
    first_chunk_s: float | None  # to the first audio chunk
    total_s: float | None  # to the final response; None when it failed
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class LoadSummary:
    sent: int
    completed: int
    failed: int
    first_chunk_p50_s: float | None
    first_chunk_p95_s: float | None
    errors: tuple[str, ...]  # the distinct messages (at most 10)


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class LoadGenerator:
    """Streaming gRPC requests to ``model``: with ``through`` (the router's gRPC address),
    each a stream on one channel to it (``servers`` is not asked); else round-robin over
    ``servers()`` (gRPC addresses, asked again for every request, so that servers joining or
    leaving are followed).

    Two knobs, usable together: ``set_concurrency(n)`` keeps ``n`` requests in flight
    (closed loop: each worker sends its next request when the last one ends);
    ``set_rate(r)`` sends ``r`` requests per second with Poisson arrivals (open loop; an
    arrival finding ``max_outstanding`` requests in flight is recorded as dropped).
    ``stop()`` sets both to 0 and waits for the requests in flight.
    """

    def __init__(
        self,
        servers: Callable[[], Sequence[str]],
        model: str,
        *,
        text: str = DEFAULT_TEXT,
        timeout: float = 60.0,
        max_outstanding: int = 64,
        seed: int = 0,
        through: str | None = None,
    ) -> None:
        self.servers = servers
        self.through = through
        # One HTTP/2 connection for every stream of this generator.
        self._channel = grpc.insecure_channel(through) if through else None
        self.model = model
        self.text = text
        self.timeout = timeout
        self.max_outstanding = max_outstanding
        self._random = random.Random(seed)
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []
        self._concurrency = 0
        self._workers: dict[int, threading.Thread] = {}
        self._rate = 0.0
        self._rate_changed = threading.Event()
        self._dispatcher: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_outstanding, thread_name_prefix="load")
        self._outstanding = 0
        self._closed = False
        self._local = threading.local()

    # -- knobs --

    def set_concurrency(self, n: int) -> None:
        with self._lock:
            self._concurrency = n
            for i in range(n):
                worker = self._workers.get(i)
                if worker is None or not worker.is_alive():
                    worker = threading.Thread(target=self._work, args=(i,), daemon=True)
                    self._workers[i] = worker
                    worker.start()

    def set_rate(self, per_second: float) -> None:
        with self._lock:
            self._rate = per_second
            if per_second > 0 and (self._dispatcher is None or not self._dispatcher.is_alive()):
                self._dispatcher = threading.Thread(target=self._dispatch, daemon=True)
                self._dispatcher.start()
        self._rate_changed.set()

    def stop(self, wait: float = 120.0) -> None:
        """No new requests; waits (up to ``wait`` s) for those in flight."""
        self.set_concurrency(0)
        self.set_rate(0)
        deadline = time.monotonic() + wait
        with self._lock:
            threads = [*self._workers.values(), self._dispatcher]
        for thread in threads:
            if thread is not None:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        while self.outstanding and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self.stop()
        self._closed = True
        self._pool.shutdown(wait=True)
        if self._channel is not None:
            self._channel.close()

    def __enter__(self) -> LoadGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def outstanding(self) -> int:
        """Open-loop requests in flight."""
        with self._lock:
            return self._outstanding

    # -- what happened --

    def records(self, since: float | None = None) -> list[RequestRecord]:
        with self._lock:
            return [r for r in self._records if since is None or r.started >= since]

    def summary(self, since: float | None = None) -> LoadSummary:
        records = self.records(since)
        done = [r for r in records if r.ok]
        firsts = [r.first_chunk_s for r in done if r.first_chunk_s is not None]
        return LoadSummary(
            sent=len(records),
            completed=len(done),
            failed=len(records) - len(done),
            first_chunk_p50_s=_quantile(firsts, 0.5),
            first_chunk_p95_s=_quantile(firsts, 0.95),
            errors=tuple(sorted({r.error for r in records if r.error}))[:10],
        )

    def per_server(self, since: float | None = None) -> dict[str, int]:
        """Completed requests per server address."""
        counts: dict[str, int] = {}
        for record in self.records(since):
            if record.ok:
                counts[record.server] = counts.get(record.server, 0) + 1
        return counts

    # -- the machinery --

    def _work(self, index: int) -> None:
        while True:
            with self._lock:
                if index >= self._concurrency:
                    return
            record = self._one(time.monotonic())
            if record.error and (not record.server or self.through):
                time.sleep(0.2)  # no server at all, or the router refused at once: no spin

    def _dispatch(self) -> None:
        due = time.monotonic()
        while True:
            with self._lock:
                rate = self._rate
            if rate <= 0:
                return
            due += self._random.expovariate(rate)
            self._rate_changed.clear()
            if self._rate_changed.wait(max(0.0, due - time.monotonic())):
                due = time.monotonic()  # a new rate applies from now
                continue
            with self._lock:
                full = self._outstanding >= self.max_outstanding
                if not full:
                    self._outstanding += 1
            if full:
                self._record(
                    RequestRecord("", due, None, None, f"dropped: {self.max_outstanding} in flight")
                )
                continue
            self._pool.submit(self._open_loop_one, due)

    def _open_loop_one(self, due: float) -> None:
        try:
            self._one(due)
        finally:
            with self._lock:
                self._outstanding -= 1

    def _record(self, record: RequestRecord) -> RequestRecord:
        with self._lock:
            self._records.append(record)
        return record

    def _client(self, url: str) -> Any:
        clients: dict[str, Any] = self._local.__dict__.setdefault("clients", {})
        if url not in clients:
            clients[url] = grpcclient.InferenceServerClient(url)
        return clients[url]

    def _drop_client(self, url: str) -> None:
        clients: dict[str, Any] = self._local.__dict__.get("clients", {})
        client = clients.pop(url, None)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def _through_router(self, started: float) -> RequestRecord:
        """One stream on the generator's channel to the router."""
        assert self._channel is not None and self.through is not None
        first: float | None = None
        errors: list[str] = []
        final: float | None = None
        request = stream_request(self.model, request_inputs(self.text), uuid.uuid4().hex)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        call = open_stream(self._channel, request, timeout=self.timeout)
        try:
            for message in call:
                if message.error_message:
                    errors.append(message.error_message)
                    break
                response = message.infer_response
                names = [output.name for output in response.outputs]
                audio = (
                    "waveform" in names and response.raw_output_contents[names.index("waveform")]
                )
                if first is None and audio:
                    first = time.monotonic()
                # After the final response the server ends the stream (the request side is
                # closed): read on to that end, as a client does, rather than reset it.
                if final is None and response.parameters["triton_final_response"].bool_param:
                    final = time.monotonic()
        except grpc.RpcError as err:
            errors.append(f"{err.code().name}: {err.details()}")
        finally:
            call.cancel()  # no-op after the stream's end; else it is given up
        if not errors and final is None:
            errors.append("the stream ended without a final response")
        if not errors and first is None:
            errors.append("no audio before the final response")
        return self._record(
            RequestRecord(
                server=self.through,
                started=started,
                first_chunk_s=first - started if first is not None else None,
                total_s=None if errors or final is None else final - started,
                error="; ".join(errors)[:300],
            )
        )

    def _one(self, started: float) -> RequestRecord:
        if self.through is not None:
            return self._through_router(started)
        urls = list(self.servers())
        if not urls:
            return self._record(RequestRecord("", started, None, None, "no live server"))
        url = urls[next(self._turn) % len(urls)]
        first: list[float] = []
        errors: list[str] = []
        final = threading.Event()

        def on_response(result: Any, error: Any) -> None:
            if error is not None:
                errors.append(str(error))
                final.set()
                return
            audio = result.as_numpy("waveform")
            if audio is not None and audio.size and not first:
                first.append(time.monotonic())
            if result.get_response().parameters["triton_final_response"].bool_param:
                final.set()

        client = self._client(url)
        try:
            client.start_stream(callback=on_response)
            client.async_stream_infer(
                self.model,
                request_inputs(self.text),
                request_id=uuid.uuid4().hex,
                enable_empty_final_response=True,
            )
            if not final.wait(self.timeout):
                errors.append(f"no final response after {self.timeout:.0f}s")
        except Exception as err:  # a server that went away, mostly
            errors.append(str(err))
        finally:
            with contextlib.suppress(Exception):
                # Without an answer, do not wait for one that may never come.
                client.stop_stream(cancel_requests=bool(errors))
        end = time.monotonic()
        if errors:
            self._drop_client(url)
        if not errors and not first:
            errors.append("no audio before the final response")
        return self._record(
            RequestRecord(
                server=url,
                started=started,
                first_chunk_s=first[0] - started if first else None,
                total_s=None if errors else end - started,
                error="; ".join(errors)[:300],
            )
        )
