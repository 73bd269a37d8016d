"""``cosyvoice-engine-builder``: the engine Jobs' entry point (``build|verify|remove``).

Its ``serve`` is an alias of ``cosyvoice-serve``, the serving container's command
(:mod:`~cosyvoice_engine_builder.serving`), whose exit codes are listed in
:mod:`~cosyvoice_engine_builder.serving.exit_codes`; the rest of this docstring is about the
Jobs.

Exit codes (the operator's Job and retry policy rely on them):

- 0  the engine is built, or was already there (``build``); it verifies (``verify``); it
     and its build leftovers are gone, or were never there (``remove``)
- 1  a step failed and a retry may succeed (``build``); the engine is missing or invalid
     (``verify``); a file-system error while removing (``remove``)
- 2  retrying cannot help: invalid command line, a file missing from the model (config,
     ONNX, the pvc:// path), a tool missing from the image, a GPU of the wrong architecture;
     for ``remove`` also no cache dir, or a link out of it
- 3  another builder held the key's lock past ``--lock-timeout``
- 143  terminated by SIGTERM (pod deleted or evicted); a rerun resumes

Whatever the outcome of ``build`` or ``remove``, a one-line JSON result goes to the
termination message file (``TERMINATION_MESSAGE_PATH``, default ``/dev/termination-log``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from cosyvoice_engine_builder import __version__, termination
from cosyvoice_engine_builder.fetch import Downloaders
from cosyvoice_engine_builder.lock import LockTimeout
from cosyvoice_engine_builder.manifest import verify_engine_dir
from cosyvoice_engine_builder.pipeline import BuildFailed, Pipeline
from cosyvoice_engine_builder.progress import Console
from cosyvoice_engine_builder.redaction import Redactor
from cosyvoice_engine_builder.remove import RemoveRefused, remove_engine
from cosyvoice_engine_builder.request import (
    BuildRequest,
    InvalidRequest,
    KvCacheType,
    Precision,
    Variant,
    validate_key,
)
from cosyvoice_engine_builder.runner import Runner
from cosyvoice_engine_builder.serving.command import serve
from cosyvoice_engine_builder.serving.options import add_arguments as add_serve_arguments
from cosyvoice_engine_builder.usage import RaisingParser, UsageError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # also every permanent build failure: see the module docstring
EXIT_LOCK_TIMEOUT = 3
EXIT_TERMINATED = 128 + signal.SIGTERM


_Reporter = Callable[[dict[str, object]], None]


class _Terminated(BaseException):
    """Raised from the SIGTERM handler; a BaseException so no cleanup code swallows it."""


def _non_negative_seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 0")
    return value


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    """``build``'s scratch, model claims, dry run and time limits."""
    parser.add_argument("--work-dir", type=Path, help="scratch; default <cache-dir>/.work/<key>")
    parser.add_argument("--pvc-root", type=Path, default=Path("/models"))
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    parser.add_argument(
        "--lock-timeout",
        type=_non_negative_seconds,
        default=None,
        help="seconds to wait for another builder of the same key (default: forever)",
    )
    parser.add_argument(
        "--step-timeout",
        type=_non_negative_seconds,
        default=None,
        help="seconds any one external command may run (default: no limit)",
    )


