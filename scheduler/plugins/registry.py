"""Every plugin, the default profile, and resolving a :class:`scheduler.settings.Profile`.

Default filter order (kube-scheduler's, then ours): NodeReady, NodeUnschedulable,
TaintToleration, NodeAffinity (these four depend only on the pod's signature and are
cached per signature), NodePorts, NodeResourcesFit, VolumeBinding, PodTopologySpread,
InterPodAffinity, Interference. Default score weights: Interference 2, NodeResourcesFit 1,
GpuPacking 1, PodTopologySpread 2, NodeAffinity 2, InterPodAffinity 2 (kube-scheduler's
defaults where it has the plugin).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from scheduler.plugins import (
    gpu_packing,
    inter_pod_affinity,
    interference,
    node_affinity,
    node_ports,
    node_ready,
    node_resources_fit,
    node_unschedulable,
    pod_topology_spread,
    taint_toleration,
    volume_binding,
)
from scheduler.plugins.base import (
    CycleState,
    FilterPlugin,
    PodRejection,
    ScorePlugin,
)
from scheduler.settings import MAX_WEIGHT, Profile

FILTERS: tuple[FilterPlugin, ...] = (
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
)
"""Every filter plugin, in the default order."""
SCORES: tuple[ScorePlugin, ...] = (
    interference.SCORE,
    node_resources_fit.SCORE,
    gpu_packing.SCORE,
    pod_topology_spread.SCORE,
    node_affinity.SCORE,
    inter_pod_affinity.SCORE,
)
"""Every score plugin, in the order their weighted scores are added up."""
FILTER_PLUGINS: Mapping[str, FilterPlugin] = {plugin.name: plugin for plugin in FILTERS}
assert not any(p.in_extender and p.prefilter for p in FILTERS), "extender mode runs no PreFilter"
SCORE_PLUGINS: Mapping[str, ScorePlugin] = {plugin.name: plugin for plugin in SCORES}


@dataclass(frozen=True, slots=True)
class ResolvedProfile:
    """A :class:`Profile` with its names looked up: what the engine runs."""

    filters: tuple[FilterPlugin, ...]
    """In order."""
    scores: tuple[tuple[ScorePlugin, float], ...]
    """With a weight above 0, in :data:`SCORES` order."""
    static_prefix: int
    """How many leading filters are static: the engine caches their verdicts together,
    per pod signature."""
    static_names: tuple[str, ...]
    """The names of those leading static filters."""
    dynamic: tuple[FilterPlugin, ...]
    """The filters after them."""
    prefilters: tuple[Callable[[CycleState], PodRejection | None], ...]
    """The filters' PreFilters, in order."""


def profile_problems(profile: Profile) -> list[str]:
    """What is wrong with ``profile``, one line per problem, each naming its field."""
    problems: list[str] = []
    if profile.filters is not None:
        problems += _filter_problems(profile.filters)
    seen: set[str] = set()
    for name, weight in profile.scores:
        if name not in SCORE_PLUGINS:
            problems.append(f"scores.{name}: {_unknown(name, SCORE_PLUGINS)}")
        elif name in seen:
            problems.append(f"scores.{name}: named twice")
        elif not 0 <= weight <= MAX_WEIGHT:
            problems.append(f"scores.{name}: {weight!r} is out of range; allowed: 0–{MAX_WEIGHT:g}")
        seen.add(name)
    return problems


def _filter_problems(names: tuple[str, ...]) -> list[str]:
    problems: list[str] = []
    ran: set[str] = set()
    for name in names:
        plugin = FILTER_PLUGINS.get(name)
        if plugin is None:
            problems.append(f"filters: {name!r}: {_unknown(name, FILTER_PLUGINS)}")
            continue
        if name in ran:
            problems.append(f"filters: {name!r} is listed twice")
        missing = [read for read in plugin.reads if read not in ran]
        if missing:
            problems.append(
                f"filters: {name!r} reads the result of {', '.join(map(repr, missing))}: "
                "list it after them"
            )
        ran.add(name)
    left_out = [name for name in FILTER_PLUGINS if name not in ran]
    if left_out:
        problems.append(
            f"filters: {', '.join(map(repr, left_out))} left out; every filter is required "
            "(each enforces a constraint pods can ask for): list them all, in any order "
            "that keeps a filter after those it reads"
        )
    return problems


def _unknown(name: str, known: Mapping[str, object]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
    return f"unknown plugin; {hint}"


def complete(profile: Profile) -> tuple[tuple[str, ...], tuple[tuple[str, float], ...]]:
    """``profile``'s filter order and every score plugin's weight, defaults filled in."""
    filters = tuple(FILTER_PLUGINS) if profile.filters is None else profile.filters
    weights = {plugin.name: plugin.default_weight for plugin in SCORES}
    weights.update(profile.scores)
    return filters, tuple(weights.items())


@lru_cache(maxsize=16)
def resolve(profile: Profile, extender: bool = False) -> ResolvedProfile:
    """The plugins ``profile`` names, in order (the profile was validated when built);
    with ``extender``, only those extender mode runs (:attr:`FilterPlugin.in_extender`:
    kube-scheduler has run its own plugins before)."""
    names, weight_pairs = complete(profile)
    filters = tuple(
        plugin
        for plugin in (FILTER_PLUGINS[name] for name in names)
        if plugin.in_extender or not extender
    )
    weights = dict(weight_pairs)
    scores = tuple(
        (plugin, weights[plugin.name])
        for plugin in SCORES
        if weights[plugin.name] > 0 and (plugin.in_extender or not extender)
    )
    return _resolved(filters, scores)


def _resolved(
    filters: tuple[FilterPlugin, ...], scores: tuple[tuple[ScorePlugin, float], ...]
) -> ResolvedProfile:
    prefix = 0
    while prefix < len(filters) and filters[prefix].static:
        prefix += 1
    return ResolvedProfile(
        filters,
        scores,
        prefix,
        tuple(f.name for f in filters[:prefix]),
        filters[prefix:],
        tuple(f.prefilter for f in filters if f.prefilter is not None),
    )
