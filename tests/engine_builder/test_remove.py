"""``remove``: an engine and its build leftovers leave the cache, under the key's lock."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from cosyvoice_engine_builder import remove
from cosyvoice_engine_builder.manifest import verify_engine_dir
from tests.engine_builder.conftest import Builder, Result
from tests.engine_builder.test_lock import held, hold_until, lock_waits

# An operator content key (40 lowercase hex digits) and another one, whose files must stay.
KEY = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def _remove(builder: Builder, key: str = KEY, *extra: str) -> Result:
    return builder.run(["remove", "--key", key, "--cache-dir", str(builder.cache), *extra])


def _built(builder: Builder, key: str = KEY) -> Path:
    result = builder.build(key=key)
    assert result.code == 0, result.out + result.err
    assert verify_engine_dir(builder.cache / key, key).ok
    return builder.cache / key


def _failed_build(builder: Builder, key: str = KEY) -> None:
    """A build that stops at trtllm-build: its work dir stays, for a resumption."""
    assert builder.build(key=key, env_extra={"FAKE_FAIL": "trtllm-build"}).code == 1
    assert (builder.cache / ".work" / key / "steps").is_dir()


def test_removes_a_built_engine(builder: Builder) -> None:
    engine = _built(builder)
    builder.reset_calls()
    result = _remove(builder)
    assert result.code == 0, result.out + result.err
    assert builder.calls() == []  # no tool runs, no GPU needed
    assert not os.path.lexists(engine)
    assert not os.path.lexists(builder.cache / ".work" / KEY)
    # Only the engine's own files: the lock file stays (deleting one breaks the lock).
    assert (builder.cache / ".locks" / f"{KEY}.lock").is_file()
    assert not any(p.name.startswith(KEY) for p in (builder.cache / ".trash").iterdir())
    assert result.termination is not None
    assert result.termination["result"] == "ok"
    assert result.termination["key"] == KEY
    assert result.termination["removed"] == [KEY]
    assert result.termination["removedCount"] == 1
    assert result.termination["alreadyRemoved"] is False
    assert result.termination_raw is not None and "\n" not in result.termination_raw
    assert f"[remove] engine {KEY} in {builder.cache}" in result.out
    assert f"[remove] removed {engine} (engine)" in result.out
    assert "[remove] done: removed 1 path(s)" in result.out


def test_removing_twice_is_fine_and_says_so(builder: Builder) -> None:
    _built(builder)
    assert _remove(builder).code == 0
    again = _remove(builder)
    assert again.code == 0
    assert "nothing to remove" in again.out
    assert again.termination is not None
    assert again.termination["result"] == "ok"
    assert again.termination["alreadyRemoved"] is True
    assert again.termination["removed"] == []


def test_nothing_ever_built_is_nothing_to_remove(builder: Builder) -> None:
    builder.cache.mkdir()
    result = _remove(builder)
    assert result.code == 0
    assert "nothing to remove" in result.out
    assert result.termination is not None and result.termination["alreadyRemoved"] is True


def test_removes_the_leftovers_of_failed_builds_and_keeps_other_keys(builder: Builder) -> None:
    _failed_build(builder)
    other = _built(builder, OTHER)
    cache = builder.cache
    (cache / f"{KEY}.partial" / "llm").mkdir(parents=True)
    (cache / f"{KEY}.partial" / "llm" / "rank0.engine").write_text("half")
    (cache / ".trash").mkdir(exist_ok=True)
    (cache / ".trash" / f"{KEY}.20250301T120000000000").mkdir()
    (cache / ".trash" / f"{KEY}.20250301T120000000000" / "manifest.json").write_text("{}")
    (cache / ".trash" / f"{OTHER}.20250301T120000000000").mkdir()
    (cache / ".work" / OTHER / "steps").mkdir(parents=True)  # a rebuild of it under way

    result = _remove(builder)
    assert result.code == 0, result.out + result.err
    assert result.termination is not None
    assert result.termination["removed"] == [
        f"{KEY}.partial",
        f".work/{KEY}",
        f".trash/{KEY}.20250301T120000000000",
    ]
    for rel in result.termination["removed"]:
        assert not os.path.lexists(cache / rel)
    assert "(partial engine of an interrupted build)" in result.out
    assert "(work dir)" in result.out
    assert "(set aside by a build)" in result.out
    # The other key is untouched: its engine still verifies, its leftovers stay.
    assert verify_engine_dir(other, OTHER).ok
    assert (cache / ".work" / OTHER / "steps").is_dir()
    assert (cache / ".trash" / f"{OTHER}.20250301T120000000000").is_dir()


def test_a_build_after_remove_builds_again(builder: Builder) -> None:
    _built(builder)
    assert _remove(builder).code == 0
    builder.reset_calls()
    rebuilt = builder.build(key=KEY)
    assert rebuilt.code == 0
    assert rebuilt.termination is not None and rebuilt.termination["alreadyBuilt"] is False
    assert "trtllm-build" in builder.tools_called()


@pytest.mark.parametrize(
    "key",
    [
        KEY.upper(),  # the operator's keys are lowercase
        KEY[:20],  # too short (the build accepts it; remove does not)
        KEY + "8",  # too long
        KEY[:39] + "g",  # not hex
        "../" + KEY[3:],
        f"{KEY[:30]}.partial",
        "",
    ],
)
def test_refuses_a_key_that_is_not_a_content_key(builder: Builder, key: str) -> None:
    engine = _built(builder)
    before = sorted(p.relative_to(builder.cache) for p in builder.cache.rglob("*"))
    result = _remove(builder, key)
    assert result.code == 2
    assert result.termination is not None
    assert result.termination["result"] == "failed"
    assert result.termination["step"] == "arguments"
    assert "40 lowercase hex digits" in result.termination["message"]
    assert "40 lowercase hex digits" in result.err
    assert sorted(p.relative_to(builder.cache) for p in builder.cache.rglob("*")) == before
    assert verify_engine_dir(engine, KEY).ok


def test_a_missing_cache_dir_is_an_error_not_created(builder: Builder) -> None:
    result = _remove(builder)
    assert result.code == 2
    assert not builder.cache.exists()
    assert result.termination is not None
    assert result.termination["step"] == "arguments"
    assert "not a directory" in result.termination["message"]


def test_missing_arguments_are_a_usage_error(builder: Builder) -> None:
    result = builder.run(["remove", "--key", KEY])
    assert result.code == 2
    assert result.termination is not None and result.termination["step"] == "arguments"
    assert "--cache-dir" in result.termination["message"]


# ---- links never lead out of the cache -----------------------------------------------------


def _outside(builder: Builder) -> Path:
    outside = builder.tmp / "outside"
    (outside / "precious").mkdir(parents=True)
    (outside / "precious" / "data.bin").write_text("keep me")
    (outside / KEY).mkdir()
    (outside / KEY / "manifest.json").write_text("keep me too")
    return outside


def _intact(outside: Path) -> bool:
    return (outside / "precious" / "data.bin").read_text() == "keep me" and (
        outside / KEY / "manifest.json"
    ).read_text() == "keep me too"


def test_an_engine_entry_that_is_a_link_is_unlinked_not_followed(builder: Builder) -> None:
    outside = _outside(builder)
    builder.cache.mkdir()
    (builder.cache / KEY).symlink_to(outside / KEY, target_is_directory=True)
    (builder.cache / f"{KEY}.partial").symlink_to(outside / "precious")
    result = _remove(builder)
    assert result.code == 0, result.out + result.err
    assert not os.path.lexists(builder.cache / KEY)
    assert not os.path.lexists(builder.cache / f"{KEY}.partial")
    assert _intact(outside)


def test_links_inside_a_removed_engine_are_not_followed(builder: Builder) -> None:
    outside = _outside(builder)
    engine = _built(builder)
    (engine / "model" / "escape").symlink_to(outside / "precious", target_is_directory=True)
    (engine / "plans" / "escape.bin").symlink_to(outside / "precious" / "data.bin")
    assert _remove(builder).code == 0
    assert not os.path.lexists(engine)
    assert _intact(outside)


@pytest.mark.parametrize("name", [".work", ".trash", ".locks"])
def test_a_bookkeeping_dir_linked_out_of_the_cache_stops_everything(
    builder: Builder, name: str
) -> None:
    outside = _outside(builder)
    engine = _built(builder)
    real = builder.cache / name
    if real.exists():
        os.rename(real, builder.tmp / f"moved{name}")
    real.symlink_to(outside, target_is_directory=True)
    result = _remove(builder)
    assert result.code == 2
    assert result.termination is not None
    assert result.termination["step"] == "remove"
    assert "outside the cache dir" in result.termination["message"]
    assert _intact(outside)
    assert not (outside / f"{KEY}.lock").exists()  # not even the lock was taken there
    assert verify_engine_dir(engine, KEY).ok  # checked before anything was removed


# ---- the lock ------------------------------------------------------------------------------


def test_a_builder_holding_the_key_keeps_its_engine(builder: Builder) -> None:
    engine = _built(builder)
    with held(builder.cache / ".locks" / f"{KEY}.lock"):
        result = _remove(builder, KEY, "--lock-timeout", "1")
    assert result.code == 3
    assert verify_engine_dir(engine, KEY).ok
    assert result.termination is not None
    assert result.termination["step"] == "lock"
    assert "other-builder-pod pid 42" in result.termination["message"]
    assert "[lock] waiting for" in result.out


def test_remove_waits_for_the_builder_then_removes(
    builder: Builder, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _built(builder)
    waiting = lock_waits(monkeypatch, remove)
    thread, saw_waiter = hold_until(builder.cache / ".locks" / f"{KEY}.lock", waiting)
    result = _remove(builder)
    thread.join()
    assert saw_waiter == [True]  # the builder let go only once remove waited for it
    assert result.code == 0
    assert "[lock] waiting for" in result.out
    assert not os.path.lexists(engine)


def test_a_build_waits_for_remove(builder: Builder, monkeypatch: pytest.MonkeyPatch) -> None:
    # remove holds the very lock the build takes: while it deletes, no build of the key runs.
    _built(builder)
    seen: list[str] = []
    real_delete = remove._delete

    def delete_and_check(path: Path) -> None:
        lock = builder.cache / ".locks" / f"{KEY}.lock"
        fd = os.open(lock, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append(path.name)
        finally:
            os.close(fd)
        real_delete(path)

    monkeypatch.setattr(remove, "_delete", delete_and_check)
    assert _remove(builder).code == 0
    assert len(seen) == 1 and seen[0].startswith(f"{KEY}.")  # the engine, moved aside


# ---- atomicity and failures ----------------------------------------------------------------


def test_the_engine_disappears_whole_even_if_deleting_fails(
    builder: Builder, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _built(builder)

    def fail(path: Path) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(remove, "_delete", fail)
    crashed = _remove(builder)
    assert crashed.code == 1
    assert crashed.termination is not None
    assert crashed.termination["step"] == "remove"
    assert "Permission denied" in crashed.termination["message"]
    # Readers see no engine at all, not half of one; what is left is in .trash ...
    assert not os.path.lexists(engine)
    (aside,) = [p for p in (builder.cache / ".trash").iterdir() if p.name.startswith(KEY)]
    assert (aside / "manifest.json").is_file()

    monkeypatch.undo()
    # ... and the next remove of the key deletes it.
    rerun = _remove(builder)
    assert rerun.code == 0
    assert rerun.termination is not None
    assert rerun.termination["removed"] == [f".trash/{aside.name}"]
    assert not os.path.lexists(aside)


def test_the_termination_message_stays_small_with_many_leftovers(builder: Builder) -> None:
    trash = builder.cache / ".trash"
    trash.mkdir(parents=True)
    for i in range(150):
        (trash / f"{KEY}.2025030112{i:04d}{'0' * 40}").mkdir()
    result = _remove(builder)
    assert result.code == 0
    assert result.termination_raw is not None
    assert len(result.termination_raw.encode()) < 4096
    doc = json.loads(result.termination_raw)
    assert doc["removedCount"] == 150
    assert len(doc["removed"]) == 20
    assert not any(p.name.startswith(KEY) for p in trash.iterdir())