def _supply_chain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--companion-revision",
        action="append",
        default=[],
        metavar="hf://ORG/NAME=COMMIT",
        help="fetch that companion repository of an upstream release at this full commit "
        "(repeatable; over the release table's own pins)",
    )
    parser.add_argument(
        "--default-speaker-audio",
        default="",
        metavar="pvc://CLAIM/PATH",
        help="a WAV recording of the default speaker (spec.speakers.default): its prompt "
        "features are computed into speakers/default.npz of the engine",
    )
    parser.add_argument(
        "--default-speaker-transcript",
        default="",
        metavar="TEXT",
        help="what the default speaker's recording says (with --default-speaker-audio)",
    )
    parser.add_argument(
        "--sha256-list",
        type=Path,
        default=None,
        help="a sha256sum-format list of files (relative to the model directory) the "
        "fetched model must match; a mismatch fails the build for good (exit 2)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = RaisingParser(
        prog="cosyvoice-engine-builder",
        description="Build and publish CosyVoice TensorRT-LLM engines and TensorRT plans.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    build = sub.add_parser("build", help="build the engine for a key, resuming if possible")
    build.add_argument("--key", required=True, help="content key computed by the operator")
    build.add_argument("--cache-dir", required=True, type=Path, help="the engine cache volume")
    build.add_argument("--variant", required=True, choices=[v.value for v in Variant])
    build.add_argument(
        "--model-uri", required=True, help="hf://ORG/NAME, s3://BUCKET/PATH or pvc://CLAIM/PATH"
    )
    build.add_argument("--revision", default="", help='hf revision; "" = default branch')
    build.add_argument("--precision", choices=[p.value for p in Precision])
    build.add_argument("--tensor-parallel-size", type=int)
    build.add_argument("--max-batch-size", type=int)
    build.add_argument("--max-num-tokens", type=int)
    build.add_argument(
        "--kv-cache-type",
        choices=[k.value for k in KvCacheType],
        default=KvCacheType.AUTO.value,
        help="int8: --int8_kv_cache; fp8: quantize.py --kv_cache_dtype fp8; auto: the engine's",
    )
    build.add_argument(
        "--smoothquant-alpha",
        type=float,
        default=None,
        help="int8-smoothquant: convert_checkpoint.py --smoothquant ALPHA (default 0.5)",
    )
    build.add_argument("--smoothquant-per-token", action="store_true", help="--per_token")
    build.add_argument("--smoothquant-per-channel", action="store_true", help="--per_channel")
    build.add_argument("--gpu-arch", required=True, help="e.g. sm_90")
    _supply_chain_arguments(build)
    _run_arguments(build)

    verify = sub.add_parser("verify", help="exit 0 iff a complete, digest-valid engine exists")
    verify.add_argument("--cache-dir", required=True, type=Path)
    verify.add_argument("--key", required=True)

    remove = sub.add_parser(
        "remove", help="remove the engine of a key and its build leftovers (under its lock)"
    )
    remove.add_argument("--key", required=True, help="content key (40 lowercase hex digits)")
    remove.add_argument("--cache-dir", required=True, type=Path, help="the engine cache volume")
    remove.add_argument(
        "--lock-timeout",
        type=_non_negative_seconds,
        default=None,
        help="seconds to wait for a builder of the same key (default: forever)",
    )

    add_serve_arguments(
        sub.add_parser(
            "serve",
            help="the serving container (alias of cosyvoice-serve): check the engine against "
            "this pod, then run trtllm-serve (cosyvoice3) and Triton",
        )
    )
    return parser


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into an exception, so the running tool is stopped and reported."""
    if threading.current_thread() is not threading.main_thread():
        # Signal handlers can only be installed from the main thread (embedding, tests).
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    downloaders: Downloaders | None = None,
) -> int:
    env = dict(os.environ if environ is None else environ)
    redactor = Redactor.from_environ(env)
    console = Console(redactor)

    def report(payload: dict[str, object]) -> None:
        message = payload.get("message")
        if isinstance(message, str):
            payload["message"] = redactor(message)
        termination.write(payload, env)

    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        console.err(exc.usage.rstrip())
        console.err(f"error: {exc}")
        report({"result": "failed", "step": "arguments", "message": str(exc)})
        return EXIT_USAGE

    if args.command == "verify":
        return _verify(args, console, report)
    if args.command == "remove":
        return _remove(args, console, report)
    if args.command == "serve":
        return serve(args, env, console)
    return _build(args, env, console, redactor, report, downloaders)


def _verify(args: argparse.Namespace, console: Console, report: _Reporter) -> int:
    try:
        key = validate_key(args.key)
    except InvalidRequest as exc:
        console.err(f"error: {exc}")
        report({"result": "failed", "step": "arguments", "message": str(exc)})
        return EXIT_USAGE
    result = verify_engine_dir(args.cache_dir / key, key)
    if result.ok:
        console.out(json.dumps(result.manifest, indent=2, sort_keys=True))
        report({"result": "ok", "key": key, "engineDir": str(result.engine_dir)})
        return EXIT_OK
    for problem in result.problems:
        console.err(f"invalid: {problem}")
    report(
        {
            "result": "failed",
            "step": "verify",
            "key": key,
            "message": termination.tail_text(result.problems),
        }
    )
    return EXIT_FAILED


# The termination message lists at most this many removed paths (it must stay < 4096 bytes).
_REMOVED_LISTED = 20


def _remove(args: argparse.Namespace, console: Console, report: _Reporter) -> int:
    key = args.key
    try:
        with _sigterm_raises():
            removal = remove_engine(
                args.cache_dir, key, echo=console.out, lock_timeout=args.lock_timeout
            )
    except RemoveRefused as exc:
        console.err(f"error: {exc}")
        report({"result": "failed", "step": exc.step, "key": key, "message": str(exc)})
        return EXIT_USAGE
    except LockTimeout as exc:
        console.out(f"error: {exc}")
        report({"result": "failed", "step": "lock", "key": key, "message": str(exc)})
        return EXIT_LOCK_TIMEOUT
    except _Terminated:
        console.out("terminated by SIGTERM while removing; a rerun finishes the job")
        report(
            {"result": "failed", "step": "remove", "key": key, "message": "terminated by SIGTERM"}
        )
        return EXIT_TERMINATED
    except OSError as exc:
        console.out(f"error: removing {key}: {exc}")
        report({"result": "failed", "step": "remove", "key": key, "message": str(exc)})
        return EXIT_FAILED
    report(
        {
            "result": "ok",
            "key": key,
            "removed": list(removal.removed[:_REMOVED_LISTED]),
            "removedCount": len(removal.removed),
            "alreadyRemoved": not removal.removed,
            "seconds": round(removal.seconds, 1),
        }
    )
    return EXIT_OK


def _build(
    args: argparse.Namespace,
    env: dict[str, str],
    console: Console,
    redactor: Redactor,
    report: _Reporter,
    downloaders: Downloaders | None,
) -> int:
    started = time.monotonic()
    try:
        request = _request(args)
    except InvalidRequest as exc:
        console.err(f"error: {exc}")
        report({"result": "failed", "step": "arguments", "message": str(exc)})
        return EXIT_USAGE

    runner = Runner(redactor=redactor, echo=console.out)
    pipeline = Pipeline(
        request,
        environ=env,
        console=console,
        runner=runner,
        downloaders=downloaders,
        step_timeout=args.step_timeout,
        lock_timeout=args.lock_timeout,
    )
    if args.dry_run:
        pipeline.dry_run()
        return EXIT_OK

    try:
        with _sigterm_raises():
            outcome = pipeline.run()
    except BuildFailed as exc:
        header = f"{exc.step} failed: {exc.message}"
        console.out(f"error: {header}")
        report(
            {
                "result": "failed",
                "step": exc.step,
                "key": request.key,
                "message": _failure_message(exc.message, exc.tail),
            }
        )
        return EXIT_USAGE if exc.permanent else EXIT_FAILED
    except LockTimeout as exc:
        console.out(f"error: {exc}")
        report({"result": "failed", "step": "lock", "key": request.key, "message": str(exc)})
        return EXIT_LOCK_TIMEOUT
    except _Terminated:
        console.out(f"terminated by SIGTERM during {pipeline.current_step}; a rerun resumes")
        report(
            {
                "result": "failed",
                "step": pipeline.current_step,
                "key": request.key,
                "message": "terminated by SIGTERM",
            }
        )
        return EXIT_TERMINATED
    except Exception as exc:
        lines = traceback.format_exc().splitlines()
        for line in lines:
            console.out(line)
        report(
            {
                "result": "failed",
                "step": pipeline.current_step,
                "key": request.key,
                "message": _failure_message(f"internal error: {type(exc).__name__}: {exc}", lines),
            }
        )
        return EXIT_FAILED

    report(
        {
            "result": "ok",
            "key": request.key,
            "engineDir": str(outcome.engine_dir),
            "seconds": round(time.monotonic() - started, 1),
            "alreadyBuilt": outcome.already_built,
            # The operator records it; serving pods refuse an engine whose manifest differs.
            "manifestSha256": outcome.manifest_sha256,
        }
    )
    return EXIT_OK


def _request(args: argparse.Namespace) -> BuildRequest:
    missing = [
        flag
        for flag, value in (
            ("--precision", args.precision),
            ("--tensor-parallel-size", args.tensor_parallel_size),
            ("--max-batch-size", args.max_batch_size),
            ("--max-num-tokens", args.max_num_tokens),
        )
        if value is None
    ]
    if missing:
        raise InvalidRequest(f"a TensorRT-LLM engine build needs {', '.join(missing)}")
    return BuildRequest.create(
        key=args.key,
        cache_dir=args.cache_dir,
        variant=args.variant,
        model_uri=args.model_uri,
        revision=args.revision,
        precision=args.precision,
        tensor_parallel_size=args.tensor_parallel_size,
        max_batch_size=args.max_batch_size,
        max_num_tokens=args.max_num_tokens,
        gpu_arch=args.gpu_arch,
        work_dir=args.work_dir,
        pvc_root=args.pvc_root,
        kv_cache_type=args.kv_cache_type,
        smoothquant_alpha=args.smoothquant_alpha,
        smoothquant_per_token=args.smoothquant_per_token,
        smoothquant_per_channel=args.smoothquant_per_channel,
        companion_revisions=args.companion_revision,
        sha256_list=args.sha256_list,
        default_speaker_audio=args.default_speaker_audio,
        default_speaker_transcript=args.default_speaker_transcript,
    )


def _failure_message(header: str, tail: Sequence[str]) -> str:
    """The error first, then as much of the tool's last output as fits in 2 KiB."""
    header = termination.clip_bytes(header, termination.MESSAGE_MAX_BYTES // 2)
    if not tail:
        return header
    budget = termination.MESSAGE_MAX_BYTES - len(header.encode("utf-8")) - 1
    body = termination.tail_text(tail, max_lines=termination.MESSAGE_MAX_LINES - 1)
    return f"{header}\n{termination.clip_bytes(body, budget)}"
