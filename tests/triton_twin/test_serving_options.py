"""The article's serving levers in the real ``tritonserver`` (CPU twin): the queue policy the
operator renders sheds what waits too long with Triton's documented error, a smaller first
chunk reaches the client sooner. (vLLM is refused until it can serve: issue 19, item 9.)

Each test prints what it measured (``pytest -s`` shows it); the README's lever table quotes
these numbers. They are CPU-twin numbers: they show the mechanism, not GPU latencies.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from cosyvoice_operator.api import spec
from cosyvoice_operator.devtools.closedloop import cpu_twin
from cosyvoice_operator.devtools.closedloop.cpu_twin import request_inputs
from cosyvoice_operator.render import triton

from .test_twin import (
    LOOKAHEAD,
    SAMPLES_PER_TOKEN,
    TOKEN_RATE,
    URIS,
    Twin,
    check_loaded_as_rendered,
    metric,
    speech_tokens,
    tone,
)

ENGINE_DIR = "/engines/" + "e" * 40
# Triton's words (core's scheduler), which the README and the CRD quote.
TIMEOUT_ERROR = "Request timeout expired"
QUEUE_FULL_ERROR = "Exceeds maximum queue size"


def service(variant: str, **sections: Any) -> spec.ServiceSpec:
    model = {"variant": variant, "uri": URIS[variant], **sections.pop("model", {})}
    return spec.parse({"model": model, **sections})


# An engine of 4 sequences: CosyVoice2's orchestrator then gets upstream's 4 instances of one
# GPU (one per LLM slot, never fewer than 4), few enough to overload on purpose.
SMALL_ENGINE = {"maxBatchSize": 4}
SMALL_BATCHES = {"preferredBatchSizes": [4]}


@contextmanager
def twin_of(
    svc: spec.ServiceSpec,
    work: Path,
    env: dict[str, str] | None = None,
    event_seconds: float = cpu_twin.EVENT_SECONDS,
) -> Iterator[Twin]:
    rendered = triton.render_repository(svc, ENGINE_DIR)
    repository = cpu_twin.write_repository(cpu_twin.to_cpu(rendered), work / "models")
    urls = triton.llm_urls(svc)
    with (
        cpu_twin.LlmStandIn(urls, event_seconds) as llm,
        cpu_twin.running(
            cpu_twin.TritonServer(repository, work, env={**llm.env, **(env or {})})
        ) as server,
    ):
        yield Twin(server, rendered, llm if urls else None)


def failures(text: str, model: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith("nv_inference_request_failure{") and f'model="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


# The gRPC metadata that makes Triton (>= 24.08) end a stream on its first error with the
# error's gRPC status code; without it a stream's error is a message with no status.
GRPC_STATUS_HEADERS = {"triton_grpc_error": "true"}


class Flow:
    """One streaming request on a gRPC stream of its own, running in the background: when
    its first audio came, when it ended, and how (``errors``, and each error's gRPC status
    in ``statuses``: None unless the stream was started with ``GRPC_STATUS_HEADERS``)."""

    def __init__(
        self,
        url: str,
        model: str,
        target: str,
        priority: int = 0,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.request_id = f"flow-{uuid.uuid4().hex[:8]}"
        self.first_audio = threading.Event()
        self.done = threading.Event()
        self.errors: list[str] = []
        self.statuses: list[str | None] = []
        self.seconds = 0.0  # from sending to the end
        self._client = grpcclient.InferenceServerClient(url)
        self._started = time.monotonic()
        self._client.start_stream(callback=self._on_response, headers=headers)
        self._client.async_stream_infer(
            model,
            request_inputs(target),
            request_id=self.request_id,
            priority=priority,
            enable_empty_final_response=True,
        )

    def _on_response(self, result: Any, error: Any) -> None:
        if error is not None:
            self.errors.append(str(error))
            self.statuses.append(error.status())
        else:
            audio = result.as_numpy("waveform")
            if audio is not None and audio.size:
                self.first_audio.set()
            if not result.get_response().parameters["triton_final_response"].bool_param:
                return
        self.seconds = time.monotonic() - self._started
        self.done.set()

    def close(self) -> None:
        with suppress(Exception):
            self._client.stop_stream(cancel_requests=not self.done.is_set())
        self._client.close()


@contextmanager
def flows() -> Iterator[Callable[..., Flow]]:
    """``start(url, model, target, priority=0)`` starts a :class:`Flow`; all are closed at
    the end."""
    started: list[Flow] = []

    def start(url: str, model: str, target: str, priority: int = 0) -> Flow:
        flow = Flow(url, model, target, priority)
        started.append(flow)
        return flow

    try:
        yield start
    finally:
        for flow in started:
            flow.close()


def wait_for(what: str, condition: Callable[[], bool], twin: Twin, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            lines = [
                line
                for line in twin.server.metrics().splitlines()
                if line.startswith("nv_inference_") and f'model="{MODEL}"' in line
            ]
            raise AssertionError(
                f"not within {timeout:.0f}s: {what}\n" + "\n".join(lines) + "\n"
                f"{twin.server.log_tail(30)}"
            )
        time.sleep(0.02)


# ---- queue policy --------------------------------------------------------------------------

# CosyVoice2 on one GPU: 4 orchestrator instances, each holding a stream for its whole
# synthesis. The stand-in keeps a stream in its instance, once its first audio is out, until
# the test creates the hold file (Pace in standins/cosyvoice2): the instances stay busy for
# as long as the test needs, however slow the machine.
INSTANCES = 4
MODEL = "cosyvoice2"


def occupy_every_instance(
    twin: Twin, start: Callable[..., Flow], label: str = "Overload", priority: int = 0
) -> list[Flow]:
    """One stream per orchestrator instance, each holding its instance (its first audio out).

    One after the other, each once the last is executing: sent together, several can wait in
    the queue at once before the scheduler hands them to the idle instances, and a queue
    limited to one request refuses the third (the flake this replaced)."""
    busy = []
    for i in range(INSTANCES):
        flow = start(twin.server.grpc, MODEL, f"{label} sentence {i}.", priority)
        wait_for(f"{flow.request_id}'s first audio", flow.first_audio.is_set, twin)
        assert not flow.errors, flow.errors
        busy.append(flow)
    return busy


def pending(twin: Twin) -> float:
    """Requests waiting in the orchestrator's queue, as Triton reports them."""
    return metric(twin.server.metrics(), "nv_inference_pending_request_count", MODEL) or 0.0


