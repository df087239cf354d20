"""User text in messages: invisible, look-alike and line-breaking characters are shown escaped, on one line."""

from __future__ import annotations

import pytest
from mlenv.errors import ConfigError, Problem, show_value, shown


@pytest.mark.parametrize(("text", "expected"), [
    ("per\u200b_node", "per\\u200b_node"),  # zero-width space (Cf)
    ("a\nb\rc\td", "a\\nb\\rc\\td"),  # controls (Cc)
    ("x\x85y\u2028z\u2029", "x\\x85y\\u2028z\\u2029"),  # next line (Cc), line and paragraph separators
    ("no\u00a0break", "no\\xa0break"),  # a non-ASCII space (Zs)
    ("bidi\u202e", "bidi\\u202e"),  # right-to-left override (Cf)
    ("tag\U000e0041", "tag\\U000e0041"),  # a tag character (Cf), beyond the BMP
    ("fs\udcff", "fs\\udcff"),  # an undecodable byte of a file name (Cs)
    ("caf\u00e9 \U0001f600", "caf\u00e9 \U0001f600"),  # visible text stays as written
])
def test_shown_escapes_what_cannot_be_seen(text: str, expected: str) -> None:
    assert shown(text) == expected


def test_shown_ascii_only_exposes_look_alike_letters() -> None:
    assert shown("n\u043edes", ascii_only=True) == "n\\u043edes"  # a Cyrillic o
    assert shown("nodes", ascii_only=True) == "nodes"


def test_a_problem_is_one_line_whatever_its_parts_hold() -> None:
    problem = Problem("x\nerror: forged.yaml", 3, 7, "env.A\u2028B", "got \"a\rb\"")
    assert str(problem) == 'x\\nerror: forged.yaml:3:7: env.A\\u2028B: got "a\\rb"'
    assert str(ConfigError([problem, Problem("y.yaml", None, None, "", "file not found")])).splitlines() == [
        'x\\nerror: forged.yaml:3:7: env.A\\u2028B: got "a\\rb"', "y.yaml: file not found"]


def test_show_value_quotes_escapes_and_shortens() -> None:
    assert show_value("a\u2028b") == '"a\\u2028b"'
    assert show_value(["x"] * 30) == '["x", "x", "x", "x", "x", "x", "x", "x", "x", "x", "x", "...'  # 60 characters
