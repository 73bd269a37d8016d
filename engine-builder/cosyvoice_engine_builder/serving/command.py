"""The command itself: options, then the gate, the repository, the servers, in that order.

:func:`plan_pod` finds out everything the pod would do (it reads the engine, the ConfigMap
and the GPUs, and writes and starts nothing): that plan is what ``--dry-run`` prints.
:func:`run_pod` carries a plan out: it assembles the repository and the model view, then
hands over to the :class:`~.supervisor.Supervisor`. :func:`serve` is what both entry points
run once the command line is parsed; it turns every refusal into a console line, a
termination message and an exit code (:mod:`.exit_codes`).
"""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosyvoice_engine_builder import termination
from cosyvoice_engine_builder.progress import Console
from cosyvoice_engine_builder.redaction import Redactor
from cosyvoice_engine_builder.runner import Runner
from cosyvoice_engine_builder.serving.exit_codes import (
    EXIT_CONFIG,
    EXIT_INCOMPATIBLE,
    EXIT_SERVER_FAILED,
    ConfigError,
    ServerFailed,
)
from cosyvoice_engine_builder.serving.gate import GateResult, PodFacts, observe_pod, run_gate
from cosyvoice_engine_builder.serving.health import HealthServer
from cosyvoice_engine_builder.serving.launch import (
    LlmServer,
    display,
    plan_llm_servers,
    tritonserver_argv,
)
from cosyvoice_engine_builder.serving.options import ServeOptions, build_parser
from cosyvoice_engine_builder.serving.repository import (
    ModelEntry,
    assemble_model_view,
    assemble_repository,
    model_dir_of,
    plan_model_view,
    plan_repository,
)
from cosyvoice_engine_builder.serving.supervisor import Supervisor, signals_to
from cosyvoice_engine_builder.usage import UsageError


@dataclass(frozen=True)
class PodPlan:
    """What this pod would do, found out without writing or starting anything.

    A real run's plan stops at the gate when the gate refuses; a dry run's goes on to say
    everything it can. The servers' command lines are known (``complete``) only when the
    engine's manifest was read and the repository check passed.
    """

    options: ServeOptions
    gate: GateResult
    facts: PodFacts | None
    entries: tuple[ModelEntry, ...] = ()
    view: Mapping[str, Path] = field(default_factory=dict)
    servers: tuple[LlmServer, ...] = ()
    triton_argv: tuple[str, ...] = ()
    repository_error: str | None = None
    complete: bool = False

    @property
    def refused(self) -> bool:
        return not self.gate.ok or self.repository_error is not None

    @property
    def exit_code(self) -> int:
        """0, or the refusal's: the gate's 3 first, then the repository's 2."""
        gate = 0 if self.gate.ok else EXIT_INCOMPATIBLE
        return gate or (EXIT_CONFIG if self.repository_error is not None else 0)


def plan_pod(
    options: ServeOptions, environ: Mapping[str, str], observe: Callable[[], PodFacts]
) -> PodPlan:
    """The gate's findings, the repository and view to assemble, and the server commands."""
    gate, facts = run_gate(options, observe)
    if not gate.ok and not options.dry_run:
        return PodPlan(options, gate, facts)
    try:
        entries = tuple(plan_repository(options))
    except ConfigError as exc:
        return PodPlan(options, gate, facts, repository_error=str(exc))
    if gate.manifest is None:
        # Dry run without a manifest: nothing more can be said about the commands.
        return PodPlan(options, gate, facts, entries)
    try:
        view = plan_model_view(options, gate.manifest, len(facts.gpus) if facts else 0)
    except ConfigError as exc:
        return PodPlan(options, gate, facts, entries, repository_error=str(exc))
    return PodPlan(
        options,
        gate,
        facts,
        entries,
        view,
        servers=tuple(plan_llm_servers(options, gate.manifest, environ)),
        triton_argv=tritonserver_argv(options, environ),
        complete=True,
    )


def run_pod(plan: PodPlan, supervisor: Supervisor, environ: Mapping[str, str]) -> int:
    """Assemble what the plan says, start the LLM servers, then run Triton to its end."""
    assert plan.complete and not plan.refused
    options, console, report = plan.options, supervisor.console, supervisor.report
    try:
        assemble_repository(options.model_repository, plan.entries)
        assemble_model_view(options.model_view, plan.view)
    except (ConfigError, OSError) as exc:
        console.err(f"error: assembling the model repository: {exc}")
        report(step="repository", message=str(exc), key=options.key)
        return EXIT_CONFIG
    names = ", ".join(e.name for e in plan.entries)
    console.out(f"[repository] {options.model_repository}: {names}")
    console.out(f"[repository] {options.model_view}: the engine's model directory and plans")

    if supervisor.received is not None:
        console.out(f"[serve] {signal.Signals(supervisor.received).name} before any server started")
        return 128 + supervisor.received
    try:
        probes = HealthServer(
            options.health_port, supervisor.not_ready_reason, supervisor.metrics_text
        )
    except OSError as exc:
        message = f"--health-port {options.health_port}: cannot serve GET /ready: {exc}"
        console.err(f"error: {message}")
        report(step="start", message=message)
        return EXIT_SERVER_FAILED
    probes.start()
    try:
        failed = supervisor.start_llms(plan.servers, environ)
        if failed is not None:
            return failed
        return supervisor.run_triton(plan.triton_argv, environ)
    except ServerFailed as exc:
        console.err(f"error: {exc}")
        report(step="start", message=str(exc), tail=exc.tail)
        supervisor.stop_llms()
        return exc.code
    finally:
        probes.stop()


