"""Kubernetes quantities exactly as apimachinery's ParseQuantity reads them, and how bad ones are reported."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from mlenv.config.quantity import QuantityError, half_of, parse_quantity

from tests.unit.config.files import BARCELONA, edited, position, problems

VALID = [
    ("128Gi", Decimal(128 * 2**30)), ("32", Decimal(32)), ("500m", Decimal("0.5")), ("1e3", Decimal(1000)),
    ("1E3", Decimal(1000)), ("1E", Decimal(10**18)), ("1e+3", Decimal(1000)), ("1e-3", Decimal("0.001")),
    ("5.", Decimal(5)), (".5", Decimal("0.5")), ("+.5", Decimal("0.5")), ("1.G", Decimal(10**9)),
    ("-1", Decimal(-1)), ("1.5Gi", Decimal(3 * 2**29)), ("1n", Decimal("1e-9")), ("1u", Decimal("1e-6")),
    ("1k", Decimal(1000)), ("2P", Decimal(2 * 10**15)), ("7Ei", Decimal(7 * 2**60)), ("00010", Decimal(10)),
    ("0.1n", Decimal("1e-9")), ("1e-999999999", Decimal("1e-9")),  # rounded up to a nano, as Kubernetes does
    ("9223372036854775807", Decimal(2**63 - 1)), (128, Decimal(128)), (0.5, Decimal("0.5")), ("0", Decimal(0)),
    ("12E", Decimal(12 * 10**18)), ("9223372036854775808", Decimal(2**63)),  # beyond int64: kept, as inf.Dec
    ("-1e20", Decimal(-10**20)), ("8Ei", Decimal(2**63 - 1)), ("-9Ei", Decimal(1 - 2**63)),  # binary: capped
]

INVALID = [
    (".", None), ("+", None), ("1e", None), ("1 Gi", None), ("1gi", None), ("1K", None), ("1Ki3", None),
    ("1e3Ki", None), ("1.2.3", None), ("\u0661\u0662", None), ("", None), (True, None), (float("inf"), None),
    (" 1Gi", "remove the spaces around it"), ("1Gi\n", "remove the spaces around it"),
    ("1e999999999", "too large: mlenv takes quantities below 10^50"),
    ("1e50", "too large: mlenv takes quantities below 10^50"),
    ("1e99999999999999999999", "the exponent does not fit in 64 bits"),
]


@pytest.mark.parametrize(("text", "value"), VALID, ids=[repr(v[0]) for v in VALID])
def test_valid_quantities_have_kubernetes_values(text: object, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(("text", "hint"), INVALID, ids=[repr(v[0]) for v in INVALID])
def test_invalid_quantities_are_refused_with_a_reason(text: object, hint: str | None) -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity(text)
    assert caught.value.hint == hint


def test_half_of_keeps_the_largest_whole_binary_suffix() -> None:
    assert [half_of(q) for q in ("256Gi", "1.5Gi", "3", "1", "12E", "1e49")] == [
        "128Gi", "768Mi", "1", "0", "5859375000000000Ki", f"{5 * 10**48 // 2**40}Ti"]


@pytest.mark.parametrize(("value", "shown", "reason"), [
    ('"128Gi "', '"128Gi "', "; remove the spaces around it"),
    ("'1e999999999'", '"1e999999999"', "; too large: mlenv takes quantities below 10^50"),
    ("128GB", '"128GB"', ""),
])
def test_a_bad_quantity_in_a_file_is_one_line(value: str, shown: str, reason: str, tmp_path: Path) -> None:
    text = edited(BARCELONA, ("memory: 128Gi", f"memory: {value}"))
    path = tmp_path / "q.yaml"
    assert problems(path, text) == [
        f"{path}:{position(text, 'memory: ' + value)}: resources.requests.memory: expected a Kubernetes quantity such "
        f"as 128Gi, 500Mi, 32 or 500m, got {shown}{reason}"]
