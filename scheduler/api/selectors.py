"""Node and label selectors: their requirements, what they match, which of them kube
accepts (label keys and values, ``Gt``/``Lt`` bounds), and their parsing from API JSON."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.api.reader import Reader

NODE_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


LABEL_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``key operator values`` expression of a node or label selector."""

    key: str
    operator: str
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """Expressions over labels and fields (``metadata.name``), all of which must hold."""

    match_expressions: tuple[Requirement, ...]
    match_fields: tuple[Requirement, ...]
    parse_errors: tuple[str, ...] = ()
    """Why kube-scheduler could not build this term's selector (an invalid key or value,
    a ``Gt``/``Lt`` bound that is not a base-10 int64, …); such a term matches no node,
    while the pod's other terms still count."""


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """``matchLabels`` (as ``In`` requirements) and ``matchExpressions``, ANDed."""

    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when every requirement holds (an empty selector matches everything)."""
        for requirement in self.requirements:  # a plain loop: this runs per pod per term
            if not _label_requirement_holds(requirement, labels):
                return False
        return True


def _label_requirement_holds(requirement: Requirement, labels: Mapping[str, str]) -> bool:
    """Label-selector semantics: ``NotIn`` and ``DoesNotExist`` hold when the key is absent."""
    value = labels.get(requirement.key)
    op = requirement.operator
    if op == "In":
        return value is not None and value in requirement.values
    if op == "NotIn":
        return value is None or value not in requirement.values
    if op == "Exists":
        return value is not None
    return value is None  # DoesNotExist


def node_requirement_errors(requirement: Requirement) -> list[str]:
    """Why kube's ``labels.NewRequirement`` would reject a node-selector expression (none
    when it is valid): the key must be a qualified name; ``In``/``NotIn`` need values,
    ``Exists``/``DoesNotExist`` none, ``Gt``/``Lt`` exactly one base-10 int64; and every
    value must be a valid label value (so a negative ``Gt`` bound is rejected too)."""
    errors = []
    if not _is_qualified_name(requirement.key):
        errors.append(f"key: {requirement.key!r} is not a valid label key")
    op, values = requirement.operator, requirement.values
    if op in ("In", "NotIn") and not values:
        errors.append(f"values: {op} needs at least one value")
    elif op in ("Exists", "DoesNotExist") and values:
        errors.append(f"values: {op} takes no values")
    elif op in ("Gt", "Lt"):
        if len(values) != 1:
            errors.append(f"values: {op} needs exactly one value")
        errors.extend(
            f"values[{i}]: {v!r} is not a base-10 64-bit integer"
            for i, v in enumerate(values)
            if parse_int64(v) is None
        )
    errors.extend(
        f"values[{i}]: {v!r} is not a valid label value"
        for i, v in enumerate(values)
        if not is_label_value(v)
    )
    return errors


def parse_int64(text: str) -> int | None:
    """Go's ``strconv.ParseInt(text, 10, 64)``: an optional sign and ASCII digits only
    (no spaces, no ``_``), within the signed 64-bit range; ``None`` otherwise."""
    if not _DECIMAL.fullmatch(text):
        return None
    number = int(text)
    return number if -(2**63) <= number < 2**63 else None


def is_label_value(text: str) -> bool:
    """A valid label value: empty, or at most 63 alphanumerics, ``-``, ``_``, ``.``,
    beginning and ending with an alphanumeric."""
    return len(text) <= 63 and _LABEL_VALUE.fullmatch(text) is not None


def _is_qualified_name(text: str) -> bool:
    prefix, slash, name = text.rpartition("/")
    if slash and not (0 < len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and _LABEL_VALUE.fullmatch(name) is not None


_DECIMAL = re.compile(r"[+-]?[0-9]+", re.ASCII)


_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?", re.ASCII)


_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"


_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")


def _requirements(
    reader: Reader, items: list[Any], path: str, operators: frozenset[str]
) -> tuple[Requirement, ...]:
    requirements = []
    for i, item in enumerate(items):
        field = f"{path}[{i}]"
        operator = reader.string(item, "operator", f"{field}.operator")
        if operator not in operators:
            raise reader.error(
                f"{field}.operator", f"{operator!r} is not one of {', '.join(sorted(operators))}"
            )
        values = reader.sequence(item, f"{field}.values")
        if not all(isinstance(v, str) for v in values):
            raise reader.error(f"{field}.values", "expected a list of strings")
        requirements.append(
            Requirement(reader.string(item, "key", f"{field}.key"), operator, tuple(values))
        )
    return tuple(requirements)


def parse_node_selector_term(reader: Reader, term: Any, field: str) -> NodeSelectorTerm:
    """One node selector term; what kube-scheduler could not parse in it is kept in
    :attr:`NodeSelectorTerm.parse_errors`."""
    if not isinstance(term, Mapping):
        raise reader.error(field, "expected an object")
    expressions = _requirements(
        reader,
        reader.sequence(term, f"{field}.matchExpressions"),
        f"{field}.matchExpressions",
        NODE_SELECTOR_OPERATORS,
    )
    fields = _requirements(
        reader,
        reader.sequence(term, f"{field}.matchFields"),
        f"{field}.matchFields",
        frozenset({"In", "NotIn"}),
    )
    errors = []
    for j, requirement in enumerate(fields):
        if requirement.key != "metadata.name":
            raise reader.error(
                f"{field}.matchFields[{j}].key",
                f"{requirement.key!r} is not supported; only metadata.name is",
            )
        if len(requirement.values) != 1:
            errors.append(f"{field}.matchFields[{j}].values: must have one element")
    for j, requirement in enumerate(expressions):
        errors.extend(
            f"{field}.matchExpressions[{j}].{problem}"
            for problem in node_requirement_errors(requirement)
        )
    return NodeSelectorTerm(expressions, fields, tuple(errors))


def parse_label_selector(reader: Reader, selector: Any, path: str) -> LabelSelector | None:
    if selector is None:
        return None
    if not isinstance(selector, Mapping):
        raise reader.error(path, "expected an object")
    match_labels = reader.string_map(selector, "matchLabels", f"{path}.matchLabels")
    requirements = tuple(Requirement(k, "In", (v,)) for k, v in sorted(match_labels.items()))
    expressions = _requirements(
        reader,
        reader.sequence(selector, f"{path}.matchExpressions"),
        f"{path}.matchExpressions",
        LABEL_SELECTOR_OPERATORS,
    )
    return LabelSelector(requirements + expressions)
