"""``build --dry-run``: the plan of a build (steps, exact command lines), nothing run.

Apart from :mod:`.pipeline` to keep that module small; it reads the pipeline's own digests
and command lines, so the plan printed is the plan run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cosyvoice_engine_builder import commands, speaker_step
from cosyvoice_engine_builder.fetch import describe as describe_fetch
from cosyvoice_engine_builder.fetch import model_dir
from cosyvoice_engine_builder.layout import (
    ENGINE_LLM_DIR,
    ENGINE_MODEL_DIR,
    ENGINE_PLANS_DIR,
    LayoutError,
    assumed_layout,
    resolve_layout,
)
from cosyvoice_engine_builder.manifest import verify_engine_dir
from cosyvoice_engine_builder.runner import Command
from cosyvoice_engine_builder.toolchain import ToolchainError, Versions, probe_versions

if TYPE_CHECKING:
    from cosyvoice_engine_builder.pipeline import Pipeline


def dry_run(self: Pipeline) -> None:
    """Print the plan: steps and exact command lines; nothing is fetched, built or written."""
    r = self.request
    out = self.console.out
    out("dry run: nothing is fetched, built or written")
    out(
        f"key {r.key}: {r.variant.value} {r.precision.value} tp={r.tensor_parallel_size} "
        f"max_batch_size={r.max_batch_size} max_num_tokens={r.max_num_tokens} {r.gpu_arch}"
    )
    built = verify_engine_dir(r.engine_dir, r.key).ok
    already = " (already built: the run would exit 0 now)" if built else ""
    out(f"engine dir: {r.engine_dir}{already}")
    out(f"work dir: {r.work_dir}")
    out(f"lock: {r.lock_path}")
    try:
        self._require_tools()
    except ToolchainError as exc:
        out(f"warning: {exc}")
    try:
        versions = probe_versions(self.runner, self.tools.python, self.environ, self.tool_env)
    except ToolchainError as exc:
        out(f"warning: {exc}".splitlines()[0])
        versions = Versions(tensorrt="<tensorrt-version>", tensorrt_llm="<trtllm-version>")
    out(
        f"TensorRT {versions.tensorrt}, TensorRT-LLM {versions.tensorrt_llm}, "
        f"builder {versions.builder}"
    )

    target = model_dir(r)
    layout = assumed_layout(target, r.variant)
    if target.is_dir():
        try:
            layout = resolve_layout(target, r.variant)
        except LayoutError as exc:
            out(f"warning: {exc}")
    else:
        out(f"note: {target} does not exist yet; assuming the LLM at {layout.llm_dir}")

    fetch_digest = self._fetch_digest()
    after_fetch = self._after_fetch(fetch_digest)
    total = len(self.steps)

    def step(index: int, name: str, text: str, digest: str | None = None) -> None:
        done = digest is not None and self.markers.is_done(name, digest)
        skip = "  (done earlier: would skip)" if done else ""
        out(f"[step {index}/{total}] {name}: {text}{skip}")

    step(1, "fetch", describe_fetch(r, self.environ), fetch_digest)
    convert = self.convert_argv(layout)
    convert_digest = self._convert_digest(after_fetch, convert, versions)
    step(2, "convert", Command(convert).display(), convert_digest)
    build = self.build_argv()
    step(
        3,
        "build",
        Command(build).display(),
        self._build_digest(convert_digest, build, versions),
    )
    for index, name, spec, onnx in (
        (4, "plan-flow", self._flow_spec(), layout.flow_estimator_onnx),
        (5, "plan-campplus", commands.SPEAKER_EMBEDDING_PLAN, layout.campplus_onnx),
    ):
        argv = self.plan_argv(spec, onnx, versions)
        step(
            index,
            name,
            Command(argv).display(),
            self._plan_digest(after_fetch, argv, versions),
        )
    if r.default_speaker is not None:
        argv = speaker_step.tool_argv(self.environ, self.tools.python, target, r, r.work_dir)
        step(6, "speaker", Command(argv).display())
    step(
        total,
        "publish",
        f"{self.engines_dir} -> {ENGINE_LLM_DIR}/, plans -> {ENGINE_PLANS_DIR}/, "
        f"{target} -> {ENGINE_MODEL_DIR}/ in {r.partial_dir}; manifest.json last; "
        f"rename to {r.engine_dir}",
    )
