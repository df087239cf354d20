"""Kubernetes resource quantities (``128Gi``, ``32``, ``500m``, ``1e3``): parse, compare and halve.

The syntax is apimachinery's ``ParseQuantity`` grammar (k8s.io/apimachinery/pkg/api/resource/quantity.go)::

    <quantity>        ::= <signedNumber><suffix>
    <signedNumber>    ::= <number> | <sign><number>          <sign> ::= "+" | "-"
    <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <sign>? <digits> | "E" <sign>? <digits>    (an int64, as ParseInt reads it)

with no whitespace anywhere (the API server rejects it). Like Kubernetes, a value is rounded up (away from zero)
to a whole nano; a decimal value beyond 2^63-1 is kept as it is (apimachinery holds it as an ``inf.Dec``: ``12E``
is valid) and a binary one is capped at 2^63-1, as apimachinery caps it. mlenv's own limit: below 10^50.
"""

from __future__ import annotations

import re
from decimal import ROUND_UP, Context, Decimal

from mlenv.errors import show_value

_QUANTITY = re.compile(r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(?:[eE](?P<exponent>[+-]?[0-9]+)|(?P<suffix>[KMGTPE]i|[numkMGTPE]?))")
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_INT64_MAX = 2**63 - 1
_LARGEST = 50
"""Values are below 10^_LARGEST in magnitude (apimachinery has no bound; no machine comes near it)."""
_NANO = Decimal("1e-9")
_EXACT = Context(prec=_LARGEST + 30)  # the integer and 9 fractional digits, and what rounding up needs


class QuantityError(ValueError):
    """Not a usable Kubernetes quantity; ``hint`` says why when the syntax alone is not the reason."""

    def __init__(self, hint: str | None = None) -> None:
        super().__init__(hint or "not in Kubernetes quantity syntax")
        self.hint = hint


def _ten_power(match: re.Match[str]) -> int:
    exponent = match.group("exponent")
    if exponent is None:
        return _DECIMAL.get(match.group("suffix"), 0)
    digits = exponent.lstrip("+-").lstrip("0") or "0"
    if len(digits) > 19 or int(digits) > _INT64_MAX:
        raise QuantityError("the exponent does not fit in 64 bits")
    return -int(digits) if exponent.startswith("-") else int(digits)


def parse_quantity(value: object) -> Decimal:
    """The quantity's value in base units (bytes, cores), as Kubernetes reads it; raises QuantityError."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise QuantityError()
    text = str(value)
    if text != text.strip():
        raise QuantityError("remove the spaces around it")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise QuantityError()
    mantissa, power = Decimal(match.group("number")), _ten_power(match)
    if not mantissa:
        return Decimal(0)
    if mantissa.adjusted() + power >= _LARGEST:
        raise QuantityError(f"too large: mlenv takes quantities below 10^{_LARGEST}")
    if mantissa.adjusted() + power < -10:  # below a nano: Kubernetes rounds it up to 1n
        return _NANO.copy_sign(mantissa)
    binary = match.group("suffix") in _BINARY
    amount = _EXACT.multiply(mantissa.scaleb(power, _EXACT), 2 ** _BINARY.get(match.group("suffix") or "", 0))
    if binary and abs(amount) > _INT64_MAX:  # apimachinery's cap of binary quantities
        amount = Decimal(_INT64_MAX).copy_sign(amount)
    return amount.quantize(_NANO, rounding=ROUND_UP, context=_EXACT)


def half_of(value: str) -> str:
    """Half a memory quantity, written with the largest binary suffix that keeps it whole (256Gi -> 128Gi)."""
    half = int(_EXACT.divide_int(parse_quantity(value), 2))
    for suffix, bits in sorted(_BINARY.items(), key=lambda item: -item[1]):
        size = 2**bits
        if half >= size and half % size == 0:
            return f"{half // size}{suffix}"
    return str(half)


_NUMBER = r"[0-9]{1,9}(?:\.[0-9]{1,9})?"
_BANDWIDTH = re.compile(rf"({_NUMBER}) ?([MGT])([Bb])/s")
_GIGA_SCALE = {"M": 1e-3, "G": 1.0, "T": 1e3}


def parse_bandwidth(value: object) -> float:
    """``180GB/s`` (bytes) or ``1440Gb/s`` (bits), also M and T, in GB/s (decimal gigabytes). The unit is required:
    bytes and bits differ eightfold. QuantityError saying what was expected."""
    text = str(value)
    match = _BANDWIDTH.fullmatch(text) if isinstance(value, str) else None
    if match is None:
        if re.fullmatch(_NUMBER, text):
            raise QuantityError(f"{text} has no unit: write {text}GB/s for gigabytes per second (what nccl-tests "
                                f"reports as busbw) or {text}Gb/s for gigabits (how NICs are rated; 8 bits make "
                                f"a byte)")
        raise QuantityError(f"expected a bandwidth like 180GB/s or 1440Gb/s (bytes: MB/s, GB/s, TB/s; bits: "
                            f"Mb/s, Gb/s, Tb/s), got {show_value(value)}")
    gbytes = float(match[1]) * _GIGA_SCALE[match[2]] / (8 if match[3] == "b" else 1)
    if gbytes <= 0:
        raise QuantityError(f"expected a bandwidth larger than 0, got {show_value(value)}")
    return gbytes


_SECONDS_PER_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600}


def parse_seconds(value: int | str) -> int:
    """A duration the schema accepted (``30``, ``"90s"``, ``"5m"``, ``"1h"``) in seconds."""
    if isinstance(value, int):
        return value
    text = value.strip()
    unit = text[-1] if text[-1:] in _SECONDS_PER_UNIT else ""
    return int(text[: len(text) - len(unit)]) * _SECONDS_PER_UNIT[unit]
