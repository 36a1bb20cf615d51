"""Helpers for the filter plugins' table-driven tests."""

from __future__ import annotations

from scheduler.plugins.base import FilterResult
from scheduler.signals.table import NodeTable


def or_all_pass(result: FilterResult | None, table: NodeTable) -> FilterResult:
    """``result``, or for ``None`` (the filter had nothing to check) every node passing."""
    return FilterResult("", table.everyone(), ()) if result is None else result
