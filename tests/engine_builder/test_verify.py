"""`verify`: only a complete, digest-valid engine for the right key counts as done."""

from __future__ import annotations

import json
import shutil

import pytest

from cosyvoice_engine_builder import cli
from cosyvoice_engine_builder.manifest import verify_engine_dir
from tests.engine_builder.conftest import KEY, Builder


@pytest.fixture
def built(builder: Builder) -> Builder:
    assert builder.build().code == 0
    return builder


def _verify(builder: Builder, key: str = KEY) -> tuple[int, str, str]:
    builder.readouterr()
    code = cli.main(
        ["verify", "--cache-dir", str(builder.cache), "--key", key], environ=builder.env
    )
    captured = builder.readouterr()
    return code, captured.out, captured.err


def test_verify_accepts_a_fresh_engine_and_prints_its_manifest(built: Builder) -> None:
    code, out, _ = _verify(built)
    assert code == 0
    assert json.loads(out) == built.manifest()


def test_verify_detects_a_corrupted_file(built: Builder) -> None:
    engine = built.engine_dir / "llm" / "rank0.engine"
    data = bytearray(engine.read_bytes())
    data[0] ^= 0xFF  # same size, different bytes: only the digest can tell
    engine.write_bytes(bytes(data))
    code, _, err = _verify(built)
    assert code == 1
    assert "llm/rank0.engine: sha256 does not match" in err


def test_verify_detects_a_truncated_file(built: Builder) -> None:
    plan = next((built.engine_dir / "plans").iterdir())
    plan.write_bytes(plan.read_bytes()[:3])
    code, _, err = _verify(built)
    assert code == 1
    assert f"plans/{plan.name}: size 3" in err


def test_verify_detects_a_missing_file(built: Builder) -> None:
    (built.engine_dir / "model" / "flow.pt").unlink()
    code, _, err = _verify(built)
    assert code == 1
    assert "model/flow.pt: missing" in err
    assert built.termination_path.exists()
    message = json.loads(built.termination_path.read_text())
    assert message["result"] == "failed" and message["step"] == "verify"
    assert "model/flow.pt" in message["message"]


def test_verify_detects_a_key_mismatch(built: Builder) -> None:
    other = "fedcba9876543210fedc"
    shutil.copytree(built.engine_dir, built.cache / other)
    code, _, err = _verify(built, other)
    assert code == 1
    assert f"is for key '{KEY}', not '{other}'" in err


def test_a_directory_without_manifest_is_not_done(built: Builder) -> None:
    (built.engine_dir / "manifest.json").unlink()
    code, _, err = _verify(built)
    assert code == 1
    assert "manifest.json is missing" in err
    # ... and the builder does not take it for done either: it rebuilds.
    built.reset_calls()
    assert built.build().code == 0
    assert built.tools_called() == ["convert", "trtllm-build", "trtexec", "trtexec"]


def test_a_partial_directory_is_not_done(built: Builder) -> None:
    partial = built.cache / f"{KEY}.partial"
    built.engine_dir.rename(partial)
    assert not verify_engine_dir(built.engine_dir, KEY).ok
    code, _, _ = _verify(built)
    assert code == 1
    # `<key>.partial` is not even a valid key, so it can never be verified as one.
    code, _, err = _verify(built, f"{KEY}.partial")
    assert code == 2
    assert "--key" in err


def test_manifest_entries_cannot_point_outside_the_engine(built: Builder) -> None:
    manifest = built.manifest()
    manifest["files"].append({"path": "../outside", "sha256": "0" * 64, "size": 0})
    (built.engine_dir / "manifest.json").write_text(json.dumps(manifest))
    result = verify_engine_dir(built.engine_dir, KEY)
    assert not result.ok
    assert any("invalid file entry" in p for p in result.problems)


def test_unparseable_manifest_is_invalid(built: Builder) -> None:
    (built.engine_dir / "manifest.json").write_text("{not json")
    assert not verify_engine_dir(built.engine_dir, KEY).ok
    code, _, err = _verify(built)
    assert code == 1 and "unreadable" in err


def test_verify_of_an_absent_engine(builder: Builder) -> None:
    code, _, err = _verify(builder)
    assert code == 1
    assert "does not exist" in err
