"""JSON Schema (the Draft 2020-12 keywords mlenv's schemas use) -> source of a module defining ``is_valid``.

Imported only on a cache miss. The generated module is plain Python: one function per schema node that is
the target of a ``$ref`` or has structure of its own (properties, combinators, if), simple subschemas inlined,
regular expressions and key sets as module constants. Each function returns False at the first violated
keyword, True otherwise; this equals ``is_valid`` of :func:`mlenv.fastschema.patterns.draft202012` (jsonschema's
Draft202012Validator, a pattern's ``$`` the end of the value) because every supported keyword is a pure predicate
of the instance, so the order of evaluation does not matter.

Anything the compiler does not implement exactly raises :class:`~mlenv.fastschema.Unsupported`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from urllib.parse import unquote, urldefrag, urljoin

from mlenv.fastschema import Unsupported
from mlenv.fastschema.patterns import whole_value
from mlenv.runtime.records.jsonvalue import JsonObject, JsonValue

DIALECTS = frozenset({"https://json-schema.org/draft/2020-12/schema", "https://json-schema.org/draft/2020-12/schema#"})

# Keywords jsonschema's Draft202012Validator acts on, split into the ones compiled here and the ones refused.
# Any other key is an annotation (description, title, default, x-*, nullable, ...) that jsonschema ignores too;
# so are "then" and "else" without "if".
SUPPORTED = frozenset({
    "$ref", "additionalProperties", "allOf", "anyOf", "const", "enum", "exclusiveMaximum", "exclusiveMinimum",
    "format", "if", "items", "maxItems", "maxLength", "maximum", "minItems", "minLength", "minimum", "not", "oneOf",
    "pattern", "properties", "propertyNames", "required", "type",
})
UNSUPPORTED = frozenset({
    "$dynamicRef", "contains", "dependentRequired", "dependentSchemas", "maxProperties", "minProperties",
    "multipleOf", "patternProperties", "prefixItems", "unevaluatedItems", "unevaluatedProperties", "uniqueItems",
})

INTEGER = "(isinstance({v}, int) and not isinstance({v}, bool) or isinstance({v}, float) and {v}.is_integer())"
TYPE_TESTS = {
    "array": "isinstance({v}, list)",
    "boolean": "isinstance({v}, bool)",
    "integer": INTEGER,
    "null": "{v} is None",
    "number": "_number({v})",
    "object": "isinstance({v}, dict)",
    "string": "isinstance({v}, str)",
}
NUMERIC = {"minimum": "<", "maximum": ">", "exclusiveMinimum": "<=", "exclusiveMaximum": ">="}
LENGTHS = {"minLength": "<", "maxLength": ">"}
COUNTS = {"minItems": "<", "maxItems": ">"}
# Subschemas reached through these keywords may be inlined into their parent (one level deep).
INLINE_APPLICATORS = ("items", "additionalProperties", "propertyNames")
STRUCTURE = ("properties", "allOf", "anyOf", "oneOf", "not", "if")

NUMBER_HELPER = '''\n
def _number(value):
    # jsonschema's "number": a numbers.Number that is not a bool (numbers is imported only for exotic types)
    if isinstance(value, (int, float)):
        return not isinstance(value, bool)
    if isinstance(value, (str, list, dict)) or value is None:
        return False
    import numbers
    return isinstance(value, numbers.Number)'''

Location = tuple[str, str]  # (document URI, JSON pointer)


def _indent(lines: list[str], levels: int = 1) -> list[str]:
    return [" " * 4 * levels + line for line in lines]


def _fail_if(condition: str) -> list[str]:
    return [f"if {condition}:", "    return False"]


def _fail_unless(condition: str) -> list[str]:
    return _fail_if(f"not ({condition})" if " or " in condition or " and " in condition else f"not {condition}")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _pointer(pointer: str, segment: str) -> str:
    return f"{pointer}/{segment.replace('~', '~0').replace('/', '~1')}"


def _document_uri(document: JsonValue, fallback: str) -> str:
    """A document's base URI: its ``$id`` where it has one, else the URI it was registered under."""
    if isinstance(document, dict) and "$id" in document:
        if not isinstance(document["$id"], str):
            raise Unsupported(f"$id must be a string, got {document['$id']!r}")
        return urldefrag(document["$id"])[0]
    return fallback


