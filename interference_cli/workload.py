"""The pod arrival file of ``interference simulate --pods``: node sizes, the pods that
arrive (when, how many, what they request and tolerate) and how violations are judged.

Every error names the file, the entry (``arrivals[3]``) and the key, and says what
the key must hold.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from interference.annotations import (
    invalid_flag_messages,
    unknown_annotation_message,
    unknown_annotations,
)
from interference_cli.errors import CliError
from scheduler.adapters.object_builders import pod_object

MAX_ARRIVALS_PER_ENTRY = 100_000


@dataclass(frozen=True, slots=True)
class Arrival:
    """One pod arriving ``at_s`` seconds after the trace's first report."""

    at_s: float
    obj: dict[str, Any]
    """The pod as the API server would return it."""
    duration_s: float | None
    """Seconds until it leaves (frees its resources); None stays to the end."""


@dataclass(frozen=True, slots=True)
class Workload:
    """The ``--pods`` file: node sizes, arrivals and how violations are judged."""

    node_allocatable: Mapping[str, Mapping[str, str]]
    """Per node name (``default`` for the rest) the allocatable resources."""
    arrivals: list[Arrival]
    horizon_s: float = 10.0
    """Seconds after a placement whose reports are judged against the pod's tolerance."""
    violation_fraction: float = 0.5
    """Share of those reports that must exceed the tolerance to count a violation."""


def load_workload(path: str | Path) -> Workload:
    """Read a ``--pods`` file; :class:`CliError` naming what is wrong.

    Format::

        nodes:                       # allocatable per trace node; `default` for the rest
          default: {cpu: "4", memory: 16Gi, pods: "110"}
        evaluation: {horizon_s: 10, violation_fraction: 0.5}
        arrivals:
          - {at_s: 2, count: 10, every_s: 1, name: web, cpu: 250m, memory: 256Mi,
             gpus: 0, duration_s: 60, annotations: {interference.io/max-runq-p99-us: "1000"}}
    """
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise CliError(
            f"pod arrival file {path} is not text (UTF-8 YAML); see deploy/demo/arrivals.yaml "
            "for the format"
        ) from None
    except OSError as exc:
        raise CliError(f"cannot read pod arrival file {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise CliError(f"pod arrival file {path} is not valid YAML: {one_line(exc)}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("arrivals"), list):
        raise CliError(f"pod arrival file {path} needs an `arrivals:` list")
    try:
        nodes = {
            str(name): {str(k): str(v) for k, v in resources.items()}
            for name, resources in (data.get("nodes") or {}).items()
        }
        evaluation = data.get("evaluation") or {}
        arrivals = [a for i, entry in enumerate(data["arrivals"]) for a in _expand(i, entry)]
        workload = Workload(
            nodes,
            sorted(arrivals, key=lambda a: a.at_s),
            horizon_s=float(evaluation.get("horizon_s", 10.0)),
            violation_fraction=float(evaluation.get("violation_fraction", 0.5)),
        )
    except ArrivalError as exc:
        raise CliError(
            f"pod arrival file {path}: {exc}; see the format in docs/operations.md and "
            "deploy/demo/arrivals.yaml"
        ) from None
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise CliError(
            f"pod arrival file {path} is malformed ({type(exc).__name__}: {one_line(exc)}); "
            "see the format in docs/operations.md and deploy/demo/arrivals.yaml"
        ) from exc
    if not workload.arrivals:
        raise CliError(f"pod arrival file {path} has no arrivals")
    if not 0 < workload.violation_fraction <= 1 or workload.horizon_s <= 0:
        raise CliError(
            f"pod arrival file {path}: evaluation needs horizon_s > 0 and "
            "0 < violation_fraction ≤ 1"
        )
    return workload


def one_line(exc: Exception) -> str:
    """An exception's message on one line."""
    return " ".join(str(exc).split())


