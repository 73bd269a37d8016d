"""The command line of ``cosyvoice-serve``: its flags, their defaults, and :class:`ServeOptions`.

Everything the operator can pass to a serving pod is declared here, once, for both entry
points (``cosyvoice-serve``, :func:`build_parser`, and the ``cosyvoice-engine-builder serve``
alias, :func:`add_arguments`), together with
the checks that need no file system: ports that collide, GPU groups that overlap, keys that
are not keys. :data:`DEFAULT_MODEL_VIEW` is the ``--model-view`` default that the operator's
``model_dir`` parameters point at.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from cosyvoice_engine_builder import __version__
from cosyvoice_engine_builder.request import InvalidRequest, Variant, validate_key
from cosyvoice_engine_builder.serving.exit_codes import ConfigError
from cosyvoice_engine_builder.usage import RaisingParser

PROG = "cosyvoice-serve"

DEFAULT_MODEL_CODE = Path("/opt/cosyvoice/models")
DEFAULT_MODEL_REPOSITORY = Path("/tmp/model_repository")
DEFAULT_MODEL_VIEW = Path("/tmp/model_view")
# Upstream's run_cosyvoice3.sh gives the LLM 40% of the free GPU memory for its KV cache;
# the rest is for the token2wav, vocoder and tokenizer models sharing the GPU.
DEFAULT_KV_CACHE_FRACTION = 0.4
DEFAULT_LLM_STARTUP_SECONDS = 600.0
# Triton's own default for --exit-timeout-secs.
DEFAULT_EXIT_TIMEOUT_SECONDS = 30
# How long a SIGTERM'd pod keeps Triton serving the streams in flight (the operator renders
# its drain setting here, and the grace period around it).
DEFAULT_DRAIN_SECONDS = 120
# A stream's chunks come a few seconds apart at most (each one an inference of token2wav or
# the vocoder, which Triton counts); a minute without any while work is in flight is a stub
# that hangs (docs/concepts/draining-and-stub-health.md).
DEFAULT_STALL_SECONDS = 60
# The supervisor's own readiness endpoint (GET /ready), which the rendered probes use.
DEFAULT_HEALTH_PORT = 8003


_GPU_INDEX_RE = re.compile(r"^[0-9]{1,3}$")


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text}: not a TCP port")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 0")
    return value


_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _sha256(text: str) -> str:
    if not _SHA256_RE.match(text):
        raise argparse.ArgumentTypeError(f"{text!r}: not a sha256 (64 lowercase hex digits)")
    return text


def _positive_seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be > 0")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be between 0 and 1")
    return value


def parse_llm_groups(text: str) -> tuple[tuple[str, ...], ...]:
    """``"0,1;2,3"`` -> ``(("0", "1"), ("2", "3"))``: one group of GPU indices per LLM."""
    groups: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for raw in text.split(";"):
        group = tuple(part.strip() for part in raw.split(","))
        if not all(_GPU_INDEX_RE.match(index) for index in group):
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected GPU indices, comma-separated within a group and "
                "';' between groups, e.g. '0,1;2,3'"
            )
        repeated = sorted(seen.intersection(group)) or sorted(
            i for i, n in Counter(group).items() if n > 1
        )
        if repeated:
            raise argparse.ArgumentTypeError(
                f"{text!r}: GPU {', '.join(repeated)} is in more than one place"
            )
        seen.update(group)
        groups.append(group)
    return tuple(groups)


def build_parser() -> argparse.ArgumentParser:
    """``cosyvoice-serve``'s parser; ``cosyvoice-engine-builder serve`` adds the same flags."""
    parser = RaisingParser(
        prog=PROG,
        description="The serving container: check the engine against this pod, assemble "
        "Triton's model repository, then run the LLM servers and Triton.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of ``cosyvoice-serve``, in the order ``--help`` lists them."""
    _add_paths(parser)
    _add_ports_and_llm_servers(parser)
    parser.add_argument(
        "--exit-timeout-seconds",
        type=_non_negative_int,
        default=DEFAULT_EXIT_TIMEOUT_SECONDS,
        help="tritonserver --exit-timeout-secs: how long Triton may take to stop once the "
        "drain is over",
    )
    parser.add_argument(
        "--drain-seconds",
        type=_non_negative_int,
        default=DEFAULT_DRAIN_SECONDS,
        help="after SIGTERM: answer not-ready, refuse new streams and keep Triton serving "
        "the streams in flight for at most this long (until the orchestrators' "
        "cosyvoice_active_streams gauge is 0), then stop Triton",
    )
    parser.add_argument(
        "--stall-seconds",
        type=_non_negative_int,
        default=DEFAULT_STALL_SECONDS,
        help="a stream in flight (or a request queued) while no model of Triton completes "
        "an inference for this long is a wedged stub: not ready, Triton restarted "
        "(0: never)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the checks and the commands; start nothing"
    )


def _add_paths(parser: argparse.ArgumentParser) -> None:
    """The engine, what it must be, and where the repository and the model view go."""
    parser.add_argument(
        "--engine-dir", required=True, type=Path, help="the engine of one key, e.g. /engines/KEY"
    )
    parser.add_argument("--key", required=True, help="the engine key the operator expects there")
    parser.add_argument(
        "--manifest-sha256",
        type=_sha256,
        default=None,
        help="the sha256 of the engine's manifest.json as its build wrote it (the operator "
        "passes its engine record's); given, any other manifest is refused (exit 3) and "
        "every listed file is hashed against it, not only sized",
    )
    parser.add_argument("--variant", required=True, choices=[v.value for v in Variant])
    parser.add_argument(
        "--repository-config",
        required=True,
        type=Path,
        help="directory of <model>.pbtxt files (each one model's config.pbtxt)",
    )
    parser.add_argument(
        "--model-code",
        type=Path,
        default=DEFAULT_MODEL_CODE,
        help="upstream's model code in the image: DIR/<variant>/<model>/1/model.py",
    )
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=DEFAULT_MODEL_REPOSITORY,
        help="writable directory where Triton's model repository is assembled",
    )
    parser.add_argument(
        "--model-view",
        type=Path,
        default=DEFAULT_MODEL_VIEW,
        help="writable directory presenting the engine's model directory, with its prebuilt "
        "plans under upstream's names; the models' model_dir parameter points here",
    )


