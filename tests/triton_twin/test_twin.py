"""The operator's model repository, loaded and streamed through in a real Triton on a CPU.

For each variant: the repository the operator renders for a default service, turned into its
CPU twin by ``cpu_twin.to_cpu`` (instance kinds only; CosyVoice2's LLM backend), laid out with
the Python stand-ins and served by the ``tritonserver`` of the ``nvidia-pytriton`` wheel.
Real gRPC streams go through the orchestrator, which calls the other models through BLS (and,
for CosyVoice3, a stand-in trtllm-serve over HTTP); every stream must arrive complete and in
order, and ``/metrics`` must expose the orchestrator's queue metrics the autoscaler reads.
"""

from __future__ import annotations

import concurrent.futures
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from cosyvoice_operator.api import spec
from cosyvoice_operator.devtools.closedloop import cpu_twin
from cosyvoice_operator.devtools.closedloop.cpu_twin import REFERENCE_TEXT, request_inputs
from cosyvoice_operator.render import triton

SAMPLE_RATE = 24000
SAMPLES_PER_TOKEN = SAMPLE_RATE // 25
TONE_HZ = 440.0
FIRST_HOP, LOOKAHEAD, TOKEN_RATE = 15, 3, 25
STREAMS = 6  # concurrent streams, each holding an orchestrator instance while it lasts
REQUESTS_PER_STREAM = 2
ENGINE_DIR = "/engines/0123456789abcdef0123456789abcdef01234567"
URIS = {
    "cosyvoice2": "hf://FunAudioLLM/CosyVoice2-0.5B",
    "cosyvoice3": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
}


def service(variant: str, streaming: bool = True, gpus: int = 1) -> spec.ServiceSpec:
    """A default service of the variant (one GPU, streaming), or with the one change given."""
    serving = {"streaming": streaming, "gpusPerReplica": gpus}
    return spec.parse({"model": {"variant": variant, "uri": URIS[variant]}, "serving": serving})


def parse(text: str) -> Any:
    return text_format.Parse(text, mc.ModelConfig())


# ---- the transform -----------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["cosyvoice2", "cosyvoice3"])
@pytest.mark.parametrize("gpus", [1, 4])
def test_to_cpu_changes_only_instance_kinds_and_the_llm_backend(variant: str, gpus: int) -> None:
    svc = spec.parse(
        {
            "model": {"variant": variant, "uri": URIS[variant]},
            "serving": {"gpusPerReplica": gpus, "instancesPerGpu": 2},
            "engine": {"tensorParallelSize": min(gpus, 2)},
        }
    )
    rendered = triton.render_repository(svc, ENGINE_DIR)
    twin = cpu_twin.to_cpu(rendered)
    assert list(twin) == list(rendered)
    for name in rendered:
        before, after = parse(rendered[name]), parse(twin[name])
        assert all(
            g.kind == mc.ModelInstanceGroup.KIND_CPU and not g.gpus for g in after.instance_group
        )
        assert [g.count for g in after.instance_group] == [g.count for g in before.instance_group]
        assert after.backend == ("python" if before.backend == "tensorrtllm" else before.backend)
        # Everything else is identical.
        for config in (before, after):
            for group in config.instance_group:
                group.kind = mc.ModelInstanceGroup.KIND_CPU
                del group.gpus[:]
            config.backend = "python"
        assert before == after, name


# ---- the twin in tritonserver --------------------------------------------------------------


def tone(count: int) -> Any:
    n = np.arange(count, dtype=np.float64)
    return np.sin(2.0 * np.pi * TONE_HZ * n / SAMPLE_RATE).astype(np.float32)


def speech_tokens(variant: str, target: str) -> int:
    """The stand-in LLMs' rule: 3 tokens per text token of reference + target, 20..750."""
    text = REFERENCE_TEXT + target
    # CosyVoice2's orchestrator stand-in counts UTF-8 bytes; trtllm-serve's counts characters.
    size = len(text.encode()) if variant == "cosyvoice2" else len(text)
    return min(750, max(20, 3 * size))


