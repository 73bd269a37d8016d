"""The shell: every request to the API server and Prometheus, every clock read. Watch-fed
caches, event routing, the work queue, the applier that carries out the planners' effects,
the autoscaling loop, leadership, the kopf hooks, settings, logs and the operator's metrics."""
