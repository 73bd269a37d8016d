"""What a build's ``manifest.json`` says: the document :func:`~.publish.publish` writes last.

The pipeline decides what goes where (the placements and the layout fields); this module
turns that, the request and the tool versions into the manifest's fields, which the serving
pods' gate (:mod:`.serving.gate`) and ``verify`` read back. It is apart from :mod:`.manifest`,
which reads and checks any manifest and knows nothing of build requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from cosyvoice_engine_builder.manifest import SCHEMA_VERSION
from cosyvoice_engine_builder.releases import companions, pinned_revision
from cosyvoice_engine_builder.request import BuildRequest, KvCacheType
from cosyvoice_engine_builder.toolchain import Versions


def manifest_document(
    request: BuildRequest,
    versions: Versions,
    layout_fields: Mapping[str, str],
    files: list[dict[str, Any]],
    fetched: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole manifest of one build, given the files as publish listed them and what the
    fetch recorded (:func:`~.fetch.read_fetched`: the commit every Hugging Face repository
    resolved to)."""
    r = request
    return {
        "schemaVersion": SCHEMA_VERSION,
        "key": r.key,
        "variant": r.variant.value,
        "model": model_fields(r, fetched or {}),
        **llm_fields(r),
        "gpuArch": r.gpu_arch,
        "versions": {
            "tensorrt": versions.tensorrt,
            "tensorrtLlm": versions.tensorrt_llm,
            "builder": versions.builder,
        },
        "createdAt": datetime.now(UTC).isoformat(timespec="seconds"),
        "layout": dict(layout_fields),
        "files": files,
    }


def model_fields(request: BuildRequest, fetched: Mapping[str, Any]) -> dict[str, Any]:
    """Where the model came from: the URI and revision asked for, each companion repository
    with the commit it was pinned to, and (for hf://) the commit every repository resolved
    to when it was fetched ("" where nothing resolved it)."""
    r = request
    got = {str(c.get("uri", "")).lower(): c for c in fetched.get("companions") or []}
    fields: dict[str, Any] = {"uri": r.source.uri, "revision": r.revision}
    if fetched:
        fields["resolvedRevision"] = str(fetched.get("resolvedRevision") or "")
    fields["companions"] = []
    for c in companions(r.variant, r.source):
        entry: dict[str, Any] = {"uri": c.uri, "into": c.into}
        pin = pinned_revision(c, r.companion_revisions)
        if pin:
            entry["revision"] = pin
        if fetched:
            entry["resolvedRevision"] = str(got.get(c.uri.lower(), {}).get("resolvedRevision", ""))
        fields["companions"].append(entry)
    if r.sha256_list is not None:
        fields["sha256List"] = str(r.sha256_list)
    return fields


def llm_fields(request: BuildRequest) -> dict[str, Any]:
    """The manifest's description of the LLM: the engine's build options."""
    r = request
    fields: dict[str, Any] = {
        "precision": r.precision.value,
        "tensorParallelSize": r.tensor_parallel_size,
        "maxBatchSize": r.max_batch_size,
        "maxNumTokens": r.max_num_tokens,
    }
    if r.kv_cache_type is not KvCacheType.AUTO:
        fields["kvCacheType"] = r.kv_cache_type.value
    if r.smooth_quant is not None:
        sq = r.smooth_quant
        fields["smoothQuant"] = {
            "alpha": sq.alpha,
            "perToken": sq.per_token,
            "perChannel": sq.per_channel,
        }
    return fields
