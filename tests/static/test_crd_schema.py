"""Static checks of crds/ (no cluster): every field described, bounded, CEL messages naming their
field, the examples are services, the invalid cases are distinct."""

from __future__ import annotations

import json
import re

import yaml

from tests.crd_cases import (
    API_VERSION,
    EXAMPLES,
    INVALID_SPECS,
    KIND,
    crd,
    schema_nodes,
)


def test_every_schema_field_is_described() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    undocumented = [
        path
        for path, node in schema_nodes(schema, "")
        if path != ".metadata" and not str(node.get("description", "")).strip()
    ]
    assert undocumented == [], f"schema nodes without a description: {undocumented}"


def test_unknown_fields_are_preserved_only_for_the_decisions_inputs() -> None:
    """Tolerations and affinity are typed (the core types' fields) since issue 21: an
    untyped subtree could hold anything, of any size, and crash the operator's planning."""
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    preserving = {
        path
        for path, node in schema_nodes(schema, "")
        if node.get("x-kubernetes-preserve-unknown-fields")
    }
    assert preserving == {".status.autoscaling.lastDecision.inputs"}


def test_every_spec_list_map_and_string_is_bounded() -> None:
    """Issue 21 M3: every array has maxItems, every map maxProperties, every free string
    maxLength (enums and patterns of bounded repetition aside), so that no spec can grow to
    the object size limit through one field."""
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    unbounded = []
    for path, node in schema_nodes(schema["properties"]["spec"], ".spec"):
        kind = node.get("type")
        if kind == "array" and "maxItems" not in node:
            unbounded.append(path)
        if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
            unbounded.append(path)
        if kind == "string" and "enum" not in node and "maxLength" not in node:
            unbounded.append(path)
    assert unbounded == []


def test_cel_messages_name_the_field() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = [
        rule
        for _, node in schema_nodes(schema, "")
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) >= 10
    for rule in rules:
        assert re.match(r"^(every )?(spec|metadata)\.", rule["message"]), rule


def test_examples_are_cosyvoice_services() -> None:
    names = {path.name for path in EXAMPLES}
    assert {"cosyvoice2.yaml", "cosyvoice3.yaml"} <= names
    for path in EXAMPLES:
        docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        assert docs, path
        for doc in docs:
            assert doc["apiVersion"] == API_VERSION, path
            assert doc["kind"] == KIND, path


def test_invalid_cases_are_distinct_and_numerous() -> None:
    ids = [case_id for case_id, _, _ in INVALID_SPECS]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 15
    patches = [json.dumps(patch, sort_keys=True) for _, patch, _ in INVALID_SPECS]
    assert len(patches) == len(set(patches))