def expected_chunks(tokens: int) -> int:
    """Upstream's schedule: 15 + 3 tokens, then hops of 25 x 2^k, then the rest."""
    offset, hop, chunks = 0, FIRST_HOP, 0
    while tokens - offset >= hop + LOOKAHEAD:
        offset += hop
        hop = TOKEN_RATE * 2**chunks
        chunks += 1
    return chunks + 1


@dataclass
class Stream:
    """What one gRPC stream received, per request id."""

    chunks: dict[str, list[Any]] = field(default_factory=dict)
    final: dict[str, threading.Event] = field(default_factory=dict)
    after_final: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def on_response(self, result: Any, error: Any) -> None:
        if error is not None:
            self.errors.append(str(error))
            for event in self.final.values():
                event.set()
            return
        response = result.get_response()
        if self.final[response.id].is_set():
            self.after_final.append(response.id)
        audio = result.as_numpy("waveform")
        if audio is not None and audio.size:
            self.chunks[response.id].append(audio.reshape(-1))
        if response.parameters["triton_final_response"].bool_param:
            self.final[response.id].set()


def run_stream(url: str, model: str, targets: dict[str, str], timeout: float = 60.0) -> Stream:
    """Send every request on one gRPC stream at once; wait for each one's final response."""
    stream = Stream()
    for request_id in targets:
        stream.chunks[request_id] = []
        stream.final[request_id] = threading.Event()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=stream.on_response)
        for request_id, target in targets.items():
            client.async_stream_infer(
                model,
                request_inputs(target),
                request_id=request_id,
                enable_empty_final_response=True,
            )
        deadline = time.monotonic() + timeout
        for request_id, event in stream.final.items():
            if not event.wait(max(0.0, deadline - time.monotonic())):
                stream.errors.append(f"{request_id}: no final response after {timeout:.0f}s")
        client.stop_stream()
    finally:
        client.close()
    return stream


def metric(text: str, name: str, model: str) -> float | None:
    pattern = re.compile(rf'^{name}\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$', re.M)
    values = [float(v) for v in pattern.findall(text)]
    return sum(values) if values else None


@dataclass
class Twin:
    server: cpu_twin.TritonServer
    rendered: dict[str, str]
    llm: cpu_twin.LlmStandIn | None


@pytest.fixture
def twin(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Twin]:
    variant, streaming, gpus = request.param
    svc = service(variant, streaming, gpus)
    rendered = triton.render_repository(svc, ENGINE_DIR)
    repository = cpu_twin.write_repository(cpu_twin.to_cpu(rendered), tmp_path / "models")
    with (
        cpu_twin.LlmStandIn(triton.llm_urls(svc)) as llm,
        cpu_twin.running(cpu_twin.TritonServer(repository, tmp_path, env=llm.env)) as server,
    ):
        yield Twin(server, rendered, llm if triton.llm_urls(svc) else None)


def check_loaded_as_rendered(twin: Twin) -> None:
    """Triton loaded every model the operator rendered, and added to each config what it adds.

    What carries information here is ``model_ready``: Triton parsed and validated the file
    (a config it rejects, as one with a preferred batch size above ``max_batch_size`` or a
    priority level out of range, leaves the model unloaded) and the backend initialised every
    instance. The rest of ``/v2/models/<m>/config`` is Triton's echo of the file: under
    ``--disable-auto-complete-config`` it returns the file's own fields as written (checked
    on the wheel's Triton 2.51 for both variants and a queue-policy service: parameters,
    inputs, outputs, ``dynamic_batching``, instance kinds and counts, the decoupled policy all
    came back unchanged), so comparing them with the rendered file would compare the file with
    itself, and this does not. What Triton fills in is checked: each instance group named
    ``<model>_<i>`` (``cosyvoice-serve``'s stub check and the orchestrators'
    ``cosyvoice_active_streams`` label know an instance by the name Triton derives from it,
    ``<model>_<i>_<j>``), the backend's ``model.py`` as the file it loads, and the latest
    version alone served."""
    for name, text in twin.rendered.items():
        assert twin.server.model_ready(name), f"{name} not ready:\n{twin.server.log_tail()}"
        rendered = parse(text)
        loaded = json_format.ParseDict(
            twin.server.model_config(name), mc.ModelConfig(), ignore_unknown_fields=True
        )
        assert [g.name for g in loaded.instance_group] == [
            g.name or f"{name}_{i}" for i, g in enumerate(rendered.instance_group)
        ], name
        assert loaded.default_model_filename == "model.py", name
        assert loaded.version_policy.latest.num_versions == 1, name


