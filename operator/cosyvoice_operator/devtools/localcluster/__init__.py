"""A local Kubernetes control plane with fake GPU nodes (see cluster.py)."""

from cosyvoice_operator.devtools.localcluster.cluster import (
    ClusterError,
    LocalCluster,
    parse_gpu_nodes,
)

__all__ = ["ClusterError", "LocalCluster", "parse_gpu_nodes"]
