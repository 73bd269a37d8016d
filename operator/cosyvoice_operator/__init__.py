"""cosyvoice-operator: CosyVoice text-to-speech fleets on Kubernetes GPUs.

Layers, each importing only those below it (enforced by import-linter, see pyproject.toml):

- ``cli``: the ``cosyvoice-operator`` command;
- ``devtools``: the local cluster and the autoscaling simulator (never imported by the shell);
- ``shell``: all I/O (API server, Prometheus, clocks): caches, routing, the applier, the loops;
- ``plan``: pure planners, spec + observed world -> status and typed effects;
- ``render`` and ``autoscaling``: pure renderers of objects and the pure scaling policy;
- ``api``: the vocabulary (spec, labels, conditions, effects, GPUs, engine identity).
"""

__version__ = "0.1.0"
