"""cosyvoice-operator: CosyVoice text-to-speech fleets on Kubernetes GPUs.

Layout: a pure core (``spec``, ``gpus``, ``engine``, ``buildjob``, ``conditions``) that turns
resources into plain data, and a thin shell (``handlers``, ``kube``) that reads and writes the
Kubernetes API. ``localcluster`` runs a real control plane with fake GPU nodes for tests.
"""

__version__ = "0.1.0"
