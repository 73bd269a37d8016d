"""Which per-model stub wrapper gives the orchestrator NumPy 1.26 on this machine (run on the
device before the sweep; ``device_run.sh`` calls it).

The wheel's Python 3.12 stub misreads BYTES inputs under NumPy 2 (run 0), and the GPU models
need the machine's NumPy 2 (its SciPy). The stub's interpreter is isolated (it ignores
PYTHONPATH) and takes its prefix from the ``python3`` it finds on PATH, so a venv holding
NumPy 1.26 first on the orchestrator's PATH gives the stub that NumPy (on the CPU and on the
device alike); the model code's own sys.path entries then need it named first too (TAIL). So
this starts a Triton with one probe model per candidate wrapper, reads which NumPy and
``sys.path`` each stub got, writes the first wrapper that got 1.26 into every point's
``cosyvoice2/triton_python_backend_stub`` and prints the findings as JSON. Exit 1 when none did.

    python3 orchestrator_numpy.py TRITON_DIR BUILD_DIR VENV STUB_PREFIX

(STUB_PREFIX: the venv every other stub gets on PATH, as ``sweep.py --stub-prefix``.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HEAD = '#!/bin/sh\nenv="${COSYVOICE_ORCHESTRATOR_NUMPY:?}"\n'
# The model code puts COSYVOICE_MODELS_PATH's entries first on sys.path before it imports
# NumPy, skipping entries already there, and that list names the machine's torch site (NumPy 2):
# so it also names the venv's site-packages under another path (``numpy126``, a link to it),
# which is not on sys.path yet and so goes first.
TAIL = (
    'export COSYVOICE_MODELS_PATH="$env/numpy126:$COSYVOICE_MODELS_PATH"\n'
    'exec "${COSYVOICE_PYTHON_STUB:?}" "$@"\n'
)
SITE = "$env/lib/python3.12/site-packages"
CANDIDATES = {
    "path_pythonpath": f'export PATH="$env/bin:$PATH"\nexport PYTHONPATH="{SITE}:$PYTHONPATH"\n',
    "path": 'export PATH="$env/bin:$PATH"\n',
    "path_only": 'export PATH="$env/bin"\n',
    "path_cwd": f'export PATH="$env/bin:$PATH"\ncd "{SITE}"\n',
    "path_only_cwd": f'export PATH="$env/bin"\ncd "{SITE}"\n',
}
PROBE = """import sys, json
try:
    import numpy
    found = [numpy.__version__, numpy.__file__]
except Exception as exc:
    found = ["error", repr(exc)]
with open({out!r}, "w") as f:
    json.dump({{"numpy": found, "sys_path": sys.path, "executable": sys.executable}}, f)
class TritonPythonModel:
    def execute(self, requests):
        return []
"""
CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [{{ name: "x", data_type: TYPE_FP32, dims: [1] }}]
output [{{ name: "y", data_type: TYPE_FP32, dims: [1] }}]
instance_group [{{ count: 1, kind: KIND_CPU }}]
"""


def main() -> int:
    import sysconfig

    triton, build, venv, prefix = (Path(a) for a in sys.argv[1:5])
    work = Path("/tmp/numpy-probe")
    subprocess.run(["rm", "-rf", str(work)], check=True)
    findings: dict[str, dict] = {}
    for name, body in {"plain": None, **CANDIDATES}.items():
        model = work / "repo" / name
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(CONFIG.format(name=name))
        (model / "1" / "model.py").write_text(PROBE.format(out=str(work / f"{name}.json")))
        if body is not None:
            stub = model / "triton_python_backend_stub"
            stub.write_text(HEAD + body + TAIL)
            stub.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{prefix}/bin:{env.get('PATH', '')}"
    import torch  # the sweep's stubs have the machine's torch site on PYTHONPATH: so here

    torch_site = str(Path(torch.__file__).resolve().parents[1])
    env["PYTHONPATH"] = f"{prefix}/lib/python3.12/site-packages:{torch_site}"
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = f"{triton / 'libs'}:{libdir}:{env.get('LD_LIBRARY_PATH', '')}"
    env["COSYVOICE_ORCHESTRATOR_NUMPY"] = str(venv)
    env["COSYVOICE_PYTHON_STUB"] = str(triton / "backends/python/triton_python_backend_stub")
    server = subprocess.Popen(
        [str(triton / "bin/tritonserver"), f"--model-repository={work / 'repo'}",
         f"--backend-directory={triton / 'backends'}", "--http-port=18100",
         "--grpc-port=18101", "--metrics-port=18102"],
        env=env, stdout=(work / "log.txt").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    names = ["plain", *CANDIDATES]
    while time.monotonic() < deadline and not all((work / f"{n}.json").exists() for n in names):
        time.sleep(0.5)
    time.sleep(1)
    server.terminate()
    server.wait(timeout=30)
    for name in names:
        path = work / f"{name}.json"
        findings[name] = json.loads(path.read_text()) if path.exists() else {"numpy": ["none"]}
    chosen = next((n for n in CANDIDATES if findings[n]["numpy"][0].startswith("1.26")), None)
    if chosen:
        for stub in build.glob("repos/*/cosyvoice2/triton_python_backend_stub"):
            stub.write_text(HEAD + CANDIDATES[chosen] + TAIL)
    print(json.dumps({"chosen": chosen, "findings": findings}, indent=1))
    return 0 if chosen else 1


if __name__ == "__main__":
    raise SystemExit(main())
