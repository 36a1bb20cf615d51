"""Every plugin, the default profile, and resolving a profile into what the cycle runs.

Default filter order (kube-scheduler's, then ours): NodeReady, NodeUnschedulable,
TaintToleration, NodeAffinity (these four depend only on the pod's signature and are
cached per signature), NodePorts, NodeResourcesFit, VolumeBinding, PodTopologySpread,
InterPodAffinity, Interference, RebalancedAway. Default score weights: Interference 2,
NodeResourcesFit 1, GpuPacking 1, PodTopologySpread 2, NodeAffinity 2, InterPodAffinity 2
(kube-scheduler's defaults where it has the plugin), MemoryPressure 1 (it has no
preference, and so changes nothing, while no feasible node is under memory pressure).

Adding a plugin is its module plus one line below. A profile that lists ``filters`` keeps
working when a filter is added: every filter is required (each enforces a constraint a
pod can ask for), so those a list leaves out run at their default place — right after the
filter that precedes them in the default order.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from scheduler.api.events import ClusterEvent
from scheduler.api.objects import PodInfo
from scheduler.plugins import (
    gpu_packing,
    inter_pod_affinity,
    interference,
    memory_pressure,
    node_affinity,
    node_ports,
    node_ready,
    node_resources_fit,
    node_unschedulable,
    pod_topology_spread,
    rebalanced_away,
    taint_toleration,
    volume_binding,
)
from scheduler.plugins.base import CycleState, Evidence, Filter, PodRejection, Score

MAX_WEIGHT = 100.0
"""Largest weight of a score plugin (weights are relative; 0 disables a plugin)."""


@dataclass(frozen=True, slots=True)
class ResolvedProfile:
    """A profile with its names looked up: what the cycle runs."""

    filters: tuple[Filter, ...]
    """In order."""
    scores: tuple[tuple[Score, float], ...]
    """With a weight above 0, in the registry's score order."""
    args: Mapping[str, object]
    """Plugin name → its args (the profile's ``plugin_config``, else the defaults)."""
    static_prefix: int
    """How many leading filters are static: the cycle caches their verdicts together,
    per pod signature."""
    static_names: tuple[str, ...]
    """The names of those leading static filters."""
    dynamic: tuple[Filter, ...]
    """The filters after them."""
    prefilters: tuple[tuple[str, Callable[[CycleState], PodRejection | None]], ...]
    """The filters' PreFilters with their plugin's name, in order."""
    names: tuple[str, ...]
    """The filters' names, in order."""
    relaxed_names: tuple[str, ...]
    """Those of the filters the relax rule keeps (not relaxable), in order."""
    evidence: Evidence
    """What its plugins add to the decision record (:class:`Evidence`), filters' first."""

    def retry_on(
        self, pod: PodInfo, rejected_by: frozenset[str]
    ) -> Callable[[ClusterEvent], bool] | None:
        """Which cluster events may make ``pod`` fit after ``rejected_by`` (plugin names)
        rejected it: those they registered for, as their hints judge (``None``: any event,
        when no plugin is known to have rejected it)."""
        if not rejected_by:
            return None
        interests = tuple(i for f in self.filters if f.name in rejected_by for i in f.events)

        def wants(event: ClusterEvent) -> bool:
            return any(interest.wants(pod, event) for interest in interests)

        return wants

    def without_signals(self) -> ResolvedProfile:
        """This profile less the plugins that read signals (interference-blind)."""
        return _resolved(
            tuple(f for f in self.filters if not f.uses_signals),
            tuple((s, w) for s, w in self.scores if not s.uses_signals),
            self.args,
        )

    def without_signal_scores(self) -> ResolvedProfile:
        """This profile less the scores that read signals, for decisions while signals are
        unreadable: its filters that read them stay, to fail closed."""
        return _resolved(
            self.filters,
            tuple((s, w) for s, w in self.scores if not s.uses_signals),
            self.args,
        )


