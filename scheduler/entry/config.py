"""The scheduler's YAML configuration (a ConfigMap): loading, validation and reload.

The file mirrors :class:`SchedulerConfig`; every section is optional and every key has
a default. docs/configuration.md lists every key with its type, default, whether a
reload applies it and its meaning (generated from the dataclasses by :func:`reference`).
Some keys with their defaults (``tests/scheduler/test_config_reference.py`` checks that
this parses and that each value shown is the default)::

    cycle:             # scheduler.cycle.settings.CycleSettings
      profile:         # scheduler.cycle.settings.Profile (docs/design.md §5.1)
        scores: {Interference: 2, NodeResourcesFit: 1, GpuPacking: 1}
        plugin_config: # each plugin's args, kube-scheduler's pluginConfig shape
          - name: Interference
            args: {stale_policy: neutral}   # neutral | avoid | reject
      relax_after_s: 60
    loop:              # scheduler.standalone.loop.LoopSettings
      scheduler_name: interference-scheduler
      dry_run: false
      ignore_namespaces: []
    redis:             # scheduler.adapters.redis_settings.RedisSettings
      url: redis://127.0.0.1:6379/0   # deploy/ sets redis://redis:6379/0; REDIS_URL overrides
    kubernetes:        # scheduler.adapters.kubernetes_settings.KubernetesSettings
      kubeconfig: ""
    leader_election:   # scheduler.adapters.leader.LeaderElectionSettings
      lease_duration_s: 15
    http:              # scheduler.endpoint.http.HttpSettings
      port: 10251
    extender:          # scheduler.endpoint.http.ExtenderSettings (interference-scheduler extender)
      port: 10262
    reload_interval_s: 5

Validation collects every problem, each naming the field and the fix
(``cycle.profile.scores.GpuPacking: must be a number, got 'high'``), of every section at
once: a key of the wrong type does not hide a range problem beside it, nor does a
section's first failed check hide its next (:func:`_construct`); unknown keys and
plugin names are rejected with a did-you-mean. Types are strict: a quoted number is a string, not a
number, so a typo cannot silently become a default.

Reload (:mod:`scheduler.entry.config_reload`): the file is polled and a new valid config
applied; a bad file changes nothing that serves. Only ``cycle``, ``loop``,
``reload_guard`` and ``reload_interval_s`` apply live (``interference-scheduler
extender``: ``cycle`` only); changes to the other sections are logged as needing a
restart.

Simulator policies (``interference simulate --policy A.yaml``) are files of this format.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import logging
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

import yaml

from interference_infra.strict import SettingsError, parse_bool
from scheduler.adapters.kubernetes_settings import KubernetesSettings
from scheduler.adapters.leader import LeaderElectionSettings
from scheduler.adapters.redis_settings import RedisSettings
from scheduler.adapters.tracing import TracingSettings
from scheduler.cycle.settings import CycleSettings
from scheduler.endpoint.http import ExtenderSettings, HttpSettings
from scheduler.entry.config_reference import render
from scheduler.entry.reload_guard import ReloadGuardSettings
from scheduler.plugins.registry import REGISTRY
from scheduler.rebalancing.rebalance import RebalancerSettings
from scheduler.standalone.loop import LoopSettings

log = logging.getLogger(__name__)

LIVE_SECTIONS = ("cycle", "loop", "rebalancer", "reload_guard", "reload_interval_s")
"""Sections (and top-level keys) a reload applies without a restart (the extender mode
applies ``cycle`` only: it has no scheduling loop; ``reload_guard`` applies to the
reloads after the one that changed it)."""
FORMER_CYCLE_SECTION = "engine"  # vocabulary: former name
"""The ``cycle`` section's former name: refused, the message naming ``cycle``."""
REPLACED_KEYS = {
    FORMER_CYCLE_SECTION: "cycle: the same keys, the scheduling cycle's section "
    "(docs/design.md, Glossary)",
    "cycle.weights": "cycle.profile.scores, keyed by plugin name, e.g. "
    "{Interference: 2, NodeResourcesFit: 1, GpuPacking: 1} (docs/design.md §5.1)",
    **{
        f"cycle.{key}": f"the Interference plugin's args: cycle.profile.plugin_config:"
        f" [{{name: Interference, args: {{{key}: …}}}}] (docs/design.md §5.1)"
        for key in ("stale_policy", "signal_window", "risk_k", "recent_load_weight")
    },
    "cycle.gpu_resource": "the GpuPacking plugin's args: cycle.profile.plugin_config:"
    " [{name: GpuPacking, args: {resource: …}}] (docs/design.md §5.1)",
}
"""Keys of earlier versions → what replaced them (named in the error instead of a guess). A
section renamed is refused whole, naming its new key, so its keys are never half read."""


