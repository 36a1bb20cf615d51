"""Extender mode: kube-scheduler's extender protocol, its bounds and warnings."""