@dataclass(frozen=True, slots=True, eq=False)  # hashed by identity: resolutions are cached
class Registry:
    """The known plugins: filters in their default order, scores in the order their
    weighted scores are added up."""

    filters: tuple[Filter, ...]
    scores: tuple[Score, ...]

    def __post_init__(self) -> None:
        if any(p.in_extender and p.prefilter for p in self.filters):
            raise ValueError(
                "extender mode runs no PreFilter: a filter with one is not in_extender"
            )
        supplied: dict[str, str] = {}
        plugins: tuple[Filter | Score, ...] = (*self.filters, *self.scores)
        for plugin in plugins:
            for name in () if plugin.evidence is None else plugin.evidence.fields():
                if supplied.setdefault(name, plugin.name) != plugin.name:
                    raise ValueError(
                        f"evidence {name}: supplied by {supplied[name]} and {plugin.name}; "
                        "a record field has one source"
                    )

    @property
    def filter_names(self) -> tuple[str, ...]:
        return tuple(plugin.name for plugin in self.filters)

    def filter_named(self, name: str) -> Filter | None:
        return next((plugin for plugin in self.filters if plugin.name == name), None)

    def score_named(self, name: str) -> Score | None:
        return next((plugin for plugin in self.scores if plugin.name == name), None)

    def args_types(self) -> dict[str, type]:
        """Plugin name → its args dataclass, for the plugins that have args."""
        found: dict[str, type] = {}
        plugins: tuple[Filter | Score, ...] = (*self.filters, *self.scores)
        for plugin in plugins:
            if plugin.args is not None:
                found[plugin.name] = plugin.args
        return found

    def with_filter(self, plugin: Filter, after: str) -> Registry:
        """This registry with ``plugin`` added after filter ``after`` (tests and forks)."""
        names = self.filter_names
        at = names.index(after) + 1
        return Registry((*self.filters[:at], plugin, *self.filters[at:]), self.scores)

    def filter_order(self, listed: tuple[str, ...] | None) -> tuple[str, ...]:
        """The profile's filter order: ``listed`` with every filter it leaves out placed
        right after its predecessor in the default order (the front when it has none)."""
        if listed is None:
            return self.filter_names
        order = [name for name in listed if self.filter_named(name) is not None]
        for position, name in enumerate(self.filter_names):
            if name in order:
                continue
            before = self.filter_names[:position]
            anchor = next((n for n in reversed(before) if n in order), None)
            order.insert(0 if anchor is None else order.index(anchor) + 1, name)
        return tuple(order)

    def weights(self, configured: Iterable[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
        """Every score plugin's weight: ``configured`` over the defaults."""
        weights = {plugin.name: plugin.default_weight for plugin in self.scores}
        weights.update(configured)
        return tuple(weights.items())

    def problems(
        self,
        filters: tuple[str, ...] | None,
        scores: tuple[tuple[str, float], ...],
        plugin_config: tuple[tuple[str, object], ...],
    ) -> list[str]:
        """What is wrong with a profile, one line per problem, each naming its field."""
        problems: list[str] = []
        if filters is not None:
            problems += self._filter_problems(filters)
        seen: set[str] = set()
        known_scores = {plugin.name: plugin for plugin in self.scores}
        for name, weight in scores:
            if name not in known_scores:
                problems.append(f"scores.{name}: {_unknown(name, known_scores)}")
            elif name in seen:
                problems.append(f"scores.{name}: named twice")
            elif not 0 <= weight <= MAX_WEIGHT:
                problems.append(
                    f"scores.{name}: {weight!r} is out of range; allowed: 0–{MAX_WEIGHT:g}"
                )
            seen.add(name)
        with_args = self.args_types()
        configured: set[str] = set()
        for name, args in plugin_config:
            kind = with_args.get(name)
            if kind is None:
                plugins: dict[str, Filter | Score] = {p.name: p for p in self.filters}
                plugins.update((p.name, p) for p in self.scores)
                why = "has no args" if name in plugins else _unknown(name, plugins)
                problems.append(f"plugin_config.{name}: {why}")
            elif name in configured:
                problems.append(f"plugin_config.{name}: named twice")
            elif not isinstance(args, kind):
                problems.append(f"plugin_config.{name}: args must be {kind.__name__}")
            configured.add(name)
        return problems

    def _filter_problems(self, names: tuple[str, ...]) -> list[str]:
        problems: list[str] = []
        listed: list[str] = []
        known = {plugin.name: plugin for plugin in self.filters}
        for name in names:
            if name not in known:
                problems.append(f"filters: {name!r}: {_unknown(name, known)}")
            elif name in listed:
                problems.append(f"filters: {name!r} is listed twice")
            else:
                listed.append(name)
        ran: set[str] = set()
        for name in self.filter_order(tuple(listed)):
            missing = [read for read in known[name].reads if read not in ran]
            if missing:
                problems.append(
                    f"filters: {name!r} reads the result of {', '.join(map(repr, missing))}: "
                    "list it after them"
                )
            ran.add(name)
        return problems

    def resolve(self, profile: ProfileFields, extender: bool = False) -> ResolvedProfile:
        """The plugins a (validated) profile names, in order; with ``extender`` only
        those extender mode runs (kube-scheduler has run its own plugins before)."""
        return _resolve_cached(
            self, profile.filters, profile.scores, profile.plugin_config, extender
        )


class ProfileFields(Protocol):
    """What :meth:`Registry.resolve` reads of a :class:`scheduler.cycle.settings.Profile`."""

    @property
    def filters(self) -> tuple[str, ...] | None: ...

    @property
    def scores(self) -> tuple[tuple[str, float], ...]: ...

    @property
    def plugin_config(self) -> tuple[tuple[str, object], ...]: ...


@lru_cache(maxsize=32)
def _resolve_cached(
    registry: Registry,
    filter_names: tuple[str, ...] | None,
    score_weights: tuple[tuple[str, float], ...],
    plugin_config: tuple[tuple[str, object], ...],
    extender: bool,
) -> ResolvedProfile:
    by_name = {plugin.name: plugin for plugin in registry.filters}
    filters = tuple(
        plugin
        for plugin in (by_name[name] for name in registry.filter_order(filter_names))
        if plugin.in_extender or not extender
    )
    weights = dict(registry.weights(score_weights))
    chosen = tuple(
        (plugin, weights[plugin.name])
        for plugin in registry.scores
        if weights[plugin.name] > 0 and (plugin.in_extender or not extender)
    )
    args: dict[str, object] = {name: kind() for name, kind in registry.args_types().items()}
    args.update(plugin_config)
    return _resolved(filters, chosen, args)


def _resolved(
    filters: tuple[Filter, ...],
    scores: tuple[tuple[Score, float], ...],
    args: Mapping[str, object],
) -> ResolvedProfile:
    prefix = 0
    while prefix < len(filters) and filters[prefix].static:
        prefix += 1
    return ResolvedProfile(
        filters,
        scores,
        args,
        prefix,
        tuple(f.name for f in filters[:prefix]),
        filters[prefix:],
        tuple((f.name, f.prefilter) for f in filters if f.prefilter is not None),
        tuple(f.name for f in filters),
        tuple(f.name for f in filters if not f.relaxable),
        Evidence.combined(_evidence_of(filters, scores)),
    )


def _evidence_of(
    filters: tuple[Filter, ...], scores: tuple[tuple[Score, float], ...]
) -> Iterable[Evidence]:
    plugins: tuple[Filter | Score, ...] = (*filters, *(score for score, _ in scores))
    return (plugin.evidence for plugin in plugins if plugin.evidence is not None)


def _unknown(name: str, known: Mapping[str, object]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
    return f"unknown plugin; {hint}"


REGISTRY = Registry(
    filters=(
        node_ready.FILTER,
        node_unschedulable.FILTER,
        taint_toleration.FILTER,
        node_affinity.FILTER,
        node_ports.FILTER,
        node_resources_fit.FILTER,
        volume_binding.FILTER,
        pod_topology_spread.FILTER,
        inter_pod_affinity.FILTER,
        interference.FILTER,
        rebalanced_away.FILTER,
    ),
    scores=(
        interference.SCORE,
        node_resources_fit.SCORE,
        gpu_packing.SCORE,
        pod_topology_spread.SCORE,
        node_affinity.SCORE,
        inter_pod_affinity.SCORE,
        memory_pressure.SCORE,
    ),
)
"""Every plugin this scheduler has."""