def stream_through(twin: Twin, streams: int, per_stream: int) -> int:
    """``streams`` concurrent gRPC streams of ``per_stream`` requests each, all checked."""
    variant = next(iter(twin.rendered))
    model = triton.orchestrator(variant)
    run = uuid.uuid4().hex[:8]
    plans = [
        {
            f"{variant}-{run}-s{s}-r{r}": f"Stream {s} says sentence number {r}{'!' * (3 * s + r)}"
            for r in range(per_stream)
        }
        for s in range(streams)
    ]
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        received = list(
            pool.map(lambda targets: run_stream(twin.server.grpc, model, targets), plans)
        )
    for targets, stream in zip(plans, received, strict=True):
        assert not stream.errors, f"{stream.errors}\n{twin.server.log_tail()}"
        assert not stream.after_final, f"responses after the final one: {stream.after_final}"
        for request_id, target in targets.items():
            chunks = stream.chunks[request_id]
            tokens = speech_tokens(variant, target)
            assert len(chunks) == expected_chunks(tokens) > 1, request_id
            audio = np.concatenate(chunks)
            # Complete and in order: the chunks join into one unbroken tone.
            assert audio.shape == (tokens * SAMPLES_PER_TOKEN,), request_id
            np.testing.assert_allclose(audio, tone(audio.size), atol=1e-5, err_msg=request_id)
    return streams * per_stream


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "twin",
    [("cosyvoice2", True, 1), ("cosyvoice3", True, 1)],
    indirect=True,
    ids=["cosyvoice2", "cosyvoice3"],
)
def test_streams_arrive_complete_and_in_order(twin: Twin) -> None:
    check_loaded_as_rendered(twin)
    model = triton.orchestrator(next(iter(twin.rendered)))
    requests = stream_through(twin, STREAMS, REQUESTS_PER_STREAM)
    if twin.llm is not None:
        assert sum(twin.llm.requests_per_server()) == requests
    # The autoscaler's signals, for the orchestrator (counters settle once requests are released).
    deadline = time.monotonic() + 10
    while True:
        text = twin.server.metrics()
        success = metric(text, "nv_inference_request_success", model)
        if success == requests or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert success == requests, text
    count = metric(text, "nv_inference_count", model)
    assert count is not None and count >= requests, text
    queue = metric(text, "nv_inference_queue_duration_us", model)
    assert queue is not None and queue > 0, text


@pytest.mark.timeout(240)
@pytest.mark.parametrize("twin", [("cosyvoice3", True, 2)], indirect=True, ids=["cosyvoice3-2gpu"])
def test_cosyvoice3_spreads_over_every_trtllm_serve(twin: Twin) -> None:
    """Two GPUs, tensor parallelism 1: two trtllm-serve URLs, and requests reach both."""
    assert twin.llm is not None and len(twin.llm.urls) == 2
    requests = stream_through(twin, 3, 4)
    per_server = twin.llm.requests_per_server()
    assert sum(per_server) == requests
    assert min(per_server) > 0, per_server


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "twin",
    [("cosyvoice2", False, 1), ("cosyvoice3", False, 1)],
    indirect=True,
    ids=["cosyvoice2", "cosyvoice3"],
)
def test_offline_requests_answer_once(twin: Twin) -> None:
    check_loaded_as_rendered(twin)
    variant = next(iter(twin.rendered))
    client = grpcclient.InferenceServerClient(twin.server.grpc)
    try:
        for i, target in enumerate(["One offline sentence.", "And a second, longer offline one."]):
            result = client.infer(
                triton.orchestrator(variant), request_inputs(target), request_id=f"offline-{i}"
            )
            audio = result.as_numpy("waveform").reshape(-1)
            tokens = speech_tokens(variant, target)
            assert audio.shape == (tokens * SAMPLES_PER_TOKEN,)
            np.testing.assert_allclose(audio, tone(audio.size), atol=1e-5)
    finally:
        client.close()
