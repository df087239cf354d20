"""Load a cluster YAML file safely, keeping the position of every key and list item.

Each of these is one positioned problem, never a traceback and never unbounded time or memory: a path that is
not a regular file (read at most MAX_BYTES + 1 bytes, opened without blocking), text that is not UTF-8 or holds
characters YAML forbids (NUL), syntax errors (naming where the construct started and where the parser stopped),
duplicate keys, tags other than YAML's standard ones (``!!python/object``, ``!!set``, ``!foo``), integers with
leading zeros (YAML 1.1 reads ``010`` as 8), nesting deeper than MAX_DEPTH and aliases that expand to more than
MAX_ALIAS_NODES nodes (alias bombs). Merge keys (``<<: *defaults``) work as YAML specifies: explicit keys win.
As in YAML 1.2, ``01:00:00`` (sexagesimal in YAML 1.1), dates and ``=`` stay strings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from mlenv.config.positions import JsonPath, format_path, nearest_position
from mlenv.errors import ConfigError, Problem, shown
from mlenv.runtime.regularfile import NotRegularFile, open_regular

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_ALIAS_NODES = 10_000

_TAG = "tag:yaml.org,2002:"
_MAP, _SEQ, _INT, _FLOAT, _MERGE = (_TAG + name for name in ("map", "seq", "int", "float", "merge"))
_SCALAR_TAGS = frozenset(_TAG + name for name in ("str", "int", "float", "bool", "null"))
_LEADING_ZERO = re.compile(r"[-+]?0[0-9_]+")


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


class _Refused(Exception):
    """Loading stops here: the rest of the document cannot be read safely."""

    def __init__(self, mark: yaml.Mark, message: str) -> None:
        super().__init__(message)
        self.mark = mark
        self.message = message


class _Loader(yaml.SafeLoader):
    """SafeLoader whose composer refuses nesting deeper than MAX_DEPTH (it recurses once per level)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _Refused(self.peek_event().start_mark, _too_deep())  # type: ignore[no-untyped-call]
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_TAG + "timestamp", _TAG + "value")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _too_deep() -> str:
    return f"invalid YAML: nested deeper than {MAX_DEPTH} levels; a cluster file needs only a few"


def _where(mark: yaml.Mark) -> tuple[int, int]:
    return mark.line + 1, mark.column + 1


def _shown_tag(tag: str) -> str:
    return "!!" + tag[len(_TAG):] if tag.startswith(_TAG) else tag


_NO_KEY = object()


