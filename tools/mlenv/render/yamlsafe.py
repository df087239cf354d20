"""Turn any Python value into YAML text that parses back to exactly that value (no injection), and objects
into deterministic YAML documents (libyaml's emitter when PyYAML has it)."""

# yaml is imported where a whole document is dumped (~30-70 ms, python -X importtime): yaml_value alone needs none.
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_ESCAPES = {'"': '\\"', "\\": "\\\\"}


def yaml_string(text: str) -> str:
    """A double-quoted, pure-ASCII YAML scalar: printable ASCII stays, everything else is escaped.

    Escaping every non-ASCII character sidesteps YAML's line-break folding (NEL, LS, PS) and
    PyYAML's rejection of unprintable characters, so the value round-trips byte for byte.
    """
    out = ['"']
    for char in text:
        code = ord(char)
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def yaml_value(value: Any) -> str:
    """Any scalar, mapping or sequence as a single-line YAML flow value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return yaml_string(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{yaml_string(str(k))}: {yaml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(item) for item in value) + "]"
    raise TypeError(f"cannot place a {type(value).__name__} in YAML")


def document(obj: Mapping[str, object]) -> str:
    """One object as a YAML document (``---`` first), deterministic byte for byte."""
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return "---\n" + yaml.dump(obj, Dumper=dumper, sort_keys=False, allow_unicode=False, width=4096)


def to_yaml(objects: Sequence[Mapping[str, object]]) -> str:
    """Objects as one multi-document YAML stream."""
    return "".join(document(obj) for obj in objects)
