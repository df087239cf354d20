"""Load a cluster YAML file keeping the position of every key, and rejecting duplicate keys."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mlenv.errors import ConfigError, Problem

JsonPath = tuple[str | int, ...]


@dataclass
class LoadedFile:
    """A parsed YAML document plus where each key (or list item) stood in the file."""

    path: str
    data: Any
    positions: dict[JsonPath, tuple[int, int]] = field(default_factory=dict)

    def position(self, json_path: JsonPath) -> tuple[int | None, int | None]:
        """Line and column (1-based) of ``json_path`` or its nearest ancestor; 1:1 for the document itself."""
        found = nearest_position(self.positions, json_path)
        if found is not None:
            return found
        return (1, 1) if self.positions else (None, None)


def nearest_position(positions: Mapping[JsonPath, tuple[int, int]],
                     json_path: JsonPath) -> tuple[int, int] | None:
    """Where ``json_path``, or its nearest ancestor that has a position, stands in the file."""
    probe = tuple(json_path)
    while probe:
        if probe in positions:
            return positions[probe]
        probe = probe[:-1]
    return None


class _PositionLoader(yaml.SafeLoader):
    """SafeLoader that builds plain Python objects and records key positions and duplicates."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[JsonPath, int, int, int]] = []
        self.positions: dict[JsonPath, tuple[int, int]] = {}


def _walk(loader: _PositionLoader, node: yaml.Node, path: JsonPath) -> Any:
    """Construct ``node`` recursively, recording positions (keys and sequence items)."""
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        result: dict[Any, Any] = {}
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                key = str(key)
            line, col = key_node.start_mark.line + 1, key_node.start_mark.column + 1
            child = (*path, key)
            if key in result:
                loader.duplicates.append((child, line, col, first_line[key]))
            else:
                first_line[key] = line
                loader.positions[child] = (line, col)
            result[key] = _walk(loader, value_node, child)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            loader.positions[(*path, index)] = (item.start_mark.line + 1, item.start_mark.column + 1)
            items.append(_walk(loader, item, (*path, index)))
        return items
    return loader.construct_object(node, deep=True)


def format_path(json_path: JsonPath) -> str:
    """``('network', 'rdma', 'devices', 0)`` -> ``network.rdma.devices[0]``."""
    text = ""
    for part in json_path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def parse_yaml(text: str, display_path: str) -> LoadedFile:
    """Parse one YAML document; raise ConfigError with positions for syntax errors and duplicate keys."""
    loader = _PositionLoader(text)
    try:
        root = loader.get_single_node()
        data = _walk(loader, root, ()) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        reason = exc.problem or exc.context or "invalid YAML"
        raise ConfigError(
            [Problem(display_path, line, col, "", f"invalid YAML: {reason}; fix the syntax at this position")]
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(display_path, None, None, "", f"invalid YAML: {exc}")]) from None
    finally:
        loader.dispose()
    problems = [
        Problem(
            display_path, line, col, format_path(p),
            f"duplicate key (first set on line {first}); keep only one, YAML would silently use the last",
        )
        for p, line, col, first in loader.duplicates
    ]
    if problems:
        raise ConfigError(problems)
    return LoadedFile(display_path, data, loader.positions)


def load_file(path: Path, display_path: str | None = None) -> LoadedFile:
    """Read and parse ``path``; unreadable files are a ConfigError naming the file."""
    shown = display_path or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([Problem(shown, None, None, "", "file not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([Problem(shown, None, None, "", f"cannot read file: {exc}")]) from None
    return parse_yaml(text, shown)
