"""Moved to :mod:`scheduler.plugins.base` (kept until every filter has moved there)."""

from scheduler.plugins.base import FilterResult, all_pass, any_per_node

__all__ = ["FilterResult", "all_pass", "any_per_node"]
