"""Issue 21 M6: the build reports the sha256 of the manifest it wrote (the operator records it,
tests/unit/plan/test_manifest_digest.py), and a serving pod given it (``--manifest-sha256``)
refuses, with exit 3 and one message, a manifest or a listed file changed since the build,
even at the same size (without it only sizes are checked, as before)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.engine_builder.conftest import KEY, Builder
from tests.engine_builder.test_serve import Pod, pod  # noqa: F401  (the fixture)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_build_reports_the_digest_of_the_manifest_it_wrote_and_a_rerun_the_same(
    builder: Builder,
) -> None:
    first = builder.build()
    assert first.code == 0, first.out
    assert first.termination is not None
    written = _sha256(builder.engine_dir / "manifest.json")
    assert first.termination["manifestSha256"] == written
    again = builder.build()
    assert again.termination is not None and again.termination["alreadyBuilt"] is True
    assert again.termination["manifestSha256"] == written


def _digest(serving: Pod) -> str:
    return _sha256(serving.builder.cache / KEY / "manifest.json")


def test_the_recorded_digest_lets_an_untouched_engine_start(pod: Pod) -> None:  # noqa: F811
    result = pod.run(pod.argv(dry_run=True, manifest_sha256=_digest(pod)))
    assert result.code == 0, result.err
    assert "[gate] ok" in result.out


def test_a_manifest_changed_after_the_build_is_refused_before_anything_runs(
    pod: Pod,  # noqa: F811
) -> None:
    recorded = _digest(pod)
    manifest_path = pod.builder.cache / KEY / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    # Another build on the claim rewrites the manifest to list its own files' digests.
    for entry in manifest["files"]:
        entry["sha256"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    result = pod.run(pod.argv(manifest_sha256=recorded))
    assert result.code == 3, result.out + result.err
    assert result.termination is not None
    assert result.termination["reason"] == "EngineModified"
    message = str(result.termination["message"])
    assert message.startswith(
        f"engine {KEY}: {manifest_path} has sha256 {_digest(pod)}, but its build wrote one "
        f"of sha256 {recorded} (the engine record's manifestSha256): the manifest was "
        "changed after the build"
    )
    assert f"tts.cosyvoice.dev/engine-key={KEY}" in message
    assert result.err.strip() == f"error: {message}"
    assert pod.calls() == []  # not even nvidia-smi: no server, no repository
    assert not pod.repository.exists()


def test_a_file_changed_at_the_same_size_is_found_only_with_the_digest(
    pod: Pod,  # noqa: F811
) -> None:
    recorded = _digest(pod)
    plan = next((pod.builder.cache / KEY / "plans").iterdir())
    data = plan.read_bytes()
    plan.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # same size, other bytes
    # Sizes alone (a record from before the digest) cannot see it.
    assert pod.run(pod.argv(dry_run=True)).code == 0
    result = pod.run(pod.argv(manifest_sha256=recorded))
    assert result.code == 3
    assert result.termination is not None
    assert result.termination["reason"] == "EngineIncompatible"
    assert result.termination["mismatches"] == ["files"]
    assert f"plans/{plan.name} (sha256 differs from the build's)" in result.termination["message"]


def test_a_malformed_digest_is_a_usage_error(pod: Pod) -> None:  # noqa: F811
    result = pod.run(pod.argv(manifest_sha256="$(id)"))
    assert result.code == 2
    assert "--manifest-sha256: '$(id)': not a sha256" in result.err
