"""Label and field selectors: the ``?labelSelector=`` / ``?fieldSelector=`` strings and ``LabelSelector`` objects."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import bad_request

_SET_RE = re.compile(r"^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$")
_EQ_RE = re.compile(r"^([^\s!=]+)\s*(==|=|!=)\s*(\S*)$")
_KEY_RE = re.compile(r"^(!?)\s*([^\s!=(),]+)$")


@dataclass(frozen=True)
class Requirement:
    """One term of a selector: ``key op values``, op one of in, notin, exists, !exists."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a label map satisfies this term."""
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op == "in":
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values  # notin


def _split_terms(text: str) -> list[str]:
    """Split on the commas that are not inside ``( )``."""
    terms, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    terms.append(current.strip())
    return [t for t in terms if t]


def parse_label_selector(text: str) -> list[Requirement]:
    """Parse ``a=b,c!=d,e in (x,y),f notin (z),g,!h`` into requirements (all must hold)."""
    requirements = []
    for term in _split_terms(text):
        if match := _SET_RE.match(term):
            key, op, values = match.groups()
            requirements.append(Requirement(key, op, frozenset(v.strip() for v in values.split(",") if v.strip())))
        elif match := _EQ_RE.match(term):
            key, op, value = match.groups()
            requirements.append(Requirement(key, "notin" if op == "!=" else "in", frozenset({value})))
        elif match := _KEY_RE.match(term):
            negated, key = match.groups()
            requirements.append(Requirement(key, "!exists" if negated else "exists"))
        else:
            raise bad_request(f"unable to parse requirement: {term!r}")
    return requirements


def label_selector_object(selector: Mapping[str, Any] | None) -> list[Requirement]:
    """The requirements of a ``LabelSelector`` object (matchLabels + matchExpressions)."""
    selector = selector or {}
    requirements = [Requirement(k, "in", frozenset({v})) for k, v in (selector.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in selector.get("matchExpressions") or []:
        requirements.append(Requirement(expr["key"], ops[expr["operator"]], frozenset(expr.get("values") or ())))
    return requirements


def labels_match(requirements: list[Requirement], labels: Mapping[str, str] | None) -> bool:
    """Whether a label map satisfies every requirement."""
    labels = labels or {}
    return all(r.matches(labels) for r in requirements)


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse_field_selector(text: str) -> Callable[[Mapping[str, Any]], bool]:
    """Parse ``metadata.name=x,involvedObject.name!=y`` into a predicate on whole objects."""
    checks: list[tuple[str, bool, str]] = []
    for term in _split_terms(text):
        match = _EQ_RE.match(term)
        if not match:
            raise bad_request(f"invalid selector: {term!r}; can't understand {term!r}")
        path, op, value = match.groups()
        checks.append((path, op != "!=", value))

    def predicate(obj: Mapping[str, Any]) -> bool:
        return all((_field_value(obj, path) == value) == equal for path, equal, value in checks)

    return predicate


def exact_name(text: str) -> str:
    """The name a field selector requires (``metadata.name=x``, among other terms or not), as RBAC reads it for a
    list or watch; '' when it requires none."""
    for term in _split_terms(text):
        match = _EQ_RE.match(term)
        if match and match.group(1) == "metadata.name" and match.group(2) != "!=":
            return match.group(3)
    return ""


def selector_string(labels: Mapping[str, str]) -> str:
    """``a=b,c=d`` for a matchLabels map (what a Scale's status.selector holds)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))

