"""docs/reference's generated pages (cosyvoice_operator.cli.reference_docs) are what the code,
the CRD and the chart say now, and the generator finds what it claims to find."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from cosyvoice_operator.cli import reference_docs as ref
from tests.conftest import REPO


@pytest.mark.parametrize("page", ["crd.md", "cli.md", "metrics.md"])
def test_the_committed_page_is_what_the_generator_writes_now(page: str) -> None:
    generated = ref.pages()[ref.REFERENCE / page]
    committed = (REPO / "docs" / "reference" / page).read_text()
    assert committed == generated, (
        f"docs/reference/{page} is stale: run .venv/bin/python tools/gen_reference.py"
    )


def _leaf_paths(schema: dict[str, Any], path: str) -> list[str]:
    props = schema.get("properties") or {}
    items = schema.get("items") or {}
    if not props and not items.get("properties"):
        return [path]
    found: list[str] = []
    for name, sub in props.items():
        found += _leaf_paths(sub, f"{path}.{name}")
    for name, sub in (items.get("properties") or {}).items():
        found += _leaf_paths(sub, f"{path}[].{name}")
    return found


def test_the_crd_page_has_a_row_for_every_leaf_field_and_every_rule() -> None:
    [crd] = ref.load_crds()
    whole = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema = whole["properties"]
    page = ref.crd_page([crd])
    leaves = _leaf_paths(schema["spec"], "spec") + _leaf_paths(schema["status"], "status")
    assert len(leaves) > 50
    for path in leaves:
        assert f"| `{path}`" in page, path
    # Every CEL rule once, the object's own (metadata.name) included.
    rules = len(re.findall(r"^\s*(?:- )?rule: ", yaml.safe_dump(whole), re.M))
    assert rules > 1
    assert len(re.findall(r"^\| `[^`]+` \| `", page, re.M)) == rules


def test_every_alert_of_the_template_is_listed_with_its_defaults() -> None:
    template = (ref.CHART / "templates" / "prometheusrule.yaml").read_text()
    values = yaml.safe_load((ref.CHART / "values.yaml").read_text())
    alerts = ref.chart_alerts(template, values)
    assert [a["alert"] for a in alerts] == re.findall(r"- alert: (\w+)", template)
    for a in alerts:
        key = a["values"].rsplit(".", 1)[1]
        assert a["severity"] == values["monitoring"]["prometheusRule"]["alerts"][key]["severity"]


def test_every_operator_metric_is_listed() -> None:
    source = (ref.OPERATOR_SOURCE / "shell" / "metrics.py").read_text()
    defined = set(re.findall(r'^\w+ = \w+\(\n\s+"(cosyvoice_\w+)"', source, re.M))
    listed = {name for name, *_ in ref.operator_metrics()}
    assert defined and defined <= listed, defined - listed


def test_the_serving_pods_counters_are_read_from_the_text_they_serve() -> None:
    found = ref.serve_metrics(ref.SERVE_SUPERVISOR.read_text())
    names = [name for name, _, _ in found]
    assert "cosyvoice_serve_triton_restarts_total" in names
    assert all(kind == "counter" for _, kind, _ in found)


def test_event_reasons_are_found_in_calls_tuples_names_and_fstrings() -> None:
    source = """
WARNING_REASONS = frozenset({"SomethingMissing"})
def plan(direction, mode):
    verb = "GrewUp" if direction == "up" else "GrewDown"
    yield PostEvent("Normal", "Literal", "message")
    yield ("Warning", f"DryRun{verb}" if mode == "DryRun" else verb, "message")
    if kind in ("Normal", "Warning"):
        pass
"""
    assert ref.event_reasons([source]) == [
        ("DryRunGrewDown", "Warning"),
        ("DryRunGrewUp", "Warning"),
        ("GrewDown", "Warning"),
        ("GrewUp", "Warning"),
        ("Literal", "Normal"),
        ("SomethingMissing", "Warning"),
    ]


def test_a_reason_without_a_meaning_fails_the_page() -> None:
    with pytest.raises(ValueError, match="NewReason"):
        ref.metrics_page([], [], [], [("NewReason", "Warning")])


def test_the_settings_page_lists_every_variable_the_operator_reads() -> None:
    """docs/reference/settings.md is written by hand; its table and shell/config.py name the
    same environment variables."""
    config = (ref.OPERATOR_SOURCE / "shell" / "config.py").read_text()
    read = set(re.findall(r'"(COSYVOICE_[A-Z_]+)"', config))
    table = "\n".join(
        line
        for line in (REPO / "docs" / "reference" / "settings.md").read_text().splitlines()
        if line.startswith("| `COSYVOICE_")
    )
    listed = set(re.findall(r"`(COSYVOICE_[A-Z_]+)`", table))
    assert len(read) > 20
    assert read == listed, f"read, not listed: {read - listed}; listed, not read: {listed - read}"
