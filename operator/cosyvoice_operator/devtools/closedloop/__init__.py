"""The autoscaler's closed loop on a machine without GPUs: a real ``tritonserver`` (the CPU twin
of the model repository the operator renders) per Ready serving pod of the local cluster, a real
Prometheus scraping them, and a load generator (``harness``; the twin: ``cpu_twin`` and its
Python stand-ins in ``standins/``). ``cosyvoice-operator demo`` runs it; so do the tests."""
