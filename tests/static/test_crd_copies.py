"""The CRD is one file: its copies in the chart and in the operator package (for `render`) are
byte copies of ``crds/``."""

from __future__ import annotations

import pytest

from tests.conftest import CRD_DIR, REPO


@pytest.mark.parametrize(
    "copy",
    ["charts/cosyvoice-operator/crds", "operator/cosyvoice_operator/cli/crds"],
    ids=["chart", "render"],
)
def test_crd_copies_are_byte_copies_of_the_top_level_crds(copy: str) -> None:
    """The chart installs a copy; `render` checks manifests against a copy in the package."""
    top = {p.name: p.read_bytes() for p in sorted(CRD_DIR.glob("*.yaml"))}
    copied = {p.name: p.read_bytes() for p in sorted((REPO / copy).glob("*.yaml"))}
    assert top, f"no CRD in {CRD_DIR}"
    assert set(copied) == set(top), f"{copy}/ and crds/ list other files"
    for name, data in top.items():
        assert copied[name] == data, (
            f"{copy}/{name} differs from crds/{name}: cp crds/{name} {copy}/"
        )
