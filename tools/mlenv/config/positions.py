"""Where things stand in a cluster file: key paths, their positions, and how paths are written in messages.
Kept apart from the YAML loader so that the model (and ``import mlenv.config``) does not import yaml."""

from __future__ import annotations

from collections.abc import Mapping

JsonPath = tuple[str | int, ...]


def nearest_position(positions: Mapping[JsonPath, tuple[int, int]],
                     json_path: JsonPath) -> tuple[int, int] | None:
    """Where ``json_path``, or its nearest ancestor that has a position, stands in the file."""
    probe = tuple(json_path)
    while probe:
        if probe in positions:
            return positions[probe]
        probe = probe[:-1]
    return None


def format_path(json_path: JsonPath) -> str:
    """``('network', 'rdma', 'devices', 0)`` -> ``network.rdma.devices[0]``."""
    text = ""
    for part in json_path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text