@pytest.mark.timeout(300)
def test_a_request_past_the_queue_timeout_gets_tritons_timeout_error(tmp_path: Path) -> None:
    svc = service(
        "cosyvoice2",
        engine=SMALL_ENGINE,
        serving={
            "queuePolicy": {"defaultTimeoutMicroseconds": 300_000, "timeoutAction": "Reject"},
            "dynamicBatching": SMALL_BATCHES,
        },
    )
    assert triton.orchestrator_instances(svc) == INSTANCES
    release = tmp_path / "release"
    with (
        twin_of(svc, tmp_path, {"COSYVOICE_TWIN_HOLD_FILE": str(release)}) as twin,
        flows() as start,
    ):
        check_loaded_as_rendered(twin)
        busy = occupy_every_instance(twin, start)
        late = [start(twin.server.grpc, MODEL, f"Late sentence {i}.") for i in range(2)]
        # Shed, not served late: both end while every instance is still held.
        for flow in late:
            wait_for(f"{flow.request_id} to end", flow.done.is_set, twin)
        release.touch()
        for flow in busy:
            wait_for(f"{flow.request_id} to end", flow.done.is_set, twin)
        print(
            "\n[twin] queue timeout 300 ms, 4 instances held, 2 more streams: shed after "
            f"{[round(f.seconds, 2) for f in late]} s: {late[0].errors}"
        )
        assert [f.errors for f in busy] == [[]] * INSTANCES
        for flow in late:
            assert len(flow.errors) == 1 and TIMEOUT_ERROR in flow.errors[0], flow.errors
            assert flow.seconds >= 0.3, flow.seconds  # not before the timeout
        wait_for(
            "2 failures in the metrics", lambda: failures(twin.server.metrics(), MODEL) >= 2, twin
        )
        assert failures(twin.server.metrics(), MODEL) == 2


@pytest.mark.timeout(300)
def test_a_full_queue_refuses_at_once_and_priorities_get_their_own_policy(
    tmp_path: Path,
) -> None:
    svc = service(
        "cosyvoice2",
        engine=SMALL_ENGINE,
        serving={
            "queuePolicy": {
                "maxQueueSize": 1,
                # Priority 1 (the highest) may queue deeper: the operator's per-level policy.
                "priorityPolicies": [{"priorityLevel": 1, "maxQueueSize": 8}],
            },
            "dynamicBatching": SMALL_BATCHES,
        },
    )
    assert triton.orchestrator_instances(svc) == INSTANCES
    release = tmp_path / "release"
    with (
        twin_of(svc, tmp_path, {"COSYVOICE_TWIN_HOLD_FILE": str(release)}) as twin,
        flows() as start,
    ):
        check_loaded_as_rendered(twin)
        busy = occupy_every_instance(twin, start)
        waiting = start(twin.server.grpc, MODEL, "Queued sentence.")
        wait_for("one request queued", lambda: pending(twin) == 1, twin)
        refused = start(twin.server.grpc, MODEL, "Refused sentence.")
        wait_for("the refusal", refused.done.is_set, twin)
        assert not waiting.done.is_set()  # still queued: the refusal did not wait for it
        print(
            f"\n[twin] max queue size 1, 4 instances held, 1 queued: the next refused after "
            f"{refused.seconds:.3f} s: {refused.errors}"
        )
        assert len(refused.errors) == 1 and QUEUE_FULL_ERROR in refused.errors[0]
        release.touch()
        for flow in [*busy, waiting]:
            wait_for(f"{flow.request_id} to end", flow.done.is_set, twin)
            assert not flow.errors, flow.errors

        # With the highest priority, the same overload queues instead of being refused.
        release.unlink()
        urgent = occupy_every_instance(twin, start, "Urgent", priority=1)
        urgent += [
            start(twin.server.grpc, MODEL, f"Urgent sentence {i}.", priority=1)
            for i in range(INSTANCES, INSTANCES + 2)
        ]
        wait_for("two urgent requests queued", lambda: pending(twin) == 2, twin)
        release.touch()
        for flow in urgent:
            wait_for(f"{flow.request_id} to end", flow.done.is_set, twin)
        assert [f.errors for f in urgent] == [[]] * (INSTANCES + 2)


