"""Extender mode: kube-scheduler's extender protocol, its two verbs, their metrics, records,
bounds and warnings."""
