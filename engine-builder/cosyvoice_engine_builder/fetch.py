"""Getting the model onto local disk.

- ``hf://ORG/NAME``: ``huggingface_hub.snapshot_download`` into ``<work>/model`` with
  ``--revision`` and ``HF_TOKEN`` (``HF_ENDPOINT`` is honoured by the library).
- ``s3://BUCKET/PATH``: ``aws s3 sync`` when the CLI is installed (``AWS_CLI``, default
  ``aws``), else boto3; both read ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
  ``AWS_REGION`` and ``AWS_ENDPOINT_URL`` (for S3-compatible stores) themselves.
- ``pvc://CLAIM/PATH``: nothing is copied; the Job mounts the claim at
  ``<pvc-root>/<CLAIM>`` and the model is read in place.

For upstream's published releases the companion repositories upstream's scripts download
too (the LLM as a Hugging Face checkpoint, CosyVoice3's fp16 estimator export) are fetched
into the same directory (:mod:`~cosyvoice_engine_builder.releases`), each at its pinned
commit where it has one.

Every Hugging Face repository is resolved to a commit first (``HfApi.model_info``) and
downloaded at that commit, so that what is recorded is what was fetched even while a branch
moves; the commits go to ``<work>/fetched.json`` and from there into the manifest. With
``--sha256-list`` every file the list names must then hash to its digest (a permanent
failure otherwise).

Errors that a retry cannot fix (no such repository, revision, bucket or prefix; a gated
repository or refused credentials) are permanent, so the Job fails at once and the service
says why instead of retrying a download that will never work.

The Hugging Face and S3 clients are injectable (:class:`Downloaders`) because neither
service is reachable from the test environment; their libraries are imported lazily
because they exist only in the builder image.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from cosyvoice_engine_builder.releases import Companion, companions, pinned_revision
from cosyvoice_engine_builder.request import BuildRequest
from cosyvoice_engine_builder.runner import Command, CommandFailed, Runner
from cosyvoice_engine_builder.toolchain import find_executable


class FetchError(Exception):
    """The model could not be fetched; the message says from where and why.

    ``permanent``: retrying cannot help (the path does not exist), as opposed to a
    download that may succeed next time.
    """

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


# Exceptions of huggingface_hub (by class name: the library exists only in the builder image)
# that mean the repository, revision or file does not exist for these credentials.
_HF_PERMANENT = {
    "RepositoryNotFoundError",
    "RevisionNotFoundError",
    "GatedRepoError",
    "DisabledRepoError",
    "EntryNotFoundError",
}
# huggingface_hub raises this one (a subclass of EntryNotFoundError) when the Hub could not
# be reached at all: timeouts, dropped connections, 5xx and 429. The entry may well exist;
# what it wraps, if anything, tells more.
_HF_UNREACHABLE = "LocalEntryNotFoundError"
# S3 error codes (botocore ClientError, or the AWS CLI's message) that a retry cannot fix.
_S3_PERMANENT = {
    "NoSuchBucket",
    "NoSuchKey",
    "AccessDenied",
    "AllAccessDisabled",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidBucketName",
    "403",
    "404",
}
_PERMANENT_HTTP = {401, 403, 404}


def is_permanent(exc: BaseException) -> bool:
    """Would retrying the same download fail the same way?"""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if _HF_UNREACHABLE in names:
        cause = exc.__cause__ or exc.__context__
        return cause is not None and is_permanent(cause)
    if names & _HF_PERMANENT or "NoCredentialsError" in names:
        return True
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int) and status in _PERMANENT_HTTP:
        return True
    if isinstance(response, dict):  # botocore ClientError
        code = str((response.get("Error") or {}).get("Code", ""))
        return code in _S3_PERMANENT
    return False


class HfSnapshotDownload(Protocol):
    def __call__(
        self, *, repo_id: str, revision: str | None, token: str | None, local_dir: str
    ) -> str: ...


class S3Client(Protocol):
    """The part of a boto3 S3 client the builder uses."""

    def get_paginator(self, operation_name: str) -> Any: ...

    def download_file(self, Bucket: str, Key: str, Filename: str) -> None: ...


class HfResolve(Protocol):
    """The commit a repository's revision ("" or None: the default branch) is at now."""

    def __call__(self, *, repo_id: str, revision: str | None, token: str | None) -> str: ...


@dataclass(frozen=True)
class Downloaders:
    hf_snapshot_download: HfSnapshotDownload | None = None
    s3_client_factory: Callable[[], S3Client] | None = None
    # Default: the Hub's own answer with the real download; none with a fake download (the
    # revisions are then recorded as asked, without a resolved commit).
    hf_resolve: HfResolve | None = None


def _real_hf_resolve(*, repo_id: str, revision: str | None, token: str | None) -> str:
    hub = importlib.import_module("huggingface_hub")
    return str(hub.HfApi().model_info(repo_id, revision=revision, token=token).sha)


def _real_hf_snapshot_download(
    *, repo_id: str, revision: str | None, token: str | None, local_dir: str
) -> str:
    hub = importlib.import_module("huggingface_hub")
    path = hub.snapshot_download(
        repo_id=repo_id, revision=revision, token=token, local_dir=local_dir
    )
    return str(path)


