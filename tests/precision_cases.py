"""Which precision runs on which GPU architecture: one table for the two places that refuse
the pairs that cannot (the operator, before making a build Job; the builder, before any
download), so both are held to the same cases."""

from __future__ import annotations

# (spec.engine.precision, SM architecture, runs there)
PRECISION_ARCH_CASES: list[tuple[str, str, bool]] = [
    ("fp8", "sm_89", True),
    ("fp8", "sm_90", True),
    ("fp8", "sm_90a", True),
    ("fp8", "sm_100", True),
    ("fp8", "sm_86", False),
    ("fp8", "sm_80", False),
    ("bfloat16", "sm_80", True),
    ("bfloat16", "sm_75", False),
    ("float16", "sm_75", True),
    # The weight-only modes run with bfloat16 activations: Ampere or newer, so a Turing
    # GPU (sm_75, e.g. Tesla T4) is refused for them as for bfloat16.
    ("int8-weight-only", "sm_75", False),
    ("int4-weight-only", "sm_75", False),
    ("int8-weight-only", "sm_80", True),
    ("int4-weight-only", "sm_80", True),
    ("int8-weight-only", "sm_86", True),
    ("int4-weight-only", "sm_90", True),
    # SmoothQuant: INT8 GEMMs with bfloat16 around them, Ampere or newer.
    ("int8-smoothquant", "sm_75", False),
    ("int8-smoothquant", "sm_80", True),
    ("int8-smoothquant", "sm_89", True),
    ("int8-smoothquant", "sm_90", True),
]

# (spec.engine.kvCacheType, SM architecture, runs there), whatever the precision allows.
KV_CACHE_ARCH_CASES: list[tuple[str, str, bool]] = [
    ("auto", "sm_75", True),
    ("int8", "sm_80", True),
    ("int8", "sm_86", True),
    ("fp8", "sm_86", False),
    ("fp8", "sm_80", False),
    ("fp8", "sm_89", True),
    ("fp8", "sm_90", True),
    ("fp8", "sm_100", True),
]
