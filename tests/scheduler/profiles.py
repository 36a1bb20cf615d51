"""Cycle settings for tests that set the Interference or GpuPacking plugin's args."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from scheduler.cycle.settings import CycleSettings, Profile
from scheduler.plugins.gpu_packing import GpuPackingArgs
from scheduler.plugins.interference import InterferenceArgs

_INTERFERENCE_ARGS = ("stale_policy", "signal_window", "risk_k", "recent_load_weight")


def interference_settings(profile: Profile | None = None, **values: Any) -> CycleSettings:
    """:class:`CycleSettings` from ``values``: the Interference plugin's args
    (``stale_policy``, ``signal_window``, ``risk_k``, ``recent_load_weight``) go to its
    ``plugin_config``, ``gpu_resource`` to GpuPacking's, the rest to the cycle."""
    args = {key: values.pop(key) for key in _INTERFERENCE_ARGS if key in values}
    config: list[tuple[str, object]] = []
    if args:
        config.append(("Interference", InterferenceArgs(**args)))
    if "gpu_resource" in values:
        config.append(("GpuPacking", GpuPackingArgs(values.pop("gpu_resource"))))
    base = profile or Profile()
    if config:
        merged = {**dict(base.plugin_config), **dict(config)}
        base = Profile(base.filters, base.scores, tuple(merged.items()))
    return CycleSettings(profile=base, **values)


def with_interference_args(settings: CycleSettings, **changes: Any) -> CycleSettings:
    """``settings`` with the Interference plugin's args changed by ``changes`` (the rest
    of its args, the profile's other plugins and the cycle's own fields kept)."""
    profile = settings.profile
    config = dict(profile.plugin_config)
    args = config.get("Interference", InterferenceArgs())
    assert isinstance(args, InterferenceArgs)
    config["Interference"] = replace(args, **changes)
    changed = Profile(profile.filters, profile.scores, tuple(config.items()))
    return replace(settings, profile=changed)
