"""Rendering, pure: spec -> Kubernetes objects (build and cleanup Jobs, engine records,
Deployments, Services, PodDisruptionBudgets) and the Triton model repository."""
