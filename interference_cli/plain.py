"""Names and messages from the store or the API, printed as text and nothing else.

Node and pod names, namespaces, reasons and messages reach the ``interference`` CLI from
Redis (written by agents and the scheduler) and from the Kubernetes API, so none of them
is trusted to be only text. Printed through rich, ``[link=…]`` or ``[bold]`` would be
markup and ``:name:`` an emoji; printed at all, an ESC sequence would drive the terminal
(``\\x1b[2J`` clears it, OSC 8 makes a link), ``\\r`` would overwrite what came before and a
bidi override (U+202E) would reorder what follows. So every such value goes through
:func:`plain` — each control character (C0, DEL, C1), format character (bidi controls,
zero-width characters, U+FEFF), surrogate and line or paragraph separator is shown as its
escape (``\\x1b``, ``\\u202e``) — and into a :class:`rich.text.Text`, which rich never
parses for markup or emoji (:func:`text`).
"""

from __future__ import annotations

import unicodedata

from rich.text import Text

_SHOWN_AS_ESCAPES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode categories never printed raw: controls, format characters (bidi controls,
zero-width characters), surrogates, line and paragraph separators."""


def plain(value: object) -> str:
    """``str(value)`` with every character of :data:`_SHOWN_AS_ESCAPES` replaced by its
    escape (``\\x1b``, ``\\u202e``); printable text is unchanged."""
    string = str(value)
    if string.isprintable():  # the common case: nothing to replace (fast path)
        return string
    return "".join(_escape(ch) for ch in string)


def _escape(ch: str) -> str:
    if unicodedata.category(ch) not in _SHOWN_AS_ESCAPES:
        return ch
    code = ord(ch)
    return (
        f"\\x{code:02x}"
        if code <= 0xFF
        else f"\\u{code:04x}"
        if code <= 0xFFFF
        else f"\\U{code:08x}"
    )


def text(value: object, style: str = "") -> Text:
    """``value`` as rich text: :func:`plain`, never parsed for markup or emoji."""
    return Text(plain(value), style=style)