class _Builder:
    """Turns composed nodes into plain data, recording positions and problems, within the alias budget."""

    def __init__(self, display_path: str, loader: _Loader) -> None:
        self.display_path = display_path
        self.loader = loader
        self.positions: dict[JsonPath, tuple[int, int]] = {}
        self.problems: list[Problem] = []
        self.seen: set[int] = set()
        self.expanded = 0
        self.expansion: yaml.Node | None = None  # the outermost value being expanded through an alias

    def problem(self, node: yaml.Node, path: JsonPath, message: str) -> None:
        line, col = _where(node.start_mark)
        self.problems.append(Problem(self.display_path, line, col, format_path(path), message))

    def visit(self, node: yaml.Node, depth: int) -> None:
        """Count a node; one seen before is reached again through an alias and spends the alias budget."""
        if id(node) in self.seen:
            self.expanded += 1
            if self.expanded > MAX_ALIAS_NODES:
                raise _Refused((self.expansion or node).start_mark,
                               f"invalid YAML: aliases of this value expand to more than {MAX_ALIAS_NODES:,} nodes "
                               f"(an alias bomb?); write the values out or use fewer aliases")
        self.seen.add(id(node))
        if depth > MAX_DEPTH:
            raise _Refused(node.start_mark, _too_deep())

    def build(self, node: yaml.Node, path: JsonPath, depth: int = 1) -> Any:
        """The plain value of ``node`` (dict, list, str, int, float, bool or None) found at ``path``."""
        outermost = self.expansion is None and id(node) in self.seen
        if outermost:
            self.expansion = node
        try:
            return self.construct(node, path, depth)
        finally:
            if outermost:
                self.expansion = None

    def construct(self, node: yaml.Node, path: JsonPath, depth: int) -> Any:
        self.visit(node, depth)
        if isinstance(node, yaml.MappingNode):
            self.check_tag(node, path, _MAP)
            return self.mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            self.check_tag(node, path, _SEQ)
            items = []
            for index, item in enumerate(node.value):
                self.positions[(*path, index)] = _where(item.start_mark)
                items.append(self.build(item, (*path, index), depth + 1))
            return items
        return self.scalar(node, path)

    def check_tag(self, node: yaml.Node, path: JsonPath, *allowed: str) -> bool:
        if node.tag in allowed:
            return True
        self.problem(node, path, f"the YAML tag {_shown_tag(node.tag)} is not allowed: a cluster file holds plain "
                                 f"mappings, lists and values; remove the tag")
        return False

    def mapping(self, node: yaml.MappingNode, path: JsonPath, depth: int) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        first_line: dict[Any, int] = {}
        merges: list[yaml.Node] = []
        for key_node, value_node in node.value:
            key = self.key(key_node, path)
            if key is _NO_KEY:
                continue
            if key in first_line:
                self.problem(key_node, (*path, key), f"duplicate key (first set on line {first_line[key]}); keep "
                                                     f"only one, YAML would silently use the last")
                continue
            first_line[key] = key_node.start_mark.line + 1
            if key_node.tag == _MERGE:
                merges.append(value_node)
            else:
                self.positions[(*path, key)] = _where(key_node.start_mark)
                result[key] = self.build(value_node, (*path, key), depth + 1)
        for key_node, value_node in self.merged_pairs(merges, path, depth + 1):
            key = self.key(key_node, path)
            if key is not _NO_KEY and key not in result:
                self.positions[(*path, key)] = _where(key_node.start_mark)
                result[key] = self.build(value_node, (*path, key), depth + 1)
        return result

    def merged_pairs(self, sources: list[yaml.Node], path: JsonPath,
                     depth: int) -> Iterator[tuple[yaml.Node, yaml.Node]]:
        """(key, value) nodes that ``<<:`` brings in, highest precedence first (YAML's merge key)."""
        for source in sources:
            for mapping in source.value if isinstance(source, yaml.SequenceNode) else [source]:
                self.visit(mapping, depth)
                if not isinstance(mapping, yaml.MappingNode):
                    self.problem(mapping, (*path, "<<"), "expected a mapping, or a list of mappings, to merge "
                                                          "(e.g. <<: *defaults)")
                    continue
                for key, value in mapping.value:
                    if key.tag != _MERGE:
                        self.visit(key, depth)  # a merged key spends the alias budget as an expanded node does
                        yield key, value
                yield from self.merged_pairs([value for key, value in mapping.value if key.tag == _MERGE],
                                             path, depth + 1)

    def key(self, node: yaml.Node, path: JsonPath) -> Any:
        if node.tag == _MERGE:
            return "<<"
        if not isinstance(node, yaml.ScalarNode):
            self.problem(node, path, "a key must be a plain value, not a mapping or a list")
            return _NO_KEY
        key = self.scalar(node, path)
        return key if isinstance(key, (str, int, float, bool)) or key is None else str(key)

    def scalar(self, node: yaml.Node, path: JsonPath) -> Any:
        if not self.check_tag(node, path, *_SCALAR_TAGS):
            return node.value
        text = node.value
        if node.tag in (_INT, _FLOAT) and ":" in text:
            return text  # YAML 1.1 sexagesimal (01:00:00 = 3600); a string in YAML 1.2
        if node.tag == _INT and _LEADING_ZERO.fullmatch(text):
            plain = ("-" if text.startswith("-") else "") + (text.lstrip("+-").replace("_", "").lstrip("0") or "0")
            self.problem(node, path, f"{text} has a leading zero, which YAML reads as an octal number; write "
                                     f"{plain}, or \"{text}\" if you mean the text")
            return text
        try:
            return self.loader.construct_object(node, deep=True)
        except ValueError:  # Python refuses integers of more than 4300 digits
            self.problem(node, path, f"a number of {len(text)} characters is too long; quote it if it is text")
            return text


def _syntax_problem(exc: yaml.MarkedYAMLError, text: str, display_path: str) -> Problem:
    """The problem at the line where the broken construct started, naming where the parser stopped."""
    start, stop, context = exc.context_mark, exc.problem_mark or exc.context_mark, exc.context or ""
    problem = exc.problem or "invalid syntax"
    if stop is None:
        return Problem(display_path, None, None, "", f"invalid YAML: {problem}")
    if start is None or _where(start) == _where(stop):
        line, col = _where(stop)
        return Problem(display_path, line, col, "", f"invalid YAML: {problem}; fix the syntax at this position")
    if not context.startswith("while "):  # "expected a single document", "found duplicate anchor"
        line, col = _where(stop)
        return Problem(display_path, line, col, "", f"invalid YAML: {context} at line {start.line + 1}, {problem} "
                                                    f"here; fix the syntax at this position")
    thing = context.split(" ", 2)[-1]  # "while parsing a flow sequence" -> "a flow sequence"
    stopped = f"parser stopped at line {stop.line + 1}"
    unclosed = (thing in ("a flow sequence", "a flow mapping") and problem.startswith("expected ','")) or (
        thing == "a quoted scalar" and "end of stream" in problem)
    if unclosed and start.index < len(text):
        reason = f"'{text[start.index]}' opened here is never closed ({stopped})"
    else:
        reason = f"{problem} in {thing} that starts here ({stopped}, column {stop.column + 1})"
    line, col = _where(start)
    return Problem(display_path, line, col, "", f"invalid YAML: {reason}")


