"""Kubernetes resource quantities (``128Gi``, ``32``, ``500m``): parse, compare and halve."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": Decimal("0.001"), "": Decimal(1), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6,
            "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18}


def parse_quantity(value: object) -> Decimal | None:
    """Return the quantity's value in base units, or None if it is not a valid non-negative quantity."""
    if isinstance(value, bool):
        return None
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        amount = Decimal(number)
    except InvalidOperation:
        return None
    if amount < 0:
        return None
    if suffix in _BINARY:
        return amount * _BINARY[suffix]
    if suffix in _DECIMAL:
        return amount * _DECIMAL[suffix]
    return amount * (Decimal(10) ** int(suffix[1:]))


def half_of(value: str) -> str:
    """Half a memory quantity, written with the largest binary suffix that keeps it whole (256Gi -> 128Gi)."""
    amount = parse_quantity(value)
    if amount is None:
        raise ValueError(f"not a quantity: {value!r}")
    half = int(amount // 2)
    for suffix, size in sorted(_BINARY.items(), key=lambda item: -item[1]):
        if half >= size and half % size == 0:
            return f"{half // size}{suffix}"
    return str(half)