ARRIVAL_KEYS = {
    "at_s": "seconds after the trace's first report, e.g. at_s: 2",
    "name": "pod name (count > 1: NAME-0, NAME-1, …)",
    "namespace": "default: default",
    "count": "pods of this entry, default 1",
    "every_s": "seconds between the count pods, default 0",
    "cpu": "CPU request, default 100m",
    "memory": "memory request, default 128Mi",
    "gpus": "GPUs requested, default 0",
    "duration_s": "seconds until the pod leaves; absent: it stays",
    "annotations": "the pod's annotations, e.g. interference.io/max-runq-p99-us",
}
"""The keys of an ``arrivals:`` entry and what each means (said in errors)."""


class ArrivalError(ValueError):
    """An ``arrivals:`` entry that cannot be read; the message names the entry and key."""


def _entry_number(
    index: int, entry: Mapping[str, Any], key: str, default: float | None, *, integer: bool = False
) -> float:
    """``entry[key]`` as a number ≥ 0 (``default`` when absent and not None)."""
    where = f"arrivals[{index}]"
    if key not in entry:
        if default is None:
            raise ArrivalError(f"{where} has no {key} ({ARRIVAL_KEYS[key]})")
        return default
    value = entry[key]
    kind = "a whole number" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArrivalError(f"{where}.{key} must be {kind}, got {value!r}")
    if integer and value != int(value):
        raise ArrivalError(f"{where}.{key} must be {kind}, got {value!r}")
    if not value >= 0 or value == float("inf"):
        raise ArrivalError(f"{where}.{key} must be a finite number ≥ 0, got {value!r}")
    return int(value) if integer else float(value)


def _expand(index: int, entry: Any) -> list[Arrival]:
    """The pods of ``arrivals[index]``; :class:`ArrivalError` naming the entry and key."""
    where = f"arrivals[{index}]"
    if not isinstance(entry, Mapping):
        raise ArrivalError(
            f"{where} must be a mapping with at_s (and name, count, cpu …), got {entry!r}"
        )
    unknown = sorted(str(key) for key in entry if key not in ARRIVAL_KEYS)
    if unknown:
        close = difflib.get_close_matches(unknown[0], ARRIVAL_KEYS, n=1)
        raise ArrivalError(
            f"{where} has unknown key {unknown[0]!r}"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + f"; known: {', '.join(ARRIVAL_KEYS)}"
        )
    at_s = _entry_number(index, entry, "at_s", None)
    count = int(_entry_number(index, entry, "count", 1, integer=True))
    every_s = _entry_number(index, entry, "every_s", 0.0)
    if not 1 <= count <= MAX_ARRIVALS_PER_ENTRY:
        raise ArrivalError(
            f"{where}.count {count} is out of range; allowed: 1–{MAX_ARRIVALS_PER_ENTRY}"
        )
    gpus = int(_entry_number(index, entry, "gpus", 0, integer=True))
    duration = (
        None if entry.get("duration_s") is None else _entry_number(index, entry, "duration_s", None)
    )
    annotations = entry.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        raise ArrivalError(f"{where}.annotations must be a mapping, got {annotations!r}")
    unknown = unknown_annotations(str(key) for key in annotations)
    if unknown:  # the scheduler would only warn; a replay with it would mislead
        raise ArrivalError(f"{where}.annotations: {unknown_annotation_message(unknown[0])}")
    invalid = invalid_flag_messages({str(k): str(v) for k, v in annotations.items()})
    if invalid:  # likewise: the scheduler would read it as false, with a warning
        raise ArrivalError(f"{where}.annotations: {invalid[0]}")
    for key in ("name", "namespace", "cpu", "memory"):
        if isinstance(entry.get(key), list | dict):
            raise ArrivalError(f"{where}.{key} must be a single value, got {entry[key]!r}")
    name = str(entry.get("name", f"pod{index}"))
    return [
        Arrival(
            at_s=at_s + k * every_s,
            obj=pod_object(
                f"{name}-{k}" if count > 1 else name,
                namespace=str(entry.get("namespace", "default")),
                cpu=str(entry.get("cpu", "100m")),
                memory=str(entry.get("memory", "128Mi")),
                gpus=gpus,
                annotations={str(a): str(v) for a, v in annotations.items()},
            ),
            duration_s=duration,
        )
        for k in range(count)
    ]