def print_plan(plan: PodPlan, console: Console) -> None:
    """The gate's findings and any refusal; in a dry run also what would be done."""
    gate, facts, options = plan.gate, plan.facts, plan.options
    if gate.manifest is not None:
        console.out(f"[gate] engine: {_describe_manifest(gate.manifest)}")
    if facts is not None:
        console.out(
            f"[gate] pod: {facts.describe_gpus()}, TensorRT {facts.tensorrt or 'unknown'}, "
            f"TensorRT-LLM {facts.tensorrt_llm or 'unknown'}"
        )
    if not gate.ok:
        console.err(f"error: {gate.message}")
    else:
        console.out("[gate] ok: the engine was built for this GPU architecture and TensorRT")
    if plan.repository_error is not None:
        console.err(f"error: {plan.repository_error}")
    if not plan.complete:
        return
    if not options.serves_llm and options.llm_groups is not None:
        console.out("[serve] --llm-groups ignored: cosyvoice2's LLM runs inside Triton")
    if options.dry_run:
        _print_dry_run(plan, console)


def _print_dry_run(plan: PodPlan, console: Console) -> None:
    options = plan.options
    assert plan.gate.manifest is not None
    for entry in plan.entries:
        console.out(
            f"[repository] would assemble {options.model_repository / entry.name}: "
            f"config.pbtxt from {entry.config}, 1 -> {entry.code}"
        )
    console.out(
        f"[repository] would present {len(plan.view)} entries of the engine's model directory "
        f"in {options.model_view}, with these plans:"
    )
    model_dir = model_dir_of(options, plan.gate.manifest)
    for name, source in plan.view.items():
        if source.parent != model_dir:
            console.out(f"[repository]   {name} -> {source}")
    for server in plan.servers:
        console.out(
            f"[llm] would start {server.describe()}: CUDA_VISIBLE_DEVICES="
            f"{','.join(server.gpus)} {' '.join(server.argv)}; then wait for "
            f"http://127.0.0.1:{server.port}/health"
        )
    console.out(f"[triton] would run: {display(plan.triton_argv)}")


def _report_refusal(plan: PodPlan, report: Callable[..., None]) -> None:
    gate, key = plan.gate, plan.options.key
    if not gate.ok:
        report(
            step="compatibility",
            message=gate.message,
            key=key,
            reason=gate.reason,
            mismatches=sorted({m.field for m in gate.mismatches}),
        )
    elif plan.repository_error is not None:
        report(step="repository", message=plan.repository_error, key=key)


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


def termination_reporter(environ: Mapping[str, str], console: Console) -> Callable[..., None]:
    """``report(step=..., message=..., tail=..., **extra)``: one JSON line in the pod status."""

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

    return report


def serve(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    console: Console,
    *,
    runner: Runner | None = None,
) -> int:
    report = termination_reporter(environ, console)
    try:
        options = ServeOptions.from_args(args)
    except ConfigError as exc:
        console.err(f"error: {exc}")
        report(step="arguments", message=str(exc))
        return EXIT_CONFIG

    tools = runner or Runner(redactor=console.redact, echo=console.out)
    supervisor = Supervisor(options, console, report)
    env = dict(environ)
    with signals_to(supervisor.on_signal):
        console.out(f"[gate] engine {options.key} at {options.engine_dir}")
        plan = plan_pod(options, env, lambda: observe_pod(tools, env))
        print_plan(plan, console)
        if options.dry_run:
            return plan.exit_code
        if plan.refused:
            _report_refusal(plan, report)
            return plan.exit_code
        return run_pod(plan, supervisor, env)


def main(argv: list[str] | None = None, *, environ: Mapping[str, str] | None = None) -> int:
    """``cosyvoice-serve [flags]``: the same command as ``cosyvoice-engine-builder serve``."""
    env = dict(os.environ if environ is None else environ)
    console = Console(Redactor.from_environ(env))
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        console.err(exc.usage.rstrip())
        console.err(f"error: {exc}")
        termination_reporter(env, console)(step="arguments", message=str(exc))
        return EXIT_CONFIG
    return serve(args, env, console)
