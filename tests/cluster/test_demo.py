"""`cosyvoice-operator demo`'s closed loop, on the test cluster: the examples, a real Prometheus,
a real CPU tritonserver per Ready pod of the autoscaled example, the service's router (a real
HAProxy on the operator's rendered config) and the demo's load rising and falling through it.
The demo itself waits for states (the fleet grown to maxReplicas with the latency back under
target, then shrunk to minReplicas with one Triton left); the test waits for the demo."""

from __future__ import annotations

import io
from pathlib import Path

from cosyvoice_operator.devtools import demo as demo_module
from cosyvoice_operator.devtools.demo import Demo, closed_loop_missing
from tests.conftest import Cluster


def test_the_demo_scales_up_under_its_load_and_back_down_after_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    missing = closed_loop_missing()
    assert missing is None, f"the demo's closed loop cannot run: {missing}"
    ns = cluster.namespace("demo")
    out = io.StringIO()
    demo = Demo(cluster.local, ns, out=out, tty=False, work=tmp_path / "demo")
    try:
        demo.start()
        code = demo.run(cycles=1, timeout=240)
    finally:
        demo.stop()
        cluster.kubectl("delete", "cvs", "--all", "-n", ns, "--timeout=60s", check=False)
        cluster.kubectl("delete", "namespace", ns, "--wait=false")
    text = out.getvalue()
    assert code == 0, f"no scale-up and scale-down within 240 s:\n{text}"
    maximum = demo_module.DEMO_AUTOSCALING["maxReplicas"]
    assert max(demo.observed.desired) == maximum and demo.observed.desired[-1] == 1, text
    # The banner says what is real and what is simulated; the changes come with their reasons.
    assert "REAL:" in text and "SIMULATED:" in text and "TIME COMPRESSED:" in text
    assert "cosyvoice3: 1 -> " in text and "scaling up 1 -> " in text, text
    assert " -> 1 replicas: scaling down" in text, text
    assert "tritonserver for pod" in text and "stopped (pod gone)" in text, text
    assert "cycle 1 done" in text
    # Mode Router (the default): the load went through a real HAProxy on the operator's rendered
    # config, on one channel, and the demo showed the router's queue and streams per pod.
    assert "router: HAProxy on the operator's config (configmap cvs-cosyvoice3-router)" in text
    assert "router: queue " in text and " streams per pod cvs-cosyvoice3-" in text, text
