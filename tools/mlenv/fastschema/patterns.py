"""JSON Schema's ``pattern`` in Python's ``re``: a ``$`` is the end of the value.

JSON Schema searches for a pattern (ECMA-262, no flags) anywhere in the value, and there ``$`` matches only at its
end; Python's ``$`` also matches before a final newline, so ``re.search("^[a-z]+$", "x\\n")`` finds one. Both the
compiled validators and jsonschema (which calls ``re.search`` with the pattern as written) therefore search for
:func:`whole_value` of each pattern instead, and answer alike.
"""

# jsonschema is imported only to explain an invalid document (~300 ms on a busy host, python -X importtime).
from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

# An escape, a whole character class (a "]" or "^]" right after its "[" is a member), a "$", anything else.
_TOKEN = re.compile(r"\\.|\[\^?\]?(?:\\.|[^\]\\])*\]|\$|[^\\\[$]+|.", re.DOTALL)


@cache
def whole_value(pattern: str) -> str:
    """``pattern`` with each ``$`` anchor (unescaped, outside a character class) written ``\\Z``, Python's end of
    the string."""
    return "".join(r"\Z" if piece == "$" else piece for piece in _TOKEN.findall(pattern))


@cache
def draft202012() -> type[Validator]:
    """jsonschema's Draft202012Validator whose ``pattern`` keyword searches for :func:`whole_value`."""
    from jsonschema import Draft202012Validator, ValidationError, validators

    def pattern(validator: Validator, regex: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if validator.is_type(instance, "string") and not re.search(whole_value(regex), instance):
            yield ValidationError(f"{instance!r} does not match {regex!r}")

    extended: type[Validator] = validators.extend(Draft202012Validator, {"pattern": pattern})
    return extended
