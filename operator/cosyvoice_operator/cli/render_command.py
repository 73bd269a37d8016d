"""`cosyvoice-operator render`: every object the operator would create for one service,
without a cluster (pure, apart from reading the file).

The build Jobs are rendered as their first attempt; the serving workloads as they are once
every engine is Ready. What only a cluster knows is stated instead of guessed: the GPU
products come from `spec.engine.gpuProducts` or `--gpu-product`, and the cache claim's uid
(part of Job and record names) is shown as a placeholder.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from typing import Any

import yaml

from cosyvoice_operator.api import engine_identity
from cosyvoice_operator.api.spec import SpecError, parse
from cosyvoice_operator.render import build_job, front, workloads
from cosyvoice_operator.shell.config import OperatorConfig

CRD_FILE = "cosyvoiceservices.tts.cosyvoice.dev.yaml"
CLAIM_UID_PLACEHOLDER = "00000000-0000-0000-0000-000000000000"


class RenderError(ValueError):
    """What is wrong with the input, in one line for the user."""


def load_service(text: str, source: str) -> dict[str, Any]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise RenderError(f"{source}: not valid YAML ({' '.join(str(exc).split())})") from None
    found = [
        d
        for d in docs
        if isinstance(d, dict)
        and d.get("kind") == "CosyVoiceService"
        and str(d.get("apiVersion", "")).startswith("tts.cosyvoice.dev/")
    ]
    if len(found) != 1:
        raise RenderError(
            f"{source}: expected exactly one CosyVoiceService (apiVersion tts.cosyvoice.dev/"
            f"v1alpha1), found {len(found)}"
        )
    body = found[0]
    if not (body.get("metadata") or {}).get("name"):
        raise RenderError(f"{source}: metadata.name is required")
    unknown = list(unknown_fields(service_schema(), body))
    if unknown:
        # The API server's strict field validation (kubectl's default) refuses the same file.
        shown = ", ".join(f'"{path}"' for path in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise RenderError(f"{source}: unknown field {shown}{more} (kubectl explain cvs.spec)")
    return body


def service_schema() -> dict[str, Any]:
    """The CRD's openAPIV3Schema of the served version (a copy of crds/ shipped in this
    package, checked byte for byte against it by the tests)."""
    text = resources.files(__package__).joinpath(f"crds/{CRD_FILE}").read_text()
    crd = yaml.safe_load(text)
    version = next(v for v in crd["spec"]["versions"] if v.get("served"))
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def unknown_fields(schema: Mapping[str, Any], value: Any, path: str = "") -> Iterator[str]:
    """The paths of fields the schema does not declare, as the API server names them.

    Objects that preserve unknown fields, or whose values are free-form
    (``additionalProperties``), accept any key; ``metadata`` is ObjectMeta, checked by the
    server elsewhere, and skipped here.
    """
    if isinstance(value, Mapping) and schema.get("type") == "object":
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return
        props: Mapping[str, Any] = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, child in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key in props:
                if where != "metadata":
                    yield from unknown_fields(props[key], child, where)
            elif isinstance(extra, Mapping):
                yield from unknown_fields(extra, child, where)
            elif not extra:
                yield where
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            yield from unknown_fields(schema["items"], item, f"{path}[{i}]")


def render_service(
    body: Mapping[str, Any],
    gpu_products: Sequence[str],
    cfg: OperatorConfig,
    namespace: str = "",
) -> list[dict[str, Any]]:
    meta = dict(body.get("metadata") or {})
    namespace = namespace or str(meta.get("namespace") or "default")
    meta.setdefault("uid", "<uid of the CosyVoiceService>")
    meta["namespace"] = namespace
    body = {
        **body,
        "metadata": meta,
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
    }
    try:
        svc = parse(body.get("spec") or {})
    except SpecError as exc:
        raise RenderError(str(exc)) from None
    if gpu_products:
        svc = dataclasses.replace(
            svc, engine=dataclasses.replace(svc.engine, gpu_products=tuple(gpu_products))
        )
    if not svc.engine.gpu_products:
        raise RenderError(
            "no GPU product to render for: without a cluster the operator cannot read the "
            "nodes; pass --gpu-product PRODUCT (e.g. NVIDIA-L20) or set spec.engine.gpuProducts"
        )
    plan = engine_identity.plan(svc, [], cfg.build.default_builder_image, cfg.build.companion_pins)
    if not plan.targets:
        raise RenderError("; ".join(r.message for r in plan.rejected))
    cache = build_job.CacheClaim(svc.engine.cache_claim_name, CLAIM_UID_PLACEHOLDER)
    out: list[dict[str, Any]] = []
    # The build Jobs, one per architecture.
    for target in plan.targets:
        out.append(build_job.render_job(target, svc, namespace, 1, cfg.build, cache))
    shares = workloads.split_replicas(
        svc.replicas, [(t.identity.gpu_arch, 0) for t in plan.targets]
    )
    for target in plan.targets:
        arch = target.identity.gpu_arch
        out.extend(
            workloads.render_architecture(
                body,
                svc,
                workloads.ArchServing(arch, target.key, target.products, shares[arch]),
                namespace,
                cfg.serving,
            )
        )
    # In front of the Triton pods, per spec.routing.mode (the router's objects by default).
    # Gateway API objects are shown whatever the operator's configuration says of them.
    shown = dataclasses.replace(cfg.serving, gateway_api=True)
    out.extend(front.front_objects(body, svc, namespace, shown))
    return out


def to_yaml(objects: Sequence[Mapping[str, Any]]) -> str:
    return yaml.safe_dump_all(
        [json.loads(json.dumps(o)) for o in objects], sort_keys=False, width=100
    )
