"""Settings of the scheduling engine (its plugin profile, signals and records).

Plain dataclasses with defaults, passed explicitly; the config loader builds them from
YAML. Invalid values raise :class:`ValueError` naming the field and the accepted range.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

StalePolicy = Literal["neutral", "avoid", "reject"]
STALE_POLICIES: tuple[StalePolicy, ...] = ("neutral", "avoid", "reject")
SignalWindow = Literal["latest", "10s", "60s"]
SIGNAL_WINDOWS: tuple[SignalWindow, ...] = ("latest", "10s", "60s")
MAX_WEIGHT = 100.0
"""Largest weight of a score plugin (weights are relative; 0 disables a plugin)."""


class SettingsError(ValueError):
    """Several invalid values at once, one line each, each naming its field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True, slots=True)
class Profile:
    """Which plugins run, in which order, and how much each score counts (docs/design.md
    §5.1). Plugin names are those of :mod:`scheduler.plugins.registry`; an unknown name,
    a weight outside 0–100, or a filter list without a required filter is an error."""

    filters: tuple[str, ...] | None = None
    """Filter plugins in the order they run; ``None``: the default order. Every filter is
    required (each one enforces a constraint a pod can ask for), so a list may reorder
    them, as long as a filter runs after those whose results it reads, but not drop one.
    Holds the full order once built."""
    scores: tuple[tuple[str, float], ...] = ()
    """Score plugin → weight (0–100, 0 leaves it out), over the defaults: a plugin not
    named keeps its default weight. Holds every plugin's weight once built, so two
    profiles that run the same plugins alike compare equal."""

    def __post_init__(self) -> None:
        # the registry imports every plugin, which import this module: import it lazily
        from scheduler.plugins.registry import complete, profile_problems

        problems = profile_problems(self)
        if problems:
            raise SettingsError(problems)
        filters, scores = complete(self)
        object.__setattr__(self, "filters", filters)  # frozen: set once, while building
        object.__setattr__(self, "scores", scores)


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Everything :class:`scheduler.engine.Engine` needs besides the node table."""

    profile: Profile = field(default_factory=Profile)
    interference_aware: bool = True
    """False schedules interference-blind, as kube-scheduler would: the interference
    filters (pod tolerances and the ``reject`` stale policy) are off and the interference
    score is not computed (as if its weight were 0 and ``stale_policy``
    ``neutral``), whatever those fields say. The loop uses it while signals are unreadable;
    an interference-blind policy for ``interference simulate`` sets it."""
    stale_policy: StalePolicy = "neutral"
    """Stale, missing or degraded signals (:mod:`interference.freshness`: a report older
    than 3 of its intervals, at least 5 s, or one without the run-queue family):
    ``neutral`` scores the node 50 and lets it pass tolerance filters, ``avoid`` scores it
    0, ``reject`` filters it out for every pod."""
    signal_window: SignalWindow = "10s"
    """Which of the agents' signals the interference filters and score read: ``latest``
    (the latest interval), or the ``10s``/``60s`` window (merged run-queue histogram,
    mean + ``risk_k`` · σ of the index and of reclaim stall). A window a report lacks
    falls back to its latest interval."""
    risk_k: float = 1.0
    """``k`` of the windowed risk ``mean + k · σ`` (Trimaran's LoadVariationRiskBalancing)."""
    relax_after_s: float = 60.0
    """A pod pending this long only because of interference filters is scheduled without them."""
    recent_load_weight: float = 100.0
    """Interference points added per node's worth of CPU requested by pods bound to it since
    its last report (so a burst does not all land on the one quiet node)."""
    gpu_resource: str = "nvidia.com/gpu"
    """Extended resource that counts as GPUs for packing."""
    record_top_k: int = 5
    """Nodes of each kind in each decision record: the chosen node and the next best with
    their score breakdown, and this many rejected nodes with their reasons (those the
    interference filters rejected first)."""

    def __post_init__(self) -> None:
        if self.stale_policy not in STALE_POLICIES:
            raise ValueError(
                f"stale_policy: {self.stale_policy!r} is not one of {', '.join(STALE_POLICIES)}"
            )
        if self.signal_window not in SIGNAL_WINDOWS:
            raise ValueError(
                f"signal_window: {self.signal_window!r} is not one of {', '.join(SIGNAL_WINDOWS)}"
            )
        if not 0 <= self.risk_k <= 10:
            raise ValueError(f"risk_k: {self.risk_k!r} must be a number from 0 to 10")
        for name in ("relax_after_s",):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name}: {value!r} is out of range; allowed: > 0")
        if not self.recent_load_weight >= 0:
            raise ValueError(f"recent_load_weight: {self.recent_load_weight!r} must be ≥ 0")
        if self.record_top_k < 0:
            raise ValueError(f"record_top_k: {self.record_top_k!r} must be an integer ≥ 0")
        if not self.gpu_resource:
            raise ValueError("gpu_resource: must name an extended resource, e.g. nvidia.com/gpu")
