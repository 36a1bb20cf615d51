"""No module over ~500 lines without a reason in its docstring (``Size:``), so a module
that grows past one job is split or says why it is one."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.packages import PACKAGES

REPO = Path(__file__).resolve().parents[1]
LIMIT = 520


def test_long_modules_say_why_they_are_one_module() -> None:
    checked = 0
    unexplained: list[str] = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            checked += 1
            text = path.read_text()
            if text.count("\n") <= LIMIT:
                continue
            docstring = ast.get_docstring(ast.parse(text)) or ""
            if "Size:" not in docstring:
                unexplained.append(f"{path.relative_to(REPO)} ({text.count(chr(10))} lines)")
    assert checked > 100
    assert not unexplained, f"over {LIMIT} lines without a 'Size:' reason: {unexplained}"
