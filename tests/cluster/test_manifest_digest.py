"""Issue 21 M6 through a real API server: the digest a build pod reports in its termination
message (kwok writes it as the builder would, from the pod annotation
kwok.cosyvoice.dev/manifest-sha256, set here through COSYVOICE_BUILD_POD_ANNOTATIONS) is kept
in the engine record and reaches the serving pods' command line (--manifest-sha256), where
cosyvoice-serve checks it (tests/engine_builder/test_manifest_digest.py)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.operator_process import (
    OperatorProcess,
    cache_claim,
    get_json,
    service,
    wait_for,
)
from tests.conftest import Cluster

DIGEST = hashlib.sha256(b"a manifest as a build wrote it").hexdigest()
L20 = {"nvidia.com/gpu.product": "NVIDIA-L20"}


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    name = cluster.namespace("digest")
    cluster.apply(name, cache_claim())
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.cluster
def test_the_reported_digest_is_recorded_and_handed_to_the_serving_pods(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    annotations = json.dumps({"kwok.cosyvoice.dev/manifest-sha256": DIGEST})
    op = OperatorProcess(cluster, ns, tmp_path, COSYVOICE_BUILD_POD_ANNOTATIONS=annotations).start()
    try:
        cluster.apply(ns, service("tts", serving={"nodeSelector": L20}))

        def deployment() -> Any:
            found = get_json(
                cluster,
                "deployments",
                "-n",
                ns,
                "-l",
                # the Triton Deployment, not the router's (issue 30)
                "tts.cosyvoice.dev/service=tts,app.kubernetes.io/component=serving",
            )
            return found["items"][0] if found["items"] else None

        served = wait_for("the serving Deployment", deployment, timeout=90)
        [record] = get_json(
            cluster, "configmaps", "-n", ns, "-l", "app.kubernetes.io/component=engine-build"
        )["items"]
        assert record["data"]["manifestSha256"] == DIGEST
        assert record["data"]["key"] in json.dumps(served)
        [container] = served["spec"]["template"]["spec"]["containers"]
        args = container["args"]
        assert args[args.index("--manifest-sha256") + 1] == DIGEST
        assert args[args.index("--key") + 1] == record["data"]["key"]
    finally:
        op.stop()
        print(op.log())