def _add_ports_and_llm_servers(parser: argparse.ArgumentParser) -> None:
    """Triton's ports, and the LLM servers beside it (either runtime)."""
    parser.add_argument("--http-port", type=_port, default=8000)
    parser.add_argument("--grpc-port", type=_port, default=8001)
    parser.add_argument("--metrics-port", type=_port, default=8002)
    parser.add_argument(
        "--health-port",
        type=_port,
        default=DEFAULT_HEALTH_PORT,
        help="this command's GET /ready: Triton ready and the pod not draining",
    )
    parser.add_argument(
        "--llm-groups",
        type=parse_llm_groups,
        default=None,
        help="cosyvoice3: GPU groups, one trtllm-serve each, e.g. '0,1;2,3' "
        "(default: the first tensor-parallel-size GPUs)",
    )
    parser.add_argument(
        "--llm-base-port", type=_port, default=8010, help="trtllm-serve i listens on base+i"
    )
    parser.add_argument(
        "--llm-kv-cache-free-gpu-memory-fraction",
        type=_fraction,
        default=DEFAULT_KV_CACHE_FRACTION,
        help="trtllm-serve's --kv_cache_free_gpu_memory_fraction (upstream: 0.4)",
    )
    parser.add_argument(
        "--llm-startup-timeout-seconds",
        type=_positive_seconds,
        default=DEFAULT_LLM_STARTUP_SECONDS,
        help="how long every trtllm-serve may take to answer /health",
    )


@dataclass(frozen=True)
class ServeOptions:
    engine_dir: Path
    key: str
    variant: Variant
    repository_config: Path
    model_code: Path
    model_repository: Path
    model_view: Path
    http_port: int
    grpc_port: int
    metrics_port: int
    llm_groups: tuple[tuple[str, ...], ...] | None
    llm_base_port: int
    kv_cache_fraction: float
    llm_startup_timeout: float
    exit_timeout_seconds: int
    dry_run: bool
    manifest_sha256: str = ""
    health_port: int = DEFAULT_HEALTH_PORT
    drain_seconds: int = DEFAULT_DRAIN_SECONDS
    stall_seconds: int = DEFAULT_STALL_SECONDS

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeOptions:
        try:
            key = validate_key(args.key)
        except InvalidRequest as exc:
            raise ConfigError(str(exc)) from exc
        options = cls(
            engine_dir=args.engine_dir,
            key=key,
            variant=Variant(args.variant),
            repository_config=args.repository_config,
            model_code=args.model_code,
            model_repository=args.model_repository,
            model_view=args.model_view,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
            llm_groups=args.llm_groups,
            llm_base_port=args.llm_base_port,
            kv_cache_fraction=args.llm_kv_cache_free_gpu_memory_fraction,
            llm_startup_timeout=args.llm_startup_timeout_seconds,
            exit_timeout_seconds=args.exit_timeout_seconds,
            dry_run=args.dry_run,
            manifest_sha256=args.manifest_sha256 or "",
            health_port=args.health_port,
            drain_seconds=args.drain_seconds,
            stall_seconds=args.stall_seconds,
        )
        options.check_ports()
        return options

    @property
    def serves_llm(self) -> bool:
        """cosyvoice3 runs its LLM beside Triton (trtllm-serve); cosyvoice2 has it in a Triton
        backend."""
        return self.variant is Variant.COSYVOICE3

    def check_ports(self) -> None:
        triton = {
            "--http-port": self.http_port,
            "--grpc-port": self.grpc_port,
            "--metrics-port": self.metrics_port,
            "--health-port": self.health_port,
        }
        if len(set(triton.values())) < len(triton):
            raise ConfigError(f"Triton's ports must differ: {triton}")
        if self.serves_llm:
            llm = {self.llm_base_port + i for i in range(len(self.llm_groups or ((),)))}
            if max(llm) > 65535:
                raise ConfigError(f"--llm-base-port {self.llm_base_port}: ports run past 65535")
            clash = sorted(llm.intersection(triton.values()))
            if clash:
                raise ConfigError(
                    f"trtllm-serve ports {sorted(llm)} (--llm-base-port + group index) "
                    f"collide with Triton's port {clash[0]}"
                )