def _reader_problem(exc: yaml.reader.ReaderError, text: str, display_path: str) -> Problem:
    """A character YAML forbids (NUL, other control characters), at its line and column."""
    offset = min(exc.position, len(text))
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return Problem(display_path, line, col, "", f"invalid YAML: the character U+{exc.character:04X} "
                                                f"({shown(chr(exc.character))}) is not allowed in YAML; remove it")


class _CLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's parser and composer with _Loader's resolvers: the fast way to compose a well-formed file."""

    yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers


def _fast_root(text: str) -> tuple[yaml.Node | None, Any] | None:
    """(root node, loader) composed by libyaml, or None when libyaml is missing or the text is not simply
    well-formed (too deep, or anything libyaml complains about): then the pure-Python path says exactly why.
    The nesting is counted on libyaml's events first, since its composer recurses in C."""
    if _CLoader.__mro__[1] is yaml.SafeLoader:
        return None
    try:
        depth = 0
        for event in yaml.parse(text, Loader=_CLoader):
            depth += isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent))
            depth -= isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent))
            if depth > MAX_DEPTH:
                return None
        loader = _CLoader(text)
        return loader.get_single_node(), loader
    except yaml.YAMLError:
        return None


def parse_yaml(text: str, display_path: str) -> LoadedFile:
    """Parse one YAML document; raise ConfigError with every problem found, each with its position."""
    fast = _fast_root(text)
    if fast is not None:
        return _built(fast[0], fast[1], display_path, text)
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as exc:  # the reader checks a whole string for forbidden characters at once
        raise ConfigError([_reader_problem(exc, text, display_path)]) from None
    try:
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        raise ConfigError([_syntax_problem(exc, text, display_path)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(display_path, None, None, "", f"invalid YAML: {exc}")]) from None
    except _Refused as exc:
        line, col = _where(exc.mark)
        raise ConfigError([Problem(display_path, line, col, "", exc.message)]) from None
    return _built(root, loader, display_path, text)


def _built(root: yaml.Node | None, loader: Any, display_path: str, text: str) -> LoadedFile:
    """The plain data of a composed document, within the budgets, with every problem at its position."""
    builder = _Builder(display_path, loader)
    try:
        data = builder.build(root, ()) if root is not None else None
    except _Refused as exc:
        line, col = _where(exc.mark)
        raise ConfigError([Problem(display_path, line, col, "", exc.message)]) from None
    except yaml.MarkedYAMLError as exc:
        raise ConfigError([_syntax_problem(exc, text, display_path)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(display_path, None, None, "", f"invalid YAML: {exc}")]) from None
    finally:
        loader.dispose()
    if builder.problems:
        unique: dict[tuple[int | None, int | None], Problem] = {}
        for problem in builder.problems:  # a value reached through several aliases repeats its problems
            unique.setdefault((problem.line, problem.column), problem)
        raise ConfigError(sorted(unique.values(), key=lambda p: (p.line or 0, p.column or 0)))
    return LoadedFile(display_path, data, builder.positions)


def _file_problem(display_path: str, message: str) -> ConfigError:
    return ConfigError([Problem(display_path, None, None, "", message)])


def _too_big(display_path: str, size: int | None) -> ConfigError:
    amount = f"{size:,} bytes" if size is not None else "still growing"
    return _file_problem(display_path, f"file is larger than 1 MiB ({amount}); a cluster file is a few KiB, "
                                       f"is this the right file?")


def read_capped(path: str | os.PathLike[str], display_path: str) -> bytes:
    """The bytes of a regular file of at most MAX_BYTES, never blocking on (or reading) pipes and devices."""
    try:
        with open_regular(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_BYTES:
                raise _too_big(display_path, size)
            data = handle.read(MAX_BYTES + 1)
    except NotRegularFile as exc:
        raise _file_problem(display_path, f"not a regular file ({exc.kind}); give the path of a cluster YAML "
                                          "file") from None
    except FileNotFoundError:
        raise _file_problem(display_path, "file not found") from None
    except OSError as exc:
        raise _file_problem(display_path, f"cannot read file: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise _too_big(display_path, None)
    return data


def _decode(data: bytes, display_path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError([Problem(display_path, line, col, "", f"not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                                                               f"save the file as UTF-8")]) from None


def load_file(path: str | os.PathLike[str], display_path: str | None = None) -> LoadedFile:
    """Read and parse ``path``; every way it can be unreadable or unsafe is a ConfigError naming the file."""
    shown_path = display_path or str(path)
    return parse_yaml(_decode(read_capped(path, shown_path), shown_path), shown_path)
