"""Kubernetes resource quantities (``"500m"``, ``"1.5Gi"``, ``"2e3"``) as exact integers.

The grammar is the API server's (``k8s.io/apimachinery/pkg/api/resource``)::

    quantity = [sign] digits [ "." digits ] [ suffix ]
    suffix   = binarySI ("Ki" "Mi" "Gi" "Ti" "Pi" "Ei")
             | decimalSI ("n" "u" "m" "" "k" "M" "G" "T" "P" "E")
             | ("e" | "E") [sign] digits

Values are exact (:class:`fractions.Fraction`) and rounded up at the end, as
kube-scheduler does: CPU is counted in millicores (``MilliValue``), everything else in
whole units (``Value``: bytes for memory and ephemeral storage, devices for extended
resources).

Why not the client's ``kubernetes.utils.quantity.parse_quantity``: the model must not
import ``kubernetes`` (only the adapters may: pyproject's import contracts), and the
client's parser goes through Python's ``Decimal``, so it accepts quantities the API server
refuses (``"1_000"`` → 1000). It is faster per parse (measured 1.0 µs against 3.8 µs
here), which does not matter: :func:`resource_amount` caches parsed strings, and a
cluster repeats a handful of them.
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"

_SUFFIXES: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:(?P<exponent>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)
_MAX_EXPONENT = 30
"""Bigger exponents are rejected: no real quantity needs them and they would cost memory."""


class QuantityError(ValueError):
    """Text that is not a Kubernetes quantity; the message shows the accepted forms."""


def parse_quantity(value: object) -> Fraction:
    """Exact value of a quantity string (or a JSON number), e.g. ``"1536Mi"`` → 1610612736.

    Raises :class:`QuantityError` for anything else.
    """
    if isinstance(value, bool):
        raise QuantityError(_explain(value))
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(_explain(value))
        return Fraction(value)
    if not isinstance(value, str):
        raise QuantityError(_explain(value))
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise QuantityError(_explain(value))
    number = Fraction(match["number"])
    exponent = match["exponent"]
    if exponent is not None:
        power = int(exponent[1:])
        if abs(power) > _MAX_EXPONENT:
            raise QuantityError(_explain(value))
        return number * Fraction(10) ** power
    return number * _SUFFIXES[match["suffix"] or ""]


def resource_amount(resource: str, value: object) -> int:
    """Integer amount kube-scheduler compares: ``ceil(q·1000)`` for ``cpu``, else ``ceil(q)``.

    Negative amounts are rejected with :class:`QuantityError` (the API server refuses them).
    """
    if isinstance(value, str):
        return _text_amount(resource == CPU, value)
    return _amount(resource == CPU, value)


@functools.lru_cache(maxsize=4096)
def _text_amount(milli: bool, text: str) -> int:
    # A cluster's pods repeat a few quantities ("100m", "128Mi") tens of thousands of times.
    return _amount(milli, text)


def _amount(milli: bool, value: object) -> int:
    quantity = parse_quantity(value)
    if quantity < 0:
        raise QuantityError(f"{value!r} is negative; resource amounts must be ≥ 0")
    return math.ceil(quantity * 1000 if milli else quantity)


def _explain(value: object) -> str:
    return (
        f"{value!r} is not a Kubernetes quantity; expected a number with an optional suffix "
        "(Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E or an exponent such as e3), "
        'e.g. "500m", "2", "1.5Gi"'
    )