def _scalar_test(value: object, var: str) -> str:
    """``var`` equals ``value`` as jsonschema's ``equal`` decides (bools are never numbers)."""
    if value is None or isinstance(value, bool):
        return f"{var} is {value!r}"
    if isinstance(value, str):
        return f"{var} == {value!r}"
    if _is_number(value):
        return f"({var} == {value!r} and not isinstance({var}, bool))"
    raise Unsupported(f"enum/const values must be strings, numbers, booleans or null, got {value!r}")


class Generator:
    """Builds the module source for one root schema and the documents its ``$ref``s point to."""

    def __init__(self, root: JsonValue, documents: Mapping[str, JsonValue]) -> None:
        self.base = _document_uri(root, "")
        self.documents: JsonObject = {self.base: root}
        for uri, document in documents.items():
            self.documents[_document_uri(document, urljoin(self.base, uri))] = document
        self.constants: dict[str, str] = {}  # source expression -> constant name
        self.names: dict[Location, str] = {(self.base, ""): "is_valid"}
        self.pending: list[tuple[Location, JsonValue]] = [((self.base, ""), root)]
        self.needs_number = False

    def module(self, key: str) -> str:
        """The whole module: constants, then the functions, then ``KEY`` (checked on every load)."""
        functions: list[str] = []
        while self.pending:
            location, node = self.pending.pop(0)
            functions += ["", "", *self._function(location, node)]
        lines = [f"# Generated by mlenv.fastschema from {key!r}. Do not edit: rebuilt when stale or corrupt.",
                 "import re" if any(name.startswith("RE_") for name in self.constants.values()) else ""]
        lines += [f"{name} = {expression}" for expression, name in self.constants.items()]
        if self.needs_number:
            lines.append(NUMBER_HELPER)
        return "\n".join([*lines, *functions, "", "", f"KEY = {key!r}", ""])

    def _function(self, location: Location, node: JsonValue) -> list[str]:
        body = self._node(node, "x", location, 0)
        return [f"def {self.names[location]}(x):", f"    # {location[0]}#{location[1]}",
                *_indent(body), *([] if body == ["return False"] else ["    return True"])]

    def _function_for(self, location: Location, node: JsonValue) -> str:
        """The name of the function validating ``node`` at ``location``, queued for generation if new."""
        if location not in self.names:
            stem = re.sub(r"[^0-9A-Za-z]+", "_", location[1].replace("/properties/", "/").replace("$defs/", ""))
            name = "_" + (stem.strip("_")[-80:] or "document")
            while name in self.names.values() or name == "_number":
                name += "_"
            self.names[location] = name
            self.pending.append((location, node))
        return self.names[location]

    def _resolve(self, ref: object, base: str) -> tuple[Location, JsonValue]:
        """The location and contents a ``$ref`` points to (JSON pointers into registered documents only)."""
        if not isinstance(ref, str):
            raise Unsupported(f"$ref must be a string, got {ref!r}")
        uri, fragment = urldefrag(urljoin(base, ref))
        if uri not in self.documents:
            raise Unsupported(f"$ref {ref!r} points to {uri!r}, which is not among the documents given")
        if fragment and not fragment.startswith("/"):
            raise Unsupported(f"$ref {ref!r} uses an anchor; only JSON pointers are supported")
        node = self.documents[uri]
        pointer = ""
        for raw in unquote(fragment).split("/")[1:] if fragment else []:
            segment = raw.replace("~1", "/").replace("~0", "~")
            try:
                if isinstance(node, list):
                    node = node[int(segment)]
                elif isinstance(node, dict):
                    node = node[segment]
                else:
                    raise TypeError(segment)
            except (KeyError, IndexError, ValueError, TypeError):
                raise Unsupported(f"$ref {ref!r} does not resolve") from None
            pointer = _pointer(pointer, segment)
            if isinstance(node, dict) and "$id" in node:
                raise Unsupported(f"$ref {ref!r} passes through an embedded resource ($id), not supported")
        return (uri, pointer), node

    def _constant(self, expression: str, prefix: str) -> str:
        if expression not in self.constants:
            self.constants[expression] = f"{prefix}_{len(self.constants)}"
        return self.constants[expression]

    def _regex(self, pattern: object) -> str:
        """The constant holding ``pattern`` as searched for: its ``$`` is the end of the value."""
        if not isinstance(pattern, str):
            raise Unsupported(f"pattern must be a string, got {pattern!r}")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise Unsupported(f"pattern {pattern!r} is not a Python regular expression: {exc}") from None
        # compiled on first use through re's own cache: a validator module imports without compiling every pattern
        return self._constant(repr(whole_value(pattern)), "RE")

    def _key_set(self, keys: list[str], prefix: str = "KEYS") -> str:
        return self._constant(f"frozenset({sorted(keys)!r})", prefix)

    def _check(self, node: JsonObject, location: Location) -> None:
        """Refuse what the generated code could not do exactly as jsonschema does."""
        refused = sorted(UNSUPPORTED.intersection(node))
        if refused:
            raise Unsupported(f"keyword {refused[0]!r} at {location[0]}#{location[1]} is not supported")
        if "$id" in node and location[1]:
            raise Unsupported(f"$id inside a document ({location[0]}#{location[1]}) is not supported")
        if "$schema" in node and node["$schema"] not in DIALECTS:
            raise Unsupported(f"$schema {node['$schema']!r} is not Draft 2020-12")

    def _node(self, node: JsonValue, var: str, location: Location, depth: int) -> list[str]:
        """Statements that ``return False`` when ``var`` is not valid under ``node``."""
        if node is True:
            return []
        if node is False:
            return ["return False"]
        if not isinstance(node, dict):
            raise Unsupported(f"schema at {location[0]}#{location[1]} is neither an object nor a boolean")
        self._check(node, location)
        types = self._types(node)
        type_test = " or ".join(TYPE_TESTS[name].format(v=var) for name in types or ()) or "False"
        lines = [] if types is None else _fail_unless(type_test)
        self.needs_number |= "number" in (types or ())
        for keyword in ("enum", "const"):
            if keyword in node:
                lines += _fail_unless(self._enum(node[keyword] if keyword == "enum" else [node[keyword]], var))
        lines += self._guarded(f"isinstance({var}, str)", types, {"string"}, self._string(node, var))
        lines += self._guarded(f"_number({var})", types, {"integer", "number"}, self._number(node, var))
        lines += self._guarded(f"isinstance({var}, dict)", types, {"object"}, self._object(node, var, location, depth))
        lines += self._guarded(f"isinstance({var}, list)", types, {"array"}, self._array(node, var, location, depth))
        return lines + self._applicators(node, var, location, depth)

    @staticmethod
    def _types(node: JsonObject) -> list[str] | None:
        if "type" not in node:
            return None
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        known = [t for t in types if isinstance(t, str) and t in TYPE_TESTS]
        if len(known) < len(types):
            raise Unsupported(f"unknown type {next(t for t in types if t not in known)!r}")
        return known

    def _guarded(self, test: str, types: list[str] | None, kinds: set[str], body: list[str]) -> list[str]:
        """``body`` under ``if test:``, without the test where ``type`` already decided it."""
        if not body or (types is not None and not kinds.intersection(types)):
            return []
        if types and kinds.issuperset(types):
            return body
        self.needs_number |= test.startswith("_number")
        return [f"if {test}:", *_indent(body)]

    def _enum(self, values: object, var: str) -> str:
        if not isinstance(values, list):
            raise Unsupported(f"enum must be an array, got {values!r}")
        strings = [v for v in values if isinstance(v, str)]
        tests = [_scalar_test(v, var) for v in values if not isinstance(v, str)]
        if len(strings) > 1:
            tests.insert(0, f"isinstance({var}, str) and {var} in {self._key_set(strings, 'ENUM')}")
        elif strings:
            tests.insert(0, _scalar_test(strings[0], var))
        return " or ".join(tests) or "False"

    def _string(self, node: JsonObject, var: str) -> list[str]:
        lines = _fail_if(f"not re.search({self._regex(node['pattern'])}, {var})") if "pattern" in node else []
        for keyword, operator in LENGTHS.items():
            if keyword in node:
                if not _is_count(node[keyword]):
                    raise Unsupported(f"{keyword} must be a non-negative integer, got {node[keyword]!r}")
                lines += _fail_if(f"len({var}) {operator} {node[keyword]!r}")
        return lines

    @staticmethod
    def _number(node: JsonObject, var: str) -> list[str]:
        lines: list[str] = []
        for keyword, operator in NUMERIC.items():
            if keyword in node:
                if not _is_number(node[keyword]):
                    raise Unsupported(f"{keyword} must be a finite number, got {node[keyword]!r}")
                lines += _fail_if(f"{var} {operator} {node[keyword]!r}")
        return lines

    def _object(self, node: JsonObject, var: str, location: Location, depth: int) -> list[str]:
        properties = node.get("properties", {})
        required = node.get("required", [])
        extra = node.get("additionalProperties", True)
        if (not isinstance(properties, dict) or not isinstance(extra, (bool, dict))
                or not isinstance(required, list) or not all(isinstance(name, str) for name in required)):
            raise Unsupported(f"malformed properties/required/additionalProperties at {location[0]}#{location[1]}")
        lines = _fail_if(" or ".join(f"{name!r} not in {var}" for name in required)) if required else []
        if extra is False:
            lines += _fail_if(f"not {var}.keys() <= {self._key_set(list(properties))}" if properties else var)
        child = f"v{depth + 1}"
        for name, subschema in properties.items():
            body = self._child(subschema, child, location, ("properties", name), depth)
            if body:
                lines += [f"if {name!r} in {var}:", f"    {child} = {var}[{name!r}]", *_indent(body)]
        body = self._child(extra, child, location, ("additionalProperties",), depth) if isinstance(extra, dict) else []
        if body and properties:
            body = [f"if k{depth + 1} not in {self._key_set(list(properties))}:", *_indent(body)]
            lines += [f"for k{depth + 1}, {child} in {var}.items():", *_indent(body)]
        elif body:
            lines += [f"for {child} in {var}.values():", *_indent(body)]
        if "propertyNames" in node:
            body = self._child(node["propertyNames"], f"k{depth + 1}", location, ("propertyNames",), depth)
            lines += [f"for k{depth + 1} in {var}:", *_indent(body)] if body else []
        return lines

    def _array(self, node: JsonObject, var: str, location: Location, depth: int) -> list[str]:
        lines: list[str] = []
        for keyword, operator in COUNTS.items():
            if keyword in node:
                if not _is_count(node[keyword]):
                    raise Unsupported(f"{keyword} must be a non-negative integer, got {node[keyword]!r}")
                lines += _fail_if(f"len({var}) {operator} {node[keyword]!r}")
        items = node.get("items", True)
        if items is False:
            lines += _fail_if(var)
        elif items is not True:
            body = self._child(items, f"v{depth + 1}", location, ("items",), depth)
            lines += [f"for v{depth + 1} in {var}:", *_indent(body)] if body else []
        return lines

    def _applicators(self, node: JsonObject, var: str, location: Location, depth: int) -> list[str]:
        lines: list[str] = []
        for index, subschema in enumerate(self._list(node, "allOf", location)):
            lines += self._node(subschema, var, (location[0], _pointer(_pointer(location[1], "allOf"), str(index))),
                                depth)
        any_of = self._calls(node, "anyOf", var, location)
        lines += _fail_unless(" or ".join(any_of) or "False") if "anyOf" in node else []
        one_of = self._calls(node, "oneOf", var, location)
        lines += _fail_if(f"[{', '.join(one_of)}].count(True) != 1") if "oneOf" in node else []
        if "not" in node:
            lines += _fail_if(self._call(node["not"], var, (location[0], _pointer(location[1], "not"))))
        if "if" in node:
            lines += self._conditional(node, var, location)
        if "$ref" in node:
            target, contents = self._resolve(node["$ref"], location[0])
            lines += _fail_unless(f"{self._function_for(target, contents)}({var})")
        return lines

    def _conditional(self, node: JsonObject, var: str, location: Location) -> list[str]:
        """if/then/else: ``then`` applies where ``if`` holds, ``else`` where it does not."""
        if "then" not in node and "else" not in node:
            return []
        condition, then, otherwise = (
            self._call(node[keyword], var, (location[0], _pointer(location[1], keyword))) if keyword in node else None
            for keyword in ("if", "then", "else"))
        if then and otherwise:
            return _fail_if(f"not ({then} if {condition} else {otherwise})")
        if then:
            return _fail_if(f"{condition} and not {then}")
        return _fail_if(f"not {condition} and not {otherwise}")

    @staticmethod
    def _list(node: JsonObject, keyword: str, location: Location) -> list[JsonValue]:
        value = node.get(keyword, [])
        if not isinstance(value, list):
            raise Unsupported(f"{keyword} at {location[0]}#{location[1]} must be an array, got {value!r}")
        return value

    def _calls(self, node: JsonObject, keyword: str, var: str, location: Location) -> list[str]:
        pointer = _pointer(location[1], keyword)
        return [self._call(subschema, var, (location[0], _pointer(pointer, str(index))))
                for index, subschema in enumerate(self._list(node, keyword, location))]

    def _call(self, node: JsonValue, var: str, location: Location) -> str:
        """A boolean expression: ``var`` is valid under ``node``."""
        if isinstance(node, bool):
            return repr(node)
        if isinstance(node, dict) and set(node).isdisjoint(SUPPORTED - {"$ref", "format"}) and "$ref" in node:
            self._check(node, location)
            target, contents = self._resolve(node["$ref"], location[0])
            return f"{self._function_for(target, contents)}({var})"
        return f"{self._function_for(location, node)}({var})"

    def _child(self, node: JsonValue, var: str, location: Location, path: tuple[str, ...], depth: int) -> list[str]:
        """Statements for a subschema: inlined when simple, else a call of its own function."""
        pointer = location[1]
        for segment in path:
            pointer = _pointer(pointer, segment)
        if _inlinable(node, 1):
            return self._node(node, var, (location[0], pointer), depth + 1)
        return _fail_unless(f"{self._function_for((location[0], pointer), node)}({var})")


def _inlinable(node: JsonValue, budget: int) -> bool:
    """Simple enough to inline: no properties or combinators, nested applicators at most ``budget`` deep."""
    if not isinstance(node, dict):
        return True
    if any(keyword in node for keyword in STRUCTURE):
        return False
    return all(not isinstance(node.get(keyword), dict) or (budget > 0 and _inlinable(node[keyword], budget - 1))
               for keyword in INLINE_APPLICATORS)


def generate(key: str, root: JsonValue, documents: Mapping[str, JsonValue]) -> str:
    """Source of a module whose ``is_valid(instance)`` validates like :func:`mlenv.fastschema.patterns.draft202012`.

    ``documents`` maps URIs (relative ones resolve against the root's ``$id``) to the documents the
    ``$ref``s point into; a document with an ``$id`` is found under that ``$id`` instead.
    """
    return Generator(root, documents).module(key)
