"""Slurm hostlist expansion (``gpu[01-03,07],login1``) without ``scontrol``."""

from __future__ import annotations

import re

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a Slurm hostlist into host names, in the order ``scontrol show hostnames`` gives."""
    hosts: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        hosts.extend(_expand_item(item))
    if not hosts:
        raise ValueError(f"empty Slurm node list {nodelist!r}")
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if depth not in (0, 1):
            raise ValueError(f"unbalanced brackets in Slurm node list {text!r}")
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced brackets in Slurm node list {text!r}")
    items.append(text[start:])
    return [item for item in items if item]


def _expand_item(item: str) -> list[str]:
    """Expand every bracket group of one host pattern (cartesian product, left to right)."""
    match = _BRACKET.search(item)
    if match is None:
        return [item]
    prefix, suffix = item[: match.start()], item[match.end() :]
    tails = _expand_item(suffix)
    return [prefix + value + tail for value in _expand_ranges(match.group(1)) for tail in tails]


def _expand_ranges(spec: str) -> list[str]:
    """``01-03,07`` -> ``['01', '02', '03', '07']``, keeping zero padding."""
    values: list[str] = []
    for part in spec.split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"bad range {part!r} in Slurm node list")
        if not dash:
            values.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"descending range {part!r} in Slurm node list")
        values.extend(f"{n:0{len(low)}d}" for n in range(int(low), int(high) + 1))
    return values
