"""Scaffolding of the autoscaler's closed loop: real Triton processes for a service's Ready
pods, a real Prometheus scraping them, and a streaming load generator (``harness``)."""
