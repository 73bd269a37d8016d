"""The manifest that turns a directory of files into a usable engine, and its check.

``manifest.json`` is written last, after every file it lists is on disk and synced, so
its presence means the build finished; its digests let anyone (the next builder, a
serving pod's init container) prove the files are the ones that were built, for the key
that was asked for.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from cosyvoice_engine_builder.layout import MANIFEST_NAME

SCHEMA_VERSION = 1
_CHUNK = 8 * 1024 * 1024


def sha256_file(path: Path, *, sync: bool = False) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
        if sync:
            # The tools that wrote these files never fsync; hashing reads every byte
            # anyway, so this is where they are made durable before the manifest says so.
            os.fsync(handle.fileno())
    return digest.hexdigest()


def _walk_files(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            yield Path(dirpath) / name


def file_entries(root: Path, *, sync: bool = False) -> list[dict[str, Any]]:
    """One entry per regular file under ``root`` (the manifest itself excluded), sorted by
    path (os.walk lists a directory's files before its subdirectories, which is not path order
    once a file name sorts after a subdirectory's, e.g. model/speech_tokenizer_v2.onnx after
    model/llm/)."""
    entries: list[dict[str, Any]] = []
    for path in sorted(_walk_files(root), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST_NAME:
            continue
        entries.append(
            {"path": rel, "sha256": sha256_file(path, sync=sync), "size": path.stat().st_size}
        )
    return entries


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    """The manifest document exactly as it is written to ``manifest.json``."""
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8")


def write_manifest(directory: Path, manifest: dict[str, Any]) -> str:
    """Write ``manifest.json`` last, synced; returns the sha256 of the bytes written (the
    digest the operator records and serving pods check, issue 21 M6)."""
    data = manifest_bytes(manifest)
    tmp = directory / f".{MANIFEST_NAME}.tmp"
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, directory / MANIFEST_NAME)
    for dirpath, _, _ in os.walk(directory):
        fsync_dir(Path(dirpath))
    return hashlib.sha256(data).hexdigest()


@dataclass
class Verification:
    engine_dir: Path
    problems: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    # The sha256 of the manifest's bytes as they were read and checked ("" if unreadable).
    manifest_sha256: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems and self.manifest is not None


def _safe_member(rel: object) -> bool:
    if not isinstance(rel, str) or not rel:
        return False
    pure = PurePosixPath(rel)
    return not pure.is_absolute() and ".." not in pure.parts and rel != MANIFEST_NAME


def verify_engine_dir(engine_dir: Path, key: str) -> Verification:
    """Check that ``engine_dir`` holds a complete engine for ``key``, byte for byte."""
    result = Verification(engine_dir)
    manifest_path = engine_dir / MANIFEST_NAME
    if not engine_dir.is_dir():
        result.problems.append(f"{engine_dir} does not exist")
        return result
    try:
        raw = manifest_path.read_bytes()
        data = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        result.problems.append(f"{manifest_path} is missing: the build never completed here")
        return result
    except (OSError, ValueError) as exc:
        result.problems.append(f"{manifest_path} is unreadable: {exc}")
        return result
    # One read: the digest is of the very bytes whose file list is checked below.
    result.manifest_sha256 = hashlib.sha256(raw).hexdigest()
    if not isinstance(data, dict):
        result.problems.append(f"{manifest_path} is not a JSON object")
        return result
    if data.get("schemaVersion") != SCHEMA_VERSION:
        result.problems.append(
            f"{manifest_path}: schemaVersion {data.get('schemaVersion')!r}, "
            f"expected {SCHEMA_VERSION}"
        )
    if data.get("key") != key:
        result.problems.append(f"{manifest_path} is for key {data.get('key')!r}, not {key!r}")
    files = data.get("files")
    if not isinstance(files, list) or not files:
        result.problems.append(f"{manifest_path} lists no files")
        files = []
    for entry in files:
        if not isinstance(entry, dict) or not _safe_member(entry.get("path")):
            result.problems.append(f"{manifest_path}: invalid file entry {entry!r}")
            continue
        path = engine_dir / str(entry["path"])
        if not path.is_file():
            result.problems.append(f"{entry['path']}: missing")
            continue
        size = path.stat().st_size
        if size != entry.get("size"):
            result.problems.append(
                f"{entry['path']}: size {size}, manifest says {entry.get('size')}"
            )
            continue
        if sha256_file(path) != entry.get("sha256"):
            result.problems.append(f"{entry['path']}: sha256 does not match the manifest")
    result.manifest = data
    return result