# ---- stream chunking -----------------------------------------------------------------------

# The stand-in LLM's speed for this test: 3 speech tokens per event, one event every 60 ms
# (50 tokens/s, twice real time for 25 Hz speech tokens), so the first chunk waits for its
# tokens as it does on a GPU.
EVENT_SECONDS = 0.06
SAMPLES = 5


def expected_chunks(tokens: int, first: int, strategy: str) -> int:
    offset, hop, chunks = 0, first, 0
    while tokens - offset >= hop + LOOKAHEAD:
        offset += hop
        hop = first if strategy == "equal" else TOKEN_RATE * 2**chunks
        chunks += 1
    return chunks + 1


@dataclass
class Timed:
    """One stream: when each audio chunk arrived (seconds after sending) and what it held."""

    arrivals: list[float]
    chunks: list[Any]
    errors: list[str]


def timed_stream(url: str, model: str, target: str) -> Timed:
    timed = Timed([], [], [])
    done = threading.Event()
    start = time.monotonic()

    def callback(result: Any, error: Any) -> None:
        if error is not None:
            timed.errors.append(str(error))
            done.set()
            return
        audio = result.as_numpy("waveform")
        if audio is not None and audio.size:
            timed.arrivals.append(time.monotonic() - start)
            timed.chunks.append(audio.reshape(-1))
        if result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=callback)
        start = time.monotonic()
        client.async_stream_infer(
            model,
            request_inputs(target),
            request_id=f"chunk-{uuid.uuid4().hex[:8]}",
            enable_empty_final_response=True,
        )
        if not done.wait(60):
            timed.errors.append("no final response after 60s")
        client.stop_stream()
    finally:
        client.close()
    return timed


def first_audio_seconds(twin: Twin, first: int, strategy: str) -> list[float]:
    """Time to the first audio chunk of ``SAMPLES`` requests sent one after the other,
    each checked complete and in order against the rendered schedule."""
    model = triton.orchestrator(next(iter(twin.rendered)))
    times: list[float] = []
    # One more than measured: the first request of a fresh server warms its instances up.
    for i in range(SAMPLES + 1):
        target = f"Sample sentence number {i} for the first chunk."
        timed = timed_stream(twin.server.grpc, model, target)
        assert not timed.errors, f"{timed.errors}\n{twin.server.log_tail()}"
        tokens = speech_tokens("cosyvoice3", target)
        assert len(timed.chunks) == expected_chunks(tokens, first, strategy)
        assert timed.chunks[0].size == first * SAMPLES_PER_TOKEN  # the first chunk's tokens
        audio = np.concatenate(timed.chunks)
        assert audio.shape == (tokens * SAMPLES_PER_TOKEN,)
        np.testing.assert_allclose(audio, tone(audio.size), atol=1e-5)
        times.append(timed.arrivals[0])
    return times[1:]


@pytest.mark.timeout(400)
def test_a_smaller_first_chunk_arrives_earlier(tmp_path: Path) -> None:
    measured: dict[int, list[float]] = {}
    for first, strategy in ((15, "exponential"), (5, "equal")):
        svc = service(
            "cosyvoice3",
            serving={"streamChunking": {"firstChunkTokens": first, "hopGrowth": strategy}},
        )
        with twin_of(svc, tmp_path / f"first-{first}", event_seconds=EVENT_SECONDS) as twin:
            check_loaded_as_rendered(twin)
            measured[first] = first_audio_seconds(twin, first, strategy)
    upstream, small = statistics.median(measured[15]), statistics.median(measured[5])
    print(
        f"\n[twin] first audio, LLM at 50 tokens/s: firstChunkTokens 15 (upstream) median "
        f"{upstream * 1000:.0f} ms {[round(t * 1000) for t in measured[15]]}; "
        f"firstChunkTokens 5 median {small * 1000:.0f} ms {[round(t * 1000) for t in measured[5]]}"
    )
    # 18 tokens (6 events) against 8 (3 events) at 60 ms an event: ~180 ms apart. Medians
    # of 5: one sample stalled by a busy machine moves neither.
    assert small < upstream - 0.08, measured
