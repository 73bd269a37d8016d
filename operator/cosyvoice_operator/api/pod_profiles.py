"""What one CosyVoice2 pod on one GPU serves, by GPU family, until the pod is measured.

The SLO sizing needs the first chunk with every slot of a pod busy
(``spec.autoscaling.slo.firstChunkMilliseconds``), which no metric the autoscaler reads
gives it; the simulator needs the whole per-pod model. Both come from here when the user
sets nothing:

- ``L20``: upstream CosyVoice's published streaming benchmark on an L20 (first chunk 220 ms at
  one stream, 1107 ms at four; RTF 0.0922 at four streams, i.e. 0.37 s of one stream's
  synthesis per second of audio). Not measured by this project.
- every family in ``pod_profiles.json``: measured by this project's GPU sweep
  (``bench/gpu/calibrate.py`` writes the file from ``bench/results/gpu-sweep.json``: the
  operator's default rendering on that GPU, fitted and checked against the sweep's own
  open-loop steps).

A family with no profile uses L20's, and says so (``PodProfile.source``): upstream's figure
is the only published one, and it is conservative for newer GPUs.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from cosyvoice_operator.api.gpus import UnknownGPUProduct, family

MEASURED = Path(__file__).with_name("pod_profiles.json")


@dataclass(frozen=True)
class PodProfile:
    gpu: str  # the GPU family (``cosyvoice_operator.api.gpus.family``)
    slots: int  # streams a pod serves at once (orchestrator instances)
    rtf: float  # seconds a stream holds its slot per second of audio
    overhead_s: float  # seconds a request holds its slot besides its audio's share
    first_chunk_s: float  # first chunk with one stream in flight
    first_chunk_per_stream_s: float  # added per other stream in flight
    first_chunk_busy_ms: int  # first chunk with every slot busy: the SLO sizing's figure
    source: str


UPSTREAM_L20 = PodProfile(
    gpu="L20",
    slots=4,
    rtf=0.37,
    overhead_s=0.05,
    first_chunk_s=0.22,
    first_chunk_per_stream_s=0.296,
    first_chunk_busy_ms=1107,
    source=(
        "upstream CosyVoice's published L20 streaming benchmark (runtime/triton_trtllm "
        "README at ace7c47), not measured here"
    ),
)


@functools.cache
def measured() -> dict[str, PodProfile]:
    """The profiles the GPU sweep measured, by family (none before it has run)."""
    if not MEASURED.is_file():
        return {}
    doc = json.loads(MEASURED.read_text())
    return {name: PodProfile(gpu=name, **fields) for name, fields in doc["profiles"].items()}


def known() -> dict[str, PodProfile]:
    """Every profile by name: upstream's L20 and those this project measured."""
    return {"L20": UPSTREAM_L20, **measured()}


def named(name: str) -> PodProfile:
    """The profile called ``name`` exactly (``L20``, ``H200``); a KeyError that lists the
    known names for any other (the benchmark's ``--pod``, where a silent fallback to the L20
    would simulate another pod than the one asked for)."""
    profiles = known()
    if name not in profiles:
        raise KeyError(
            f"no pod profile {name!r}; known: {', '.join(sorted(profiles))} (L20 is "
            "upstream's published benchmark; the others were measured by bench/gpu)"
        )
    return profiles[name]


def profile(product: str) -> PodProfile:
    """The pod profile for a GPU product label or family name (``NVIDIA-H200``, ``H200``):
    measured if this project measured the family, else upstream's L20 figures."""
    known_profiles = known()
    try:
        name = family(product)
    except UnknownGPUProduct:
        name = product
    found = known_profiles.get(name)
    if found is not None:
        return found
    return PodProfile(
        **{
            **UPSTREAM_L20.__dict__,
            "source": f"no profile for {name}: {UPSTREAM_L20.source}",
        }
    )


def for_products(products: tuple[str, ...]) -> PodProfile:
    """The profile a service sizes for when it may run on any of these products: the slowest
    first chunk of them (a fleet spread over two GPU types must meet the SLO on the slower);
    upstream's L20 figures when the service names none."""
    if not products:
        return profile("L20")
    return max((profile(p) for p in products), key=lambda p: p.first_chunk_busy_ms)
