"""Engine settings for tests that set the Interference or GpuPacking plugin's args."""

from __future__ import annotations

from typing import Any

from scheduler.plugins.gpu_packing import GpuPackingArgs
from scheduler.plugins.interference import InterferenceArgs
from scheduler.settings import EngineSettings, Profile

_INTERFERENCE_ARGS = ("stale_policy", "signal_window", "risk_k", "recent_load_weight")


def interference_settings(profile: Profile | None = None, **values: Any) -> EngineSettings:
    """:class:`EngineSettings` from ``values``: the Interference plugin's args
    (``stale_policy``, ``signal_window``, ``risk_k``, ``recent_load_weight``) go to its
    ``plugin_config``, ``gpu_resource`` to GpuPacking's, the rest to the engine."""
    args = {key: values.pop(key) for key in _INTERFERENCE_ARGS if key in values}
    config: list[tuple[str, object]] = []
    if args:
        config.append(("Interference", InterferenceArgs(**args)))
    if "gpu_resource" in values:
        config.append(("GpuPacking", GpuPackingArgs(values.pop("gpu_resource"))))
    base = profile or Profile()
    if config:
        base = Profile(base.filters, base.scores, (*base.plugin_config, *config))
    return EngineSettings(profile=base, **values)
