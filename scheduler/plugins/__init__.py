"""Scheduler plugins: one module per plugin, each exposing ``FILTER`` (a
:class:`scheduler.plugins.base.Filter`) and/or ``SCORE`` (a
:class:`scheduler.plugins.base.Score`), listed in :mod:`scheduler.plugins.registry`."""
