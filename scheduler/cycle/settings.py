"""Settings of the scheduling cycle: its plugin profile and the framework's own rules.

Plain dataclasses with defaults, passed explicitly; the config loader builds them from
YAML (the ``cycle`` section). A plugin's own options are its args, set in the profile's
``plugin_config`` (kube-scheduler's ``pluginConfig`` shape). Invalid values raise
:class:`ValueError` naming the field and the accepted range.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from interference_infra.strict import SettingsError
from scheduler.cycle.preemption import PreemptionArgs
from scheduler.plugins.registry import REGISTRY


@dataclass(frozen=True, slots=True)
class Profile:
    """Which plugins run, in which order, how much each score counts and each plugin's
    args (docs/design.md §5.1). Plugin names are those of
    :mod:`scheduler.plugins.registry`; an unknown name, a weight outside 0–100, a filter
    listed before one it reads or args of the wrong kind are errors."""

    filters: tuple[str, ...] | None = None
    """Filter plugins in the order they run; ``None``: the default order. Every filter is
    required (each one enforces a constraint a pod can ask for): those a list leaves out
    run at their default place, so a list keeps working when a filter is added. Holds
    the full order once built."""
    scores: tuple[tuple[str, float], ...] = ()
    """Score plugin → weight (0–100, 0 leaves it out), over the defaults: a plugin not
    named keeps its default weight. Holds every plugin's weight once built, so two
    profiles that run the same plugins alike compare equal."""
    plugin_config: tuple[tuple[str, object], ...] = ()
    """Plugin name → its args dataclass (e.g. ``Interference`` →
    :class:`scheduler.plugins.interference.InterferenceArgs`); plugins not named use
    their defaults. Holds every plugin's args once built."""

    def __post_init__(self) -> None:
        problems = REGISTRY.problems(self.filters, self.scores, self.plugin_config)
        if problems:
            raise SettingsError(problems)
        # frozen: completed once, while building
        object.__setattr__(self, "filters", REGISTRY.filter_order(self.filters))
        object.__setattr__(self, "scores", REGISTRY.weights(self.scores))
        args = {name: kind() for name, kind in REGISTRY.args_types().items()}
        args.update(self.plugin_config)  # every plugin's args, so equal profiles compare equal
        object.__setattr__(self, "plugin_config", tuple(sorted(args.items())))


@dataclass(frozen=True, slots=True)
class CycleSettings:
    """Everything :class:`scheduler.cycle.cycle.SchedulingCycle` needs besides the node table."""

    profile: Profile = field(default_factory=Profile)
    interference_aware: bool = True
    """False schedules interference-blind, as kube-scheduler would: the plugins that read
    signals (Interference's filter and score) do not run; an interference-blind policy
    for ``interference simulate`` sets it. While signals are unreadable the score is off
    and the filter fails closed for pods with a tolerance."""
    relax_after_s: float = 60.0
    """A pod pending this long only because of interference filters is scheduled without them."""
    record_top_k: int = 5
    """Nodes of each kind in each decision record: the chosen node and the next best with
    their score breakdown, and this many rejected nodes with their reasons (those the
    interference filters rejected first)."""
    preemption: PreemptionArgs = field(default_factory=PreemptionArgs)
    """Standalone mode's PostFilter, kube-scheduler's DefaultPreemption (its args, and
    the opt-in antagonist rule: docs/design.md §5, "Preemption")."""

    def __post_init__(self) -> None:
        if not self.relax_after_s > 0:
            raise ValueError(f"relax_after_s: {self.relax_after_s!r} is out of range; allowed: > 0")
        if self.record_top_k < 0:
            raise ValueError(f"record_top_k: {self.record_top_k!r} must be an integer ≥ 0")
