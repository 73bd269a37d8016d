"""The build, step by step: fetch, convert, build, two TensorRT plans, publish.

Each step but publish is resumable through :mod:`~cosyvoice_engine_builder.steps`;
publish is atomic through :mod:`~cosyvoice_engine_builder.publish`, and writes the manifest
:mod:`~cosyvoice_engine_builder.manifest_document` describes. The whole build runs
under the key's lock, and is skipped when ``<cache-dir>/<key>`` already verifies.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cosyvoice_engine_builder import commands, dry_run, speaker_step
from cosyvoice_engine_builder.commands import PlanSpec, ToolPaths
from cosyvoice_engine_builder.fetch import (
    Downloaders,
    FetchError,
    fetch_model,
    model_dir,
    read_fetched,
)
from cosyvoice_engine_builder.fetch import describe as describe_fetch
from cosyvoice_engine_builder.layout import (
    ENGINE_LLM_DIR,
    ENGINE_MODEL_DIR,
    ENGINE_PLANS_DIR,
    SPEAKER_INFO,
    LayoutError,
    ModelLayout,
    resolve_layout,
)
from cosyvoice_engine_builder.lock import exclusive_lock
from cosyvoice_engine_builder.manifest import verify_engine_dir
from cosyvoice_engine_builder.manifest_document import manifest_document
from cosyvoice_engine_builder.progress import Console, StepLog
from cosyvoice_engine_builder.publish import Placement, Published, publish
from cosyvoice_engine_builder.redaction import without_secrets
from cosyvoice_engine_builder.releases import companions, known_releases, pinned_revision
from cosyvoice_engine_builder.request import BuildRequest
from cosyvoice_engine_builder.runner import Command, CommandFailed, Runner
from cosyvoice_engine_builder.steps import StepMarkers, params_digest
from cosyvoice_engine_builder.toolchain import (
    ToolchainError,
    Versions,
    check_gpu_arch,
    probe_versions,
    require_executable,
    require_script,
)

STEPS: tuple[str, ...] = ("fetch", "convert", "build", "plan-flow", "plan-campplus", "publish")
# With a default speaker (speaker_step.py): its prompt features after the plans.
SPEAKER_STEPS: tuple[str, ...] = (*STEPS[:-1], "speaker", "publish")


class BuildFailed(Exception):
    """A step failed; ``tail`` holds the failing tool's last output lines, if any.

    ``permanent`` marks failures a retry cannot fix (a file missing from the model, a
    tool missing from the image, the wrong GPU); the CLI exits 2 for them so the Job's
    pod failure policy stops at once instead of burning retries.
    """

    def __init__(
        self, step: str, message: str, tail: Sequence[str] = (), *, permanent: bool = False
    ) -> None:
        super().__init__(message)
        self.step = step
        self.message = message
        self.tail = tuple(tail)
        self.permanent = permanent


@dataclass(frozen=True)
class Outcome:
    engine_dir: Path
    seconds: float
    already_built: bool
    # The sha256 of the engine's manifest.json (written, or verified when already built):
    # reported to the operator, which records it for the serving pods to check.
    manifest_sha256: str = ""


def _present(path: Path) -> bool:
    if path.is_dir():
        return True
    return path.is_file() and path.stat().st_size > 0


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


class Pipeline:
    def __init__(
        self,
        request: BuildRequest,
        *,
        environ: Mapping[str, str],
        console: Console,
        runner: Runner,
        downloaders: Downloaders | None = None,
        step_timeout: float | None = None,
        lock_timeout: float | None = None,
    ) -> None:
        self.request = request
        self.environ = environ
        self.console = console
        self.runner = runner
        self.downloaders = downloaders or Downloaders()
        self.step_timeout = step_timeout
        self.lock_timeout = lock_timeout
        self.tools = ToolPaths.from_environ(environ)
        # Converters and compilers get no credentials; only the S3 fetch needs them.
        self.tool_env = without_secrets(environ)
        self.markers = StepMarkers(request.work_dir / "steps")
        self.steps = SPEAKER_STEPS if request.default_speaker else STEPS
        # What a failure is reported against; the CLI reads it for unexpected errors.
        self.current_step = "preflight"

    # Paths in the scratch directory.
    @property
    def weights_dir(self) -> Path:
        return self.request.work_dir / "trt_weights"

    @property
    def engines_dir(self) -> Path:
        return self.request.work_dir / "trt_engines"

    @property
    def plans_dir(self) -> Path:
        return self.request.work_dir / "plans"

    # The command lines, shared by the run, the digests and the dry run.
    def convert_argv(self, layout: ModelLayout) -> tuple[str, ...]:
        r = self.request
        return commands.convert_argv(
            self.tools,
            r.precision,
            layout.llm_dir,
            self.weights_dir,
            r.tensor_parallel_size,
            r.kv_cache_type,
            r.smooth_quant,
        )

    def build_argv(self) -> tuple[str, ...]:
        r = self.request
        return commands.build_argv(
            self.tools,
            r.precision,
            self.weights_dir,
            self.engines_dir,
            r.max_batch_size,
            r.max_num_tokens,
        )

    def plan_path(self, spec: PlanSpec, versions: Versions) -> Path:
        return self.plans_dir / spec.plan_name(self.request.gpu_arch, versions.tensorrt)

    def plan_argv(self, spec: PlanSpec, onnx: Path, versions: Versions) -> tuple[str, ...]:
        return commands.trtexec_argv(self.tools, spec, onnx, self.plan_path(spec, versions))

    def _flow_spec(self) -> PlanSpec:
        return commands.FLOW_ESTIMATOR_PLANS[self.request.variant]

    # Each digest chains the digest of the step it consumes, so a refetch reruns
    # everything downstream even when a later command line happens to be unchanged.
    def _fetch_digest(self) -> str:
        r = self.request
        return params_digest(
            {
                "uri": r.source.uri,
                "revision": r.revision,
                "modelDir": str(model_dir(r)),
                "companions": [
                    (c.uri, c.into, pinned_revision(c, r.companion_revisions))
                    for c in companions(r.variant, r.source)
                ],
                "sha256List": _file_digest(r.sha256_list),
            }
        )

    def _after_fetch(self, fetch_digest: str) -> str:
        """What the later steps chain on: the fetch's inputs and what it actually produced,
        so that a model fetched again with other contents (a moved default branch, files
        changed in a pvc:// folder) reruns the conversion and the plans."""
        return params_digest({"fetch": fetch_digest, "model": self.markers.outputs_digest("fetch")})

    @staticmethod
    def _convert_digest(after: str, argv: tuple[str, ...], versions: Versions) -> str:
        return params_digest({"after": after, "argv": argv, "tensorrtLlm": versions.tensorrt_llm})

    def _build_digest(self, after: str, argv: tuple[str, ...], versions: Versions) -> str:
        # The engine is for one architecture; its file names do not say which, so a
        # --work-dir shared between keys must not hand an sm_89 engine to an sm_90 build.
        return params_digest(
            {
                "after": after,
                "argv": argv,
                "tensorrt": versions.tensorrt,
                "tensorrtLlm": versions.tensorrt_llm,
                "gpuArch": self.request.gpu_arch,
            }
        )

    @staticmethod
    def _plan_digest(after: str, argv: tuple[str, ...], versions: Versions) -> str:
        return params_digest({"after": after, "argv": argv, "tensorrt": versions.tensorrt})

    # ------------------------------------------------------------------ run

    def run(self) -> Outcome:
        started = time.monotonic()
        r = self.request
        self.current_step = "check"
        present = verify_engine_dir(r.engine_dir, r.key)
        if present.ok:
            self.console.out(f"already built: {r.engine_dir} verifies; nothing to do")
            seconds = time.monotonic() - started
            return Outcome(r.engine_dir, seconds, True, present.manifest_sha256)

        self.current_step = "lock"

        def waiting(waited: float, holder: str) -> None:
            self.console.out(f"[lock] waiting for {r.lock_path}, held by {holder} ({waited:.0f}s)")

        with exclusive_lock(r.lock_path, timeout=self.lock_timeout, on_wait=waiting):
            # The builder we waited for may have just finished this very key.
            present = verify_engine_dir(r.engine_dir, r.key)
            if present.ok:
                self.console.out(f"already built (by another builder): {r.engine_dir}")
                seconds = time.monotonic() - started
                return Outcome(r.engine_dir, seconds, True, present.manifest_sha256)
            return self._build(started)

    def _build(self, started: float) -> Outcome:
        r = self.request
        source = f"{r.source.uri}{'@' + r.revision if r.revision else ''}"
        self.console.out(
            f"building engine {r.key}: {r.variant.value} {r.precision.value} "
            f"tp={r.tensor_parallel_size} max_batch_size={r.max_batch_size} "
            f"max_num_tokens={r.max_num_tokens} kv_cache={r.kv_cache_type.value} "
            f"for {r.gpu_arch} from {source}"
        )
        self.current_step = "preflight"
        versions = self._preflight()
        # Before any download or GPU work: a missing recording fails at once.
        audio_sha256 = self._speaker_audio() if r.default_speaker else ""

        fetch_digest, layout = self._fetch(1)
        convert_digest = self._convert(2, layout, fetch_digest, versions)
        self._build_engine(3, convert_digest, versions)
        flow_plan = self._plan(
            4,
            "plan-flow",
            self._flow_spec(),
            layout.flow_estimator_onnx,
            fetch_digest,
            versions,
        )
        speaker_plan = self._plan(
            5,
            "plan-campplus",
            commands.SPEAKER_EMBEDDING_PLAN,
            layout.campplus_onnx,
            fetch_digest,
            versions,
        )
        speaker = (
            self._speaker(6, layout, fetch_digest, audio_sha256) if r.default_speaker else None
        )
        published = self._publish(
            len(self.steps), layout, versions, (flow_plan, speaker_plan), speaker
        )
        self._clean_work()
        seconds = time.monotonic() - started
        self.console.out(f"engine {r.key} ready at {published.engine_dir} after {seconds:.1f}s")
        return Outcome(published.engine_dir, seconds, False, published.manifest_sha256)

    def _require_tools(self) -> None:
        r = self.request
        if commands.uses_quantize_script(r.precision, r.kv_cache_type):
            require_script(self.tools.quantize_script, "TRTLLM_QUANTIZE")
        else:
            require_script(self.tools.convert_script, "TRTLLM_QWEN_CONVERT")
        require_executable(self.tools.trtllm_build, "TRTLLM_BUILD", self.environ)
        require_executable(self.tools.trtexec, "TRTEXEC", self.environ)
        if r.default_speaker is not None:
            speaker_step.require_tool(self.runner, self.tools.python, self.environ, self.tool_env)

    def _preflight(self) -> Versions:
        # Every tool is checked before the first download: finding out that trtexec is
        # missing from the image after a 20-minute LLM build wastes a GPU node.
        try:
            self._require_tools()
            versions = probe_versions(self.runner, self.tools.python, self.environ, self.tool_env)
            gpu_note = check_gpu_arch(
                self.runner, self.request.gpu_arch, self.environ, self.tool_env
            )
        except ToolchainError as exc:
            raise BuildFailed("preflight", str(exc), permanent=True) from exc
        self.console.out(
            f"[preflight] TensorRT {versions.tensorrt}, TensorRT-LLM {versions.tensorrt_llm}, "
            f"builder {versions.builder}; {gpu_note}"
        )
        return versions

    def _step(
        self,
        index: int,
        name: str,
        digest: str,
        outputs: Sequence[Path],
        action: Callable[[StepLog], None],
        *,
        clean: Sequence[Path] = (),
    ) -> None:
        self.current_step = name
        log = StepLog(self.console, index, len(self.steps), name)
        if self.markers.is_done(name, digest, outputs):
            log.line("skipped: done in an earlier attempt with the same inputs")
            return
        if self.markers.is_done(name, digest):
            log.line("outputs changed since an earlier attempt finished this step: redoing it")
        self.markers.clear(name)
        # Whatever a crashed attempt left behind is not trusted: the tools would mix
        # old and new ranks or refuse to overwrite.
        for path in clean:
            _remove(path)
        log.line("starting")
        try:
            action(log)
        except CommandFailed as exc:
            raise BuildFailed(
                name, f"{exc} (command: {exc.command.display()})", exc.tail()
            ) from exc
        except (ToolchainError, LayoutError) as exc:
            raise BuildFailed(name, str(exc), permanent=True) from exc
        except FetchError as exc:
            raise BuildFailed(name, str(exc), permanent=exc.permanent) from exc
        missing = [str(p) for p in outputs if not _present(p)]
        if missing:
            raise BuildFailed(name, f"{name} finished but did not produce {', '.join(missing)}")
        self.markers.mark_done(name, digest, outputs)
        log.line("done")

    def _run_tool(self, log: StepLog, argv: tuple[str, ...]) -> None:
        command = Command(argv, env=self.tool_env, timeout=self.step_timeout)
        log.line(f"running {command.display()}")
        self.runner.run(command, heartbeat=log.heartbeat)

    def _fetch(self, index: int) -> tuple[str, ModelLayout]:
        r = self.request
        digest = self._fetch_digest()
        target = model_dir(r)

        def action(log: StepLog) -> None:
            log.line(describe_fetch(r, self.environ))
            fetch_model(
                r,
                downloaders=self.downloaders,
                runner=self.runner,
                environ=self.environ,
                echo=log.line,
                timeout=self.step_timeout,
            )

        self._step(index, "fetch", digest, [target], action)
        try:
            layout = resolve_layout(target, r.variant)
        except LayoutError as exc:
            # The files the marker vouched for are gone or wrong: fetch again next time.
            self.markers.clear("fetch")
            message = str(exc)
            if not companions(r.variant, r.source):
                message += (
                    f". Upstream's {r.variant.value} release "
                    f"({', '.join(known_releases(r.variant))}) is completed with its companion "
                    "repositories automatically; any other source must hold the whole model "
                    "(LLM checkpoint under llm/ and the ONNX files)"
                )
            raise BuildFailed("fetch", message, permanent=True) from exc
        return self._after_fetch(digest), layout

    def _convert(self, index: int, layout: ModelLayout, after: str, versions: Versions) -> str:
        r = self.request
        argv = self.convert_argv(layout)
        digest = self._convert_digest(after, argv, versions)
        outputs = [self.weights_dir / "config.json"] + [
            self.weights_dir / f"rank{i}.safetensors" for i in range(r.tensor_parallel_size)
        ]

        def action(log: StepLog) -> None:
            self._run_tool(log, argv)

        self._step(index, "convert", digest, outputs, action, clean=[self.weights_dir])
        return digest

    def _build_engine(self, index: int, after: str, versions: Versions) -> None:
        argv = self.build_argv()
        digest = self._build_digest(after, argv, versions)
        outputs = [self.engines_dir / "config.json"] + [
            self.engines_dir / f"rank{i}.engine" for i in range(self.request.tensor_parallel_size)
        ]

        def action(log: StepLog) -> None:
            self._run_tool(log, argv)

        self._step(index, "build", digest, outputs, action, clean=[self.engines_dir])

    def _plan(
        self,
        index: int,
        name: str,
        spec: PlanSpec,
        onnx: Path,
        after: str,
        versions: Versions,
    ) -> Path:
        argv = self.plan_argv(spec, onnx, versions)
        plan = self.plan_path(spec, versions)
        digest = self._plan_digest(after, argv, versions)

        def action(log: StepLog) -> None:
            plan.parent.mkdir(parents=True, exist_ok=True)
            self._run_tool(log, argv)

        self._step(index, name, digest, [plan], action, clean=[plan])
        return plan

    def _speaker_audio(self) -> str:
        """The default speaker's recording's SHA-256; a missing one fails for good."""
        self.current_step = "speaker"
        try:
            return speaker_step.audio_digest(self.request)
        except speaker_step.SpeakerAudioMissing as exc:
            raise BuildFailed("speaker", str(exc), permanent=True) from exc

    def _speaker(
        self, index: int, layout: ModelLayout, after: str, audio_sha256: str
    ) -> tuple[Path, str]:
        """The default speaker's file and the recording's SHA-256 (speaker_step.py)."""
        r = self.request
        assert r.default_speaker is not None
        work = r.work_dir
        argv = speaker_step.tool_argv(self.environ, self.tools.python, layout.root, r, work)
        out = speaker_step.output(work)
        digest = speaker_step.digest(after, argv, audio_sha256, r.default_speaker.transcript)

        def action(log: StepLog) -> None:
            text = speaker_step.transcript_file(work)
            text.parent.mkdir(parents=True, exist_ok=True)
            text.write_text(r.default_speaker.transcript if r.default_speaker else "", "utf-8")
            try:
                self._run_tool(log, argv)
            except CommandFailed as exc:
                if exc.result is not None and exc.result.returncode == 2:
                    # The tool's own refusal (not a WAV, too short or long): retrying cannot help.
                    tail = "; ".join(exc.tail()[-3:])
                    raise BuildFailed("speaker", f"{exc}: {tail}", permanent=True) from exc
                raise

        self._step(index, "speaker", digest, [out], action, clean=[out])
        return out, audio_sha256

    def _publish(
        self,
        index: int,
        layout: ModelLayout,
        versions: Versions,
        plans: tuple[Path, Path],
        speaker: tuple[Path, str] | None = None,
    ) -> Published:
        r = self.request
        self.current_step = "publish"
        log = StepLog(self.console, index, len(self.steps), "publish")
        tokenizer_rel = "/".join(p for p in (ENGINE_MODEL_DIR, layout.llm_subpath) if p)
        flow_plan, speaker_plan = plans
        flow_rel = f"{ENGINE_PLANS_DIR}/{flow_plan.name}"
        speaker_rel = f"{ENGINE_PLANS_DIR}/{speaker_plan.name}"
        placements = [
            Placement(self.engines_dir, ENGINE_LLM_DIR),
            Placement(flow_plan, flow_rel),
            Placement(speaker_plan, speaker_rel),
            Placement(layout.root, ENGINE_MODEL_DIR, skip_hidden=True),
        ]
        layout_fields = {
            "llmEngineDir": ENGINE_LLM_DIR,
            "flowEstimatorPlan": flow_rel,
            "speakerEmbeddingPlan": speaker_rel,
            "modelDir": ENGINE_MODEL_DIR,
            "tokenizerDir": tokenizer_rel,
        }
        if (layout.root / SPEAKER_INFO).is_file():
            layout_fields["speakerInfo"] = f"{ENGINE_MODEL_DIR}/{SPEAKER_INFO}"
        extra: dict[str, object] = {}
        if speaker is not None:
            placements.append(Placement(speaker[0], speaker_step.DEFAULT_SPEAKER))
            layout_fields["defaultSpeaker"] = speaker_step.DEFAULT_SPEAKER
            extra["speakers"] = speaker_step.manifest_fields(r, speaker[1])

        log.line(f"assembling {r.partial_dir}")
        result = publish(
            cache_dir=r.cache_dir,
            key=r.key,
            placements=placements,
            manifest_for=lambda files: {
                **manifest_document(r, versions, layout_fields, files, read_fetched(r)),
                **extra,
            },
            echo=log.line,
        )
        if result.already_present:
            log.line(f"{result.engine_dir} appeared meanwhile and verifies; kept it")
        else:
            log.line(f"published {result.engine_dir}")
        return result

    def _clean_work(self) -> None:
        # Only what the builder itself created: --work-dir may point somewhere shared.
        work = self.request.work_dir
        owned = [
            self.weights_dir,
            self.engines_dir,
            self.plans_dir,
            work / "steps",
            speaker_step.output(work).parent,
        ]
        if self.request.source.scheme != "pvc":
            owned.append(model_dir(self.request))
        for path in owned:
            shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):
            work.rmdir()

    # -------------------------------------------------------------- dry run

    def dry_run(self) -> None:
        dry_run.dry_run(self)


def _file_digest(path: Path | None) -> str:
    """The sha256 of a small input file (a new list must fetch again), "" for none."""
    if path is None:
        return ""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "unreadable"
