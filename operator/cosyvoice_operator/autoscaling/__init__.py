"""Autoscaling, pure: the policy (observations + history -> a decision with its reason) and
one evaluation of a service (samples -> decision, status and events). The Prometheus reader
that feeds it lives in the shell."""
