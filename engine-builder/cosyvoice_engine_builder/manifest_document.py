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
from cosyvoice_engine_builder.releases import companions
from cosyvoice_engine_builder.request import BuildRequest, KvCacheType
from cosyvoice_engine_builder.toolchain import Versions


def manifest_document(
    request: BuildRequest,
    versions: Versions,
    layout_fields: Mapping[str, str],
    files: list[dict[str, Any]],
) -> dict[str, Any]:
    """The whole manifest of one build, given the files as publish listed them."""
    r = request
    return {
        "schemaVersion": SCHEMA_VERSION,
        "key": r.key,
        "variant": r.variant.value,
        "model": {
            "uri": r.source.uri,
            "revision": r.revision,
            "companions": [{"uri": c.uri, "into": c.into} for c in companions(r.variant, r.source)],
        },
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


def llm_fields(request: BuildRequest) -> dict[str, Any]:
    """The manifest's description of the LLM: the engine's build options, or for vLLM's
    artifacts only which one it is (vLLM's options are its server's flags)."""
    r = request
    if not r.builds_llm:
        return {"llmRuntime": "vllm", "artifact": r.artifact.value}
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
