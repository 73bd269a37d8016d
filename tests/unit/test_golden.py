"""The golden-file helper: UPDATE_GOLDEN rewrites and fails, refuses under CI, and a golden
that already holds the text passes untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit import golden


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UPDATE_GOLDEN", raising=False)
    monkeypatch.delenv("CI", raising=False)


def test_a_difference_fails_and_writes_nothing_without_update_golden(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("old\n")
    with pytest.raises(AssertionError, match="differs from the golden file"):
        golden.check(path, "new\n")
    with pytest.raises(AssertionError, match="missing"):
        golden.check(tmp_path / "none.yaml", "new\n")
    assert path.read_text() == "old\n" and not (tmp_path / "none.yaml").exists()
    golden.check(path, "old\n")


def test_update_golden_rewrites_and_the_test_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UPDATE_GOLDEN", "1")
    path = tmp_path / "sub" / "a.yaml"
    with pytest.raises(pytest.fail.Exception, match=r"rewritten: .*a\.yaml; review the diff"):
        golden.check(path, "new\n")
    assert path.read_text() == "new\n"
    golden.check(path, "new\n")  # nothing to rewrite: it passes

    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "stale.pbtxt").write_text("x")
    (folder / "kept.pbtxt").write_text("same")
    (folder / "notes.txt").write_text("not a golden")
    with pytest.raises(pytest.fail.Exception, match=r"stale\.pbtxt") as failed:
        golden.sync_folder(folder, {"kept": "same", "new": "n"}, ".pbtxt")
    assert "kept.pbtxt" not in str(failed.value) and "new.pbtxt" in str(failed.value)
    assert sorted(p.name for p in folder.iterdir()) == ["kept.pbtxt", "new.pbtxt", "notes.txt"]
    golden.sync_folder(folder, {"kept": "same", "new": "n"}, ".pbtxt")


def test_update_golden_under_ci_fails_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UPDATE_GOLDEN", "1")
    monkeypatch.setenv("CI", "true")
    path = tmp_path / "a.yaml"
    with pytest.raises(pytest.fail.Exception, match="never in CI"):
        golden.check(path, "new\n")
    with pytest.raises(pytest.fail.Exception, match="never in CI"):
        golden.sync_folder(tmp_path / "repo", {"a": "b"}, ".pbtxt")
    assert list(tmp_path.iterdir()) == []