class StrictBoolLoader(yaml.SafeLoader):
    """YAML's safe loader with booleans limited to true/false and yes/no (any case):
    YAML 1.1's ``on``/``off`` stay strings, so ``dry_run: on`` is an error, not True."""


StrictBoolLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictBoolLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE|yes|Yes|YES|no|No|NO)$"),
    list("tTfFyYnN"),
)


class ConfigError(SettingsError):
    """The configuration is invalid; ``problems`` holds one line per field, the message
    names the file (or the flags and environment) they came from."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(problems)
        self.source = source
        self.args = (f"{source}: invalid configuration:\n  " + "\n  ".join(problems),)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Everything the scheduler process is configured with."""

    cycle: CycleSettings = field(default_factory=CycleSettings)
    loop: LoopSettings = field(default_factory=LoopSettings)
    redis: RedisSettings = field(default_factory=RedisSettings)
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    leader_election: LeaderElectionSettings = field(default_factory=LeaderElectionSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    extender: ExtenderSettings = field(default_factory=ExtenderSettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    rebalancer: RebalancerSettings = field(default_factory=RebalancerSettings)
    reload_guard: ReloadGuardSettings = field(default_factory=ReloadGuardSettings)
    reload_interval_s: float = 5.0
    """How often the config file is checked for changes."""

    def __post_init__(self) -> None:
        if not self.reload_interval_s > 0:
            raise ValueError(
                f"reload_interval_s: {self.reload_interval_s!r} is out of range; allowed: > 0"
            )


def parse_config(mapping: Mapping[str, Any] | None, source: str = "config") -> SchedulerConfig:
    """A validated :class:`SchedulerConfig` from a parsed YAML mapping (None: defaults)."""
    problems: list[str] = []
    config = _build(SchedulerConfig, {} if mapping is None else mapping, "", problems)
    if problems or not isinstance(config, SchedulerConfig):
        raise ConfigError(source, problems)
    return config


def load_config(path: str) -> SchedulerConfig:
    """Read and validate a config file; :class:`ConfigError` says what to fix."""
    return parse_config_text(read_config_text(path), path)


def read_config_text(path: str) -> str:
    """A config file's text; :class:`ConfigError` when it cannot be read as UTF-8."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ConfigError(path, [f"cannot read the file: {exc.strerror or exc}"]) from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(path, ["not text: a config file is UTF-8 YAML"]) from None


def parse_config_text(text: str, source: str) -> SchedulerConfig:
    """Validate a config file's text (``source`` names it in errors)."""
    try:
        document = yaml.load(text, Loader=StrictBoolLoader)  # a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [f"not valid YAML{where}: {problem}"]) from exc
    if document is not None and not isinstance(document, dict):
        raise ConfigError(
            source, [f"top level must be a mapping of sections, got {_kind(document)}"]
        )
    return parse_config(document, source)


def _build(cls: type[Any], data: Any, path: str, problems: list[str]) -> Any:
    """Instantiate dataclass ``cls`` from ``data``, appending problems instead of raising."""
    where = path.rstrip(".") or "top level"
    if not isinstance(data, Mapping):
        problems.append(f"{where}: must be a mapping, got {_kind(data)}")
        return None
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    ok = True
    for key, value in data.items():
        if key not in names:
            ok = False
            replaced = REPLACED_KEYS.get(f"{path}{key}")
            if replaced is not None:
                problems.append(f"{path}{key}: replaced by {replaced}")
            else:
                problems.append(_unknown_key(f"{path}{key}", str(key), names))
            continue
        converted = _convert(hints[key], value, f"{path}{key}", problems)
        if converted is _INVALID:
            ok = False
        else:
            kwargs[key] = converted
    if not ok:  # still check the keys that did read, so every problem is told at once
        with contextlib.suppress(TypeError):  # a required field among those that did not read
            _construct(cls, kwargs, path, problems)
        return None
    return _construct(cls, kwargs, path, problems)


FIELD_NAMED = re.compile(r"[A-Za-z_]\w*")
"""The field a settings check's message begins with (``bind_workers: 0 must be …``)."""


def _construct(cls: type[Any], kwargs: dict[str, Any], path: str, problems: list[str]) -> Any:
    """``cls(**kwargs)``, or ``None`` with every problem its checks find. A dataclass's
    ``__post_init__`` raises at its first problem (a :class:`SettingsError` may hold
    several), each naming its field first: those fields are put back to their defaults
    and the rest checked again, until the checks pass or name no key that was given."""
    given = dict(kwargs)
    failed = False
    for _ in range(len(kwargs) + 1):
        try:
            built = cls(**given)
        except ValueError as exc:
            found = exc.problems if isinstance(exc, SettingsError) else [str(exc)]
        else:
            return None if failed else built
        failed = True
        named = set()
        for problem in found:
            if f"{path}{problem}" not in problems:
                problems.append(f"{path}{problem}")
            match = FIELD_NAMED.match(problem)
            if match and match.group() in given:
                named.add(match.group())
        if not named:
            return None
        for name in named:
            del given[name]
    return None


_INVALID = object()


def _convert(hint: Any, value: Any, path: str, problems: list[str]) -> Any:
    origin = get_origin(hint)
    if dataclasses.is_dataclass(hint):
        built = _build(hint, value, f"{path}.", problems)  # type: ignore[arg-type]
        return _INVALID if built is None else built
    if origin is Literal:
        choices = get_args(hint)
        if value in choices:
            return value
        problems.append(f"{path}: must be one of {', '.join(map(str, choices))}, got {value!r}")
        return _INVALID
    if hint == tuple[tuple[str, float], ...]:  # name → number, e.g. score weights
        return _weights(value, path, problems)
    if hint == tuple[tuple[str, object], ...]:  # plugin name → its args
        return _plugin_config(value, path, problems)
    if origin is tuple:
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            problems.append(f"{path}: must be a list of names, e.g. [kube-system], got {value!r}")
            return _INVALID
        return tuple(value)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _convert(inner[0], value, path, problems)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            try:
                return parse_bool(path, value)
            except SettingsError:
                pass
        problems.append(f"{path}: must be true or false (or yes/no, 1/0), got {value!r}")
        return _INVALID
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        problems.append(f"{path}: must be a whole number, got {value!r}")
        return _INVALID
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        problems.append(f"{path}: must be a number, got {value!r}")
        return _INVALID
    if hint is str:
        if isinstance(value, str):
            return value
        problems.append(f"{path}: must be a string (quote it), got {value!r}")
        return _INVALID
    raise TypeError(f"{path}: the config loader does not handle type {hint!r}")


def _weights(value: Any, path: str, problems: list[str]) -> Any:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        problems.append(f"{path}: must be a mapping of name to number, got {_kind(value)}")
        return _INVALID
    pairs = [
        (str(name), _convert(float, n, f"{path}.{name}", problems)) for name, n in value.items()
    ]
    return _INVALID if any(n is _INVALID for _, n in pairs) else tuple(pairs)


def _plugin_config(value: Any, path: str, problems: list[str]) -> Any:
    """kube-scheduler's ``pluginConfig`` shape, ``[{name: Plugin, args: {…}}, …]``, each
    ``args`` built into that plugin's args dataclass."""
    if value is None:
        return ()
    if not isinstance(value, list):
        problems.append(f"{path}: must be a list of {{name, args}}, got {_kind(value)}")
        return _INVALID
    kinds = REGISTRY.args_types()
    entries: list[tuple[str, object]] = []
    ok = True
    for i, entry in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(entry, Mapping) or set(entry) - {"name", "args"}:
            problems.append(f"{where}: must be a mapping with name and args, got {entry!r}")
            ok = False
            continue
        name = entry.get("name")
        kind = kinds.get(name) if isinstance(name, str) else None
        if not isinstance(name, str):
            kind = None
        if kind is None:
            hint = difflib.get_close_matches(str(name), list(kinds), n=1, cutoff=0.6)
            also = f"did you mean {hint[0]!r}? " if hint else ""
            problems.append(
                f"{where}.name: {name!r} is not a plugin with args; {also}"
                f"plugins with args: {', '.join(kinds)}"
            )
            ok = False
            continue
        args = _build(kind, entry.get("args") or {}, f"{where}.args.", problems)
        if args is None or not isinstance(name, str):
            ok = False
        else:
            entries.append((name, args))
    return tuple(entries) if ok else _INVALID


def _unknown_key(path: str, key: str, names: list[str]) -> str:
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(names)}"
    return f"{path}: unknown key; {hint}"


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def with_overrides(config: SchedulerConfig, **sections: Any) -> SchedulerConfig:
    """``config`` with fields of some sections replaced, e.g.
    ``with_overrides(c, loop={"dry_run": True})``; validated like the file."""
    problems: list[str] = []
    replaced: dict[str, Any] = {}
    for name, changes in sections.items():
        current = getattr(config, name)
        merged = {f.name: getattr(current, f.name) for f in dataclasses.fields(current)}
        merged.update(changes)
        built = _construct(type(current), merged, f"{name}.", problems)
        if built is not None:
            replaced[name] = built
    if problems:
        raise ConfigError("command line/environment", problems)
    return dataclasses.replace(config, **replaced)


REFERENCE_INTRO = """\
The scheduler's configuration file: the ConfigMap `interference-scheduler-config`
(deploy/base/scheduler/scheduler.yaml, mounted at `/etc/interference/scheduler.yaml`), or
`interference-scheduler --config FILE`; simulator policies (`interference simulate
--policy FILE`) have the same format. Every section and every key is optional. Types are
strict: a quoted number is a string, an unknown key is an error with a did-you-mean, and
every problem of a file is reported at once.

**applies**: `live` — the running scheduler applies a change within `reload_interval_s`
of the file changing (a ConfigMap edit reaches the pod within about a minute);
`restart` — the change is logged as needing a restart and applies at the next start. In
extender mode (`interference-scheduler extender`) only `cycle` applies live. An invalid
file changes nothing that serves and never makes a replica unready: the last valid
configuration keeps serving, and a `Warning InvalidConfiguration` Event on the ConfigMap,
`interference_scheduler_config_rejected` and the log say why. After a valid reload the
standalone scheduler watches its Pending rate and rolls back to the last good
configuration when it stays too high (`reload_guard`; docs/operations.md, "Configuration
reload and roll back").

The file's path is `--config FILE` or `INTERFERENCE_SCHEDULER_CONFIG`. The environment
and flags set some keys over the file (and a reload leaves them as they were set):
`REDIS_URL` (`redis.url`), `REDIS_CA_FILE`, `REDIS_CERT_FILE`, `REDIS_KEY_FILE`
(`redis.ca_file`, `redis.cert_file`, `redis.key_file`), `REDIS_SENTINELS`,
`REDIS_SENTINEL_MASTER`, `REDIS_CLUSTER` (`redis.sentinels`, `redis.sentinel_master`,
`redis.cluster`), `--dry-run` or `DRY_RUN` (`loop.dry_run`), `--kubeconfig`
(`kubernetes.kubeconfig`). The Redis user and password are never in the file:
`REDIS_USERNAME` and `REDIS_PASSWORD`.
"""


def reference() -> str:
    """docs/configuration.md: every key of the file, from the settings dataclasses."""
    return render(SchedulerConfig, LIVE_SECTIONS, REGISTRY.args_types(), REFERENCE_INTRO)
