"""The command itself: options, then the gate, the repository, the servers, in that order.

:func:`serve` is what both entry points run once the command line is parsed; it turns every
refusal into a console line, a termination message and an exit code
(:mod:`.exit_codes`).
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cosyvoice_engine_builder import termination
from cosyvoice_engine_builder.progress import Console
from cosyvoice_engine_builder.runner import Runner
from cosyvoice_engine_builder.serving.exit_codes import (
    EXIT_CONFIG,
    EXIT_INCOMPATIBLE,
    ConfigError,
    ServerFailed,
)
from cosyvoice_engine_builder.serving.gate import observe_pod, run_gate
from cosyvoice_engine_builder.serving.launch import plan_llm_servers, tritonserver_argv
from cosyvoice_engine_builder.serving.options import ServeOptions
from cosyvoice_engine_builder.serving.repository import (
    assemble_model_view,
    assemble_repository,
    model_dir_of,
    plan_model_view,
    plan_repository,
)
from cosyvoice_engine_builder.serving.supervisor import Supervisor, signals_to


def _clip_head(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")


def _describe_manifest(manifest: Mapping[str, Any]) -> str:
    versions = manifest.get("versions")
    versions = versions if isinstance(versions, dict) else {}
    files = manifest.get("files")
    return (
        f"key {manifest.get('key')}, {manifest.get('variant')}, {manifest.get('precision')}, "
        f"tp {manifest.get('tensorParallelSize')}, max batch {manifest.get('maxBatchSize')}, "
        f"{manifest.get('gpuArch')}, TensorRT {versions.get('tensorrt')}, TensorRT-LLM "
        f"{versions.get('tensorrtLlm')}, {len(files) if isinstance(files, list) else 0} files"
    )


def serve(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    console: Console,
    *,
    runner: Runner | None = None,
) -> int:
    def report(*, step: str, message: str, tail: Sequence[str] = (), **extra: object) -> None:
        text = _clip_head(message, termination.MESSAGE_MAX_BYTES)
        if tail:
            budget = termination.MESSAGE_MAX_BYTES - len(text.encode("utf-8")) - 1
            body = termination.tail_text(tail, max_lines=termination.MESSAGE_MAX_LINES - 1)
            if budget > 0:
                text = f"{text}\n{termination.clip_bytes(body, budget)}"
        payload: dict[str, object] = {"result": "failed", "step": step, **extra}
        payload["message"] = console.redact(text)
        termination.write(payload, environ)

    try:
        options = ServeOptions.from_args(args)
    except ConfigError as exc:
        console.err(f"error: {exc}")
        report(step="arguments", message=str(exc))
        return EXIT_CONFIG

    runner = runner or Runner(redactor=console.redact, echo=console.out)
    supervisor = Supervisor(options, console, report)
    with signals_to(supervisor.on_signal):
        return _serve(options, environ, console, runner, supervisor, report)


def _serve(
    options: ServeOptions,
    environ: Mapping[str, str],
    console: Console,
    runner: Runner,
    supervisor: Supervisor,
    report: Callable[..., None],
) -> int:
    env = dict(environ)
    console.out(f"[gate] engine {options.key} at {options.engine_dir}")
    gate, facts = run_gate(options, lambda: observe_pod(runner, env))
    if gate.manifest is not None:
        console.out(f"[gate] engine: {_describe_manifest(gate.manifest)}")
    if facts is not None:
        console.out(
            f"[gate] pod: {facts.describe_gpus()}, TensorRT {facts.tensorrt or 'unknown'}, "
            f"TensorRT-LLM {facts.tensorrt_llm or 'unknown'}"
        )
    exit_code = 0
    if not gate.ok:
        console.err(f"error: {gate.message}")
        if not options.dry_run:
            report(
                step="compatibility",
                message=gate.message,
                key=options.key,
                reason=gate.reason,
                mismatches=sorted({m.field for m in gate.mismatches}),
            )
            return EXIT_INCOMPATIBLE
        exit_code = EXIT_INCOMPATIBLE
    else:
        console.out("[gate] ok: the engine was built for this GPU architecture and TensorRT")

    try:
        entries = plan_repository(options)
    except ConfigError as exc:
        console.err(f"error: {exc}")
        if not options.dry_run:
            report(step="repository", message=str(exc), key=options.key)
        return exit_code or EXIT_CONFIG

    if gate.manifest is None:
        # Dry run without a manifest: nothing more can be said about the commands.
        return exit_code
    try:
        view = plan_model_view(options, gate.manifest, len(facts.gpus) if facts else 0)
    except ConfigError as exc:
        console.err(f"error: {exc}")
        if not options.dry_run:
            report(step="repository", message=str(exc), key=options.key)
        return exit_code or EXIT_CONFIG
    servers = plan_llm_servers(options, gate.manifest, env)
    triton_argv = tritonserver_argv(options, env)
    if not options.serves_llm and options.llm_groups is not None:
        console.out("[serve] --llm-groups ignored: cosyvoice2's LLM runs inside Triton")

    if options.dry_run:
        for entry in entries:
            console.out(
                f"[repository] would assemble {options.model_repository / entry.name}: "
                f"config.pbtxt from {entry.config}, 1 -> {entry.code}"
            )
        console.out(
            f"[repository] would present {len(view)} entries of the engine's model directory "
            f"in {options.model_view}, with these plans:"
        )
        for name, source in view.items():
            if source.parent != model_dir_of(options, gate.manifest):
                console.out(f"[repository]   {name} -> {source}")
        for server in servers:
            console.out(
                f"[llm] would start {server.describe()}: CUDA_VISIBLE_DEVICES="
                f"{','.join(server.gpus)} {' '.join(server.argv)}; then wait for "
                f"http://127.0.0.1:{server.port}/health"
            )
        console.out(f"[triton] would run: {' '.join(triton_argv)}")
        return exit_code

    try:
        assemble_repository(options.model_repository, entries)
        assemble_model_view(options.model_view, view)
    except (ConfigError, OSError) as exc:
        console.err(f"error: assembling the model repository: {exc}")
        report(step="repository", message=str(exc), key=options.key)
        return EXIT_CONFIG
    console.out(f"[repository] {options.model_repository}: {', '.join(e.name for e in entries)}")
    console.out(f"[repository] {options.model_view}: the engine's model directory and plans")

    if supervisor.received is not None:
        console.out(f"[serve] {signal.Signals(supervisor.received).name} before any server started")
        return 128 + supervisor.received
    try:
        failed = supervisor.start_llms(servers, env)
        if failed is not None:
            return failed
        return supervisor.run_triton(triton_argv, env)
    except ServerFailed as exc:
        console.err(f"error: {exc}")
        report(step="start", message=str(exc), tail=exc.tail)
        supervisor.stop_llms()
        return exc.code
