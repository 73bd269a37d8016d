"""The docs' links and the tests they cite exist: every relative link of README.md and
docs/**/*.md resolves to a file or folder of the repository, and every test file a page names
in backticks (``tests/...py``, ``serving-models/tests/...py``, with ``::test_name`` when given)
is there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# [text](target) and ![alt](target), with an optional "title"; code blocks are left out.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]+`")
TEST_FILE = re.compile(r"`((?:serving-models/)?tests/[\w/.-]+\.(?:py|yaml))(?:::(\w+))?`")


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in paths]


def relative_links(text: str) -> list[str]:
    """The link targets of a Markdown page that point into the repository."""
    prose = CODE.sub("", FENCE.sub("", text))
    targets = []
    for target in LINK.findall(prose):
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor of the same page
        targets.append(target.split("#", 1)[0])
    return targets


def test_links_are_found_as_written() -> None:
    text = (
        '[a](docs/x.md) ![b](../y.png "t") [c](https://e.org/z) [d](#here) [e](f.md#sec)\n'
        "`[g](not/a/link.md)`\n```\n[h](in/code.md)\n```\n"
    )
    assert relative_links(text) == ["docs/x.md", "../y.png", "f.md"]


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = [t for t in relative_links(page.read_text()) if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(REPO)} links to missing paths: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_test_file_a_page_names_exists(page: Path) -> None:
    missing = []
    for path, name in TEST_FILE.findall(page.read_text()):
        file = REPO / path
        if not file.is_file():
            missing.append(path)
        elif name and not re.search(rf"^(async )?def {name}\b", file.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert not missing, f"{page.relative_to(REPO)} names tests that do not exist: {missing}"
