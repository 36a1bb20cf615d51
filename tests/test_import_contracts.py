"""Every module of ``scheduler`` is under the "only the adapters and the CLI wiring talk
to Redis and Kubernetes" contract (pyproject.toml), so a new module is checked by
``lint-imports`` without anyone adding it to a list; only the wiring is exempt."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.packages import PACKAGES

REPO = Path(__file__).resolve().parents[1]
CONTRACT = "only the adapters and the CLI wiring talk to Redis and Kubernetes"
WIRING = {
    "scheduler.adapters",
    "scheduler.entry.cli",
    "scheduler.entry.cli_common",
    "scheduler.entry.config",
    "scheduler.entry.extender_cli",
}
"""The modules allowed to reach Redis and Kubernetes: the adapters and the entry points
that wire them (and the config that assembles their settings)."""


def contract() -> dict[str, Any]:
    settings = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (found,) = [c for c in settings["contracts"] if c["name"] == CONTRACT]
    return found


def children(package: str = "scheduler") -> list[str]:
    """``PACKAGE.X`` for every module and subpackage directly under ``package``."""
    root = REPO.joinpath(*package.split("."))
    names = [p.stem for p in root.glob("*.py") if p.stem != "__init__"]
    names += [p.parent.name for p in root.glob("*/__init__.py")]
    return sorted(f"{package}.{name}" for name in names)


def covered(module: str, expressions: list[str]) -> bool:
    """Whether a source module expression (``*`` one level, else the module or a package
    above it, as import-linter reads them with ``as_packages``) covers ``module``."""
    for expression in expressions:
        if "*" in expression:
            if fnmatch.fnmatchcase(module, expression.replace("**", "*")):
                return True
        elif module == expression or module.startswith(expression + "."):
            return True
    return False


def test_every_scheduler_module_is_covered_by_the_contract() -> None:
    sources = contract()["source_modules"]
    uncovered = [m for m in children() if not covered(m, sources)]
    assert not uncovered, f"not under {CONTRACT!r}: {uncovered}"


def test_only_the_wiring_is_exempt() -> None:
    importers = {line.split("->")[0].strip() for line in contract().get("ignore_imports", [])}
    exempt = {importer.removesuffix(".**").removesuffix(".*") for importer in importers}
    assert exempt <= WIRING, f"exempt beyond the wiring: {sorted(exempt - WIRING)}"


def test_the_check_sees_modules_on_disk() -> None:
    assert {"scheduler.signals", "scheduler.entry", "scheduler.adapters"} <= set(children())
    assert {"scheduler.signals.frame", "scheduler.cycle.ports"} <= {
        module for package in children() for module in children(package)
    }


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_import_graph_has_a_circle(package: str) -> None:
    """No module reaches itself through its imports, deferred (function-level) imports
    included; imports for type checking only are not executed and do not count (the
    layers contract forbids upward imports between scheduler's layers; this also covers
    modules inside one layer and the other packages)."""
    import grimp

    graph = grimp.build_graph(package, exclude_type_checking_imports=True)
    modules = [m for m in graph.modules if not graph.is_module_squashed(m)]
    assert len(modules) > 5
    circles = [
        module
        for module in modules
        if any(
            graph.find_shortest_chain(importer=imported, imported=module)
            for imported in graph.find_modules_directly_imported_by(module)
            if imported.startswith(package)
        )
    ]
    assert not circles, f"modules on an import circle: {sorted(circles)}"


def test_the_layers_contracts_list_every_scheduler_module() -> None:
    """The packages of ``scheduler`` in one layers contract, and each package with an
    internal order in its own; each lists every module of its container."""
    settings = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layered = [c for c in settings["contracts"] if c["type"] == "layers"]
    containers = [container for c in layered for container in c["containers"]]
    assert "scheduler" in containers
    assert len(containers) == len(set(containers))
    for layers in layered:
        assert layers["exhaustive"] is True
        (container,) = layers["containers"]
        assert container == "scheduler" or container.startswith("scheduler.")
        listed = {
            f"{container}.{name.strip()}" for layer in layers["layers"] for name in layer.split("|")
        }
        assert listed == set(children(container)), container
