"""Kubernetes API objects as the scheduler reads them: the types and their parsers."""
