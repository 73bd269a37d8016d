"""Developer tools that ship with the package but are never imported by the running operator:
the local cluster (real control plane, kwok GPU nodes) and the autoscaling simulator."""