def _real_s3_client() -> S3Client:
    boto3 = importlib.import_module("boto3")
    client: S3Client = boto3.client("s3")
    return client


def model_dir(request: BuildRequest) -> Path:
    """Where the model will be (or is) on local disk, before anything is fetched."""
    if request.source.scheme == "pvc":
        base = request.pvc_root / request.source.authority
        return base / request.source.path if request.source.path else base
    return request.work_dir / "model"


def fetched_path(request: BuildRequest) -> Path:
    """Where the fetch writes what it fetched (repositories and their resolved commits)."""
    return request.work_dir / "fetched.json"


def read_fetched(request: BuildRequest) -> dict[str, Any]:
    """What the fetch recorded ({} when it recorded nothing: pvc://, s3://)."""
    try:
        data = json.loads(fetched_path(request).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def companion_plan(request: BuildRequest) -> list[tuple[Companion, str]]:
    """The companions to fetch and the commit each is pinned to ("" for none); a pin that
    names no companion of this release is refused (a typo must not go unpinned)."""
    found = companions(request.variant, request.source)
    known = {c.uri.lower() for c in found}
    for uri, _ in request.companion_revisions:
        if uri not in known:
            raise FetchError(
                f"--companion-revision {uri}: not a companion repository of "
                f"{request.source.uri} ({', '.join(sorted(known)) or 'it has none'})",
                permanent=True,
            )
    return [(c, pinned_revision(c, request.companion_revisions)) for c in found]


def describe(request: BuildRequest, environ: Mapping[str, str]) -> str:
    """A human-readable account of what fetching will do (for logs and the dry run)."""
    source, target = request.source, model_dir(request)
    revision = request.revision or None
    if source.scheme == "hf":
        text = _describe_hf(source.authority, revision, target)
        for extra in companions(request.variant, source):
            pin = pinned_revision(extra, request.companion_revisions) or None
            text += (
                f"; then, for {extra.what}, "
                f"{_describe_hf(extra.source.authority, pin, target / extra.into)}"
            )
        return text
    if source.scheme == "s3":
        aws = environ.get("AWS_CLI") or "aws"
        if find_executable(aws, environ) is not None:
            return Command(_aws_sync_argv(aws, request, target)).display()
        return f"boto3 download of {source.uri}/ into {target}"
    return f"use {target} in place (claim {source.authority!r} mounted at {request.pvc_root})"


def _describe_hf(repo_id: str, revision: str | None, target: Path) -> str:
    return (
        f"huggingface_hub.snapshot_download(repo_id={repo_id!r}, "
        f"revision={revision!r}, local_dir={str(target)!r})"
    )


def _aws_sync_argv(aws: str, request: BuildRequest, target: Path) -> tuple[str, ...]:
    return (aws, "s3", "sync", f"{request.source.uri}/", str(target), "--no-progress")


def fetch_model(
    request: BuildRequest,
    *,
    downloaders: Downloaders,
    runner: Runner,
    environ: Mapping[str, str],
    echo: Callable[[str], None],
    timeout: float | None = None,
) -> Path:
    """Make the model available locally and return its directory."""
    target = model_dir(request)
    scheme = request.source.scheme
    if scheme != "hf" and request.revision:
        echo(f"note: --revision {request.revision!r} is recorded but not used for {scheme}://")
    if scheme == "pvc":
        if not target.is_dir():
            mount = request.pvc_root / request.source.authority
            raise FetchError(
                f"{request.source.uri}: {target} does not exist; is the claim "
                f"{request.source.authority!r} mounted at {mount} and does the path exist in it?",
                permanent=True,
            )
        return target

    target.mkdir(parents=True, exist_ok=True)
    if scheme == "hf":
        download = downloaders.hf_snapshot_download or _real_hf_snapshot_download
        resolve = downloaders.hf_resolve or (
            _real_hf_resolve if downloaders.hf_snapshot_download is None else None
        )
        token = environ.get("HF_TOKEN") or environ.get("HUGGING_FACE_HUB_TOKEN") or None
        plan = companion_plan(request)
        resolved = _hf_fetch(download, resolve, request.source.uri, request.revision, token, target)
        fetched: dict[str, Any] = {
            "uri": request.source.uri,
            "revision": request.revision,
            "resolvedRevision": resolved,
            "companions": [],
        }
        for extra, pin in plan:
            echo(f"{request.source.uri} is an upstream release: also fetching {extra.what}")
            got = _hf_fetch(download, resolve, extra.uri, pin, token, target / extra.into, extra)
            if not pin:
                echo(
                    f"note: {extra.uri} is not pinned to a commit: fetched at its default branch"
                    + (f", commit {got}" if got else "")
                    + " (pin it with --companion-revision)"
                )
            fetched["companions"].append(
                {"uri": extra.uri, "into": extra.into, "revision": pin, "resolvedRevision": got}
            )
        _write_fetched(request, fetched)
        verify_sha256_list(request, target)
        return target

    aws = environ.get("AWS_CLI") or "aws"
    if downloaders.s3_client_factory is None and find_executable(aws, environ) is not None:
        try:
            runner.run(Command(_aws_sync_argv(aws, request, target), env=environ, timeout=timeout))
        except CommandFailed as exc:
            detail = "\n".join(exc.tail()[-10:])
            raise FetchError(
                f"aws s3 sync from {request.source.uri} failed: {exc}\n{detail}",
                permanent=any(f"({code})" in detail for code in _S3_PERMANENT),
            ) from exc
    else:
        _boto3_download(request, target, downloaders.s3_client_factory or _real_s3_client, echo)
    if not any(target.iterdir()):
        # The listing itself succeeded (S3 is strongly consistent): the path is wrong.
        raise FetchError(f"{request.source.uri}/ is empty or does not exist", permanent=True)
    verify_sha256_list(request, target)
    return target


def _write_fetched(request: BuildRequest, fetched: Mapping[str, Any]) -> None:
    path = fetched_path(request)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(fetched, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


_SHA256_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")


def verify_sha256_list(request: BuildRequest, target: Path) -> None:
    """Every file ``--sha256-list`` names (sha256sum's format, paths relative to the model
    directory) hashes to its digest; a permanent failure otherwise. Files it does not name
    are not checked: the list says what matters."""
    if request.sha256_list is None:
        return
    try:
        lines = request.sha256_list.read_text().splitlines()
    except OSError as exc:
        raise FetchError(f"--sha256-list {request.sha256_list}: {exc}", permanent=True) from exc
    checked = 0
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = _SHA256_LINE.match(line)
        rel = match.group(2) if match else ""
        parts = PurePosixPath(rel).parts
        if not match or rel.startswith("/") or ".." in parts:
            raise FetchError(
                f"--sha256-list {request.sha256_list}:{number}: expected '<sha256>  <relative "
                f"path>' (sha256sum's format) without '..', got {line[:120]!r}",
                permanent=True,
            )
        path = target.joinpath(*parts)
        if not path.is_file():
            raise FetchError(
                f"{rel}: listed in --sha256-list but not in the fetched model", permanent=True
            )
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != match.group(1).lower():
            raise FetchError(
                f"{rel}: sha256 {digest.hexdigest()} is not the {match.group(1).lower()} "
                "--sha256-list expects: refusing to build from it",
                permanent=True,
            )
        checked += 1
    if checked == 0:
        raise FetchError(f"--sha256-list {request.sha256_list} lists no file", permanent=True)


def _hf_fetch(
    download: HfSnapshotDownload,
    resolve: HfResolve | None,
    uri: str,
    revision: str,
    token: str | None,
    target: Path,
    companion: Companion | None = None,
) -> str:
    """Download ``uri`` at ``revision`` into ``target``; the commit it resolved to ("" when
    there is no resolver)."""
    target.mkdir(parents=True, exist_ok=True)
    repo_id = uri.removeprefix("hf://")
    commit = ""
    try:
        if resolve is not None:
            commit = resolve(repo_id=repo_id, revision=revision or None, token=token)
            if not re.fullmatch(r"[0-9a-f]{40}", commit):
                raise FetchError(f"{uri}: the Hub answered {commit[:60]!r}, not a commit")
        download(
            repo_id=repo_id,
            revision=commit or revision or None,
            token=token,
            local_dir=str(target),
        )
    except FetchError:
        raise
    except Exception as exc:
        permanent = is_permanent(exc)
        hint = ""
        if permanent and not token:
            hint = " (no HF_TOKEN was given: a private or gated repository needs one)"
        role = f" ({companion.what})" if companion else ""
        raise FetchError(
            f"download of {uri}{'@' + revision if revision else ''}{role} failed: "
            f"{type(exc).__name__}: {exc}{hint}",
            permanent=permanent,
        ) from exc
    return commit


def _boto3_download(
    request: BuildRequest,
    target: Path,
    client_factory: Callable[[], S3Client],
    echo: Callable[[str], None],
) -> None:
    bucket, prefix = request.source.authority, request.source.path
    listing_prefix = f"{prefix}/" if prefix else ""
    try:
        client = client_factory()
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=listing_prefix
        )
        count = 0
        for page in pages:
            for obj in page.get("Contents", []):
                key = str(obj["Key"])
                rel = key[len(listing_prefix) :]
                if not rel or rel.endswith("/"):
                    continue
                parts = PurePosixPath(rel).parts
                if ".." in parts or rel.startswith("/"):
                    raise FetchError(
                        f"s3://{bucket}/{key}: refusing a key that leaves {target}", permanent=True
                    )
                dest = target.joinpath(*parts)
                # A retry after a crash keeps what already arrived whole.
                if dest.is_file() and dest.stat().st_size == int(obj.get("Size", -1)):
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(dest.name + ".part")
                client.download_file(bucket, key, str(tmp))
                tmp.replace(dest)
                count += 1
                if count % 20 == 0:
                    echo(f"downloaded {count} objects")
    except FetchError:
        raise
    except Exception as exc:
        raise FetchError(
            f"download of {request.source.uri}/ failed: {type(exc).__name__}: {exc}",
            permanent=is_permanent(exc),
        ) from exc
