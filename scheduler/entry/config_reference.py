"""The configuration reference (docs/configuration.md), generated from the settings
dataclasses so that it names every key, its type, its default and whether a reload
applies it, with the field's own docstring as its description.

Nothing here knows the sections: :func:`render` walks the dataclass it is given (the
config module passes :class:`scheduler.entry.config.SchedulerConfig`, its live sections and
the plugins' args types), reading each field's attribute docstring from the class
source with :mod:`ast`. ``scheduler.entry.config.reference()`` is the document;
``make config-reference`` writes it and ``tests/scheduler/test_config_reference.py``
fails when the committed file differs.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import re
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

GENERATED_BY = (
    "<!-- Generated from the settings dataclasses by scheduler/entry/config_reference.py: do not"
    " edit; run `make config-reference` (tests/scheduler/test_config_reference.py checks"
    " it). -->"
)


@dataclass(frozen=True, slots=True)
class Key:
    """One key of the configuration file."""

    path: str
    """Dotted path, e.g. ``cycle.profile.scores``."""
    type: str
    """The YAML type the loader accepts, in words."""
    default: str
    """The default as YAML (flow style)."""
    live: bool
    """Whether a reload applies it without a restart."""
    description: str
    """The field's docstring as one Markdown paragraph (empty where it has none)."""


@dataclass(frozen=True, slots=True)
class Section:
    """The keys of one settings dataclass (nested dataclasses are sections of their own)."""

    path: str
    """Dotted path of the section (``""``: the top level)."""
    cls: type
    keys: tuple[Key, ...]


def sections(
    cls: type, default: Any, live: tuple[str, ...], path: str = "", top: str = ""
) -> Iterator[Section]:
    """Every section of ``cls`` (a dataclass) with ``default`` its default instance, depth
    first; ``live`` names the top-level keys a reload applies; ``top`` is the top-level key
    of the section when ``path`` does not start with it (plugin args)."""
    hints = typing.get_type_hints(cls)
    docs = attribute_docs(cls)
    keys: list[Key] = []
    nested: list[tuple[str, type, Any, str]] = []
    for f in dataclasses.fields(cls):
        key_path = f"{path}{f.name}"
        first = top or key_path.split(".")[0]
        hint, value = hints[f.name], getattr(default, f.name)
        if dataclasses.is_dataclass(hint):
            nested.append((f"{key_path}.", typing.cast(type, hint), value, first))
            continue
        written = plugin_config_value(value) if hint == PLUGIN_CONFIG else yaml_value(value)
        keys.append(Key(key_path, type_name(hint), written, first in live, docs.get(f.name, "")))
    yield Section(path.rstrip("."), cls, tuple(keys))
    for sub_path, sub_cls, sub_default, first in nested:
        yield from sections(sub_cls, sub_default, live, sub_path, top or first)


PLUGIN_CONFIG = tuple[tuple[str, object], ...]
"""The type of a ``plugin_config`` key: plugin name → its args dataclass."""


def plugin_config_value(value: tuple[tuple[str, object], ...]) -> str:
    """A ``plugin_config`` as the file writes it, leaving out plugins whose args are all
    defaults (``[]``: every plugin with its default args)."""
    changed = [(name, args) for name, args in value if args != type(args)()]
    return "[" + ", ".join(f"{{name: {n}, args: {yaml_value(a)}}}" for n, a in changed) + "]"


def attribute_docs(cls: type) -> dict[str, str]:
    """Field name → its attribute docstring (the string right after the annotation)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    found: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[node.target.id] = markdown(after.value.value)
    return found


def class_doc(cls: type) -> str:
    """A class's docstring as Markdown paragraphs."""
    return markdown(inspect.getdoc(cls) or "", keep_paragraphs=True)


def markdown(docstring: str, keep_paragraphs: bool = False) -> str:
    """reStructuredText of a docstring as Markdown, on one line (or one per paragraph)."""
    text = inspect.cleandoc(docstring)
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)  # :class:`x` → `x`
    text = text.replace("``", "`")
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "\n\n".join(paragraphs) if keep_paragraphs else " ".join(paragraphs)


def type_name(hint: Any) -> str:
    """The YAML a key accepts, in words (the same cases as the config loader)."""
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(f"`{choice}`" for choice in get_args(hint))
    if hint == tuple[tuple[str, float], ...]:
        return "mapping: name → number"
    if hint == PLUGIN_CONFIG:
        return "list of `{name, args}`"
    if origin is tuple:
        return "list of strings"
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in get_args(hint) if a is not type(None)]
        return f"{type_name(inner[0])} or null"
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if hint in names:
        return names[hint]
    raise TypeError(f"the reference does not describe type {hint!r}")


def yaml_value(value: Any) -> str:
    """``value`` as YAML flow, as one would write it in the file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        plain = re.fullmatch(r"[A-Za-z0-9_./:@-]+", value) and not re.fullmatch(
            r"(?i)true|false|yes|no|null|~|[0-9.]+", value
        )
        return value if plain else '"' + value.replace('"', '\\"') + '"'
    if isinstance(value, tuple) and all(
        isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) for item in value
    ):
        if not value:
            return "[]"
        return "{" + ", ".join(f"{name}: {yaml_value(v)}" for name, v in value) + "}"
    if isinstance(value, tuple):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if dataclasses.is_dataclass(value):
        return (
            "{"
            + ", ".join(
                f"{f.name}: {yaml_value(getattr(value, f.name))}" for f in dataclasses.fields(value)
            )
            + "}"
        )
    raise TypeError(f"the reference does not write {value!r}")


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "—"


def _table(keys: tuple[Key, ...], name_of: Any) -> list[str]:
    lines = [
        "| key | type | default | applies | description |",
        "|---|---|---|---|---|",
    ]
    for key in keys:
        applies = "live" if key.live else "restart"
        lines.append(
            f"| `{name_of(key)}` | {_cell(key.type)} | `{_cell(key.default)}` | {applies} "
            f"| {_cell(key.description)} |"
        )
    return lines


def _where(cls: type) -> str:
    return f"`{cls.__module__}.{cls.__qualname__}`"


def render(
    root: type, live: tuple[str, ...], plugin_args: Mapping[str, type], intro: str = ""
) -> str:
    """The Markdown reference of ``root`` (a dataclass whose fields are the file's
    top-level keys, every one with a default), ``live`` its top-level keys a reload
    applies, ``plugin_args`` each plugin's args dataclass (``plugin_config``)."""
    out = ["# Configuration reference", "", GENERATED_BY, ""]
    if intro:
        out += [intro.strip(), ""]
    count = 0
    for section in sections(root, root(), live):
        count += len(section.keys)
        title = f"`{section.path}`" if section.path else "Top level"
        out += [f"## {title}", "", f"{_where(section.cls)}: {class_doc(section.cls)}", ""]
        if section.keys:
            out += [*_table(section.keys, lambda key: key.path), ""]
    for plugin, args in plugin_args.items():
        head = f"cycle.profile.plugin_config[{plugin}].args"
        out += [f"## `{head}`", "", f"{_where(args)}: {class_doc(args)}", ""]
        for section in sections(args, args(), ("cycle",), f"{head}.", top="cycle"):
            count += len(section.keys)
            out += [*_table(section.keys, lambda key: key.path), ""]
        out += [
            "```yaml",
            "cycle:",
            "  profile:",
            "    plugin_config:",
            f"      - name: {plugin}",
            f"        args: {yaml_value(args())}",
            "```",
            "",
        ]
    out += [f"{count} keys.", ""]
    return "\n".join(out)
