"""Test tiers: the costly things a test needs, read from the code it runs, so that no test is marked by hand.

A test is marked by what it and its fixtures reach: the helpers they call (followed through the test modules'
own helpers) and the prerequisites they name. ``make test-fast`` deselects every marked test; ``make test`` runs
them all. The markers are registered in pyproject.toml (``--strict-markers``)."""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
PREREQ = "tests._prereq"
LOCAL = "tests.integration.local_cluster"
MAKEFILE = "tests.integration.test_makefile"
# The helper module (or ``module:function``) of a costly thing -> its markers.
MODULES = {
    "tests.integration.slurm_cluster": {"slurm"},
    "tests.integration.ssh_hosts": {"sshd"},
    "tests.integration.kube_pods": {"fakekube", "torch"},
    f"{LOCAL}:require_local": {"torch"},  # a local cluster (its nodes run torch jobs), not its project files
    f"{LOCAL}:make_project": {"torch"},
    "venv": {"release"},  # a fresh virtualenv to install the package into
}
HARNESS = {*MODULES, LOCAL, PREREQ}
TIERS = frozenset({"slurm", "sshd", "fakekube", "torch", "netns", "release"})  # pyproject.toml's markers
FAST = "fast"  # the tier of a test with none of them: what `make test-fast` runs
# What a test of a tier typically costs, in seconds on the 2-core machine (a test of several: its costliest); only
# to start the longest work first (:func:`schedule`), never asserted.
COST = {"fakekube": 60, "release": 60, "slurm": 45, "sshd": 45, "torch": 30, "netns": 10}
SPLIT = "SPLIT_ACROSS_WORKERS"
"""A test module that sets this global to True has its tests spread over xdist's workers one by one (they share no
module fixture, project name or run id); any other module's tests run together on one worker."""
TORCH = {"torch", "deepspeed"}  # prerequisites that mean torch
INSTALLING = {"install", "install-train", "install-system", "demo"}  # make targets that install (the demo does)


def markers(test: Callable[..., Any], fixtures: Iterable[Callable[..., Any]],
            fixture: Callable[[str], Iterable[Callable[..., Any]]], params: Iterable[object] = ()) -> set[str]:
    """The markers of a test function run with ``fixtures`` (their functions) and its parameters ``params``;
    ``fixture(name)``: the functions of the fixture ``name`` where the test may ask for it by name
    (``request.getfixturevalue("slurm_cluster")``)."""
    keys = {param for param in params if isinstance(param, str)}
    modules, words = set[str](), set[str]()
    todo, asked = [test, *fixtures], set[str]()
    while todo:
        for module, named in _reached(todo, keys):
            modules.add(module)
            if module not in HARNESS:  # what a test asks for, not what a harness might do
                words |= named
        todo = [function for word in sorted(words - asked) for function in fixture(word)]
        asked |= words
    found = set[str]().union(*(MODULES.get(module, set()) for module in modules))
    if PREREQ in modules and words & TORCH:  # require("torch")
        found.add("torch")
    if LOCAL in modules and "namespaces" in words:  # a local cluster isolated by network namespaces
        found.add("netns")
    if (MAKEFILE in modules or "make" in words) and words & INSTALLING and "-n" not in words:  # not a dry run
        found.add("release")
    return found


def group(item: pytest.Item) -> None:
    """Put ``item`` in its module's xdist group (``--dist loadgroup``): a module's tests run on one worker, so its
    module fixtures are made once and its tests, which may share a project name and so run ids, never run side by
    side; unless the module sets :data:`SPLIT`. Called as each test is collected: xdist names a test by its group
    in a collection hook of its own, which runs before any conftest's."""
    if not getattr(getattr(item, "module", None), SPLIT, False):
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


TIMING = "timing"
"""The marker of a test that judges relative speed (which rank is slower): with xdist's workers it runs afterwards,
in one process with nothing beside it (scripts/test.sh), since busy neighbours make a rank slower for real. Put on
by hand, as what a test asserts cannot be read from what it calls."""
PHASES = {"parallel": False, "timing": True}  # $TEST_PHASE -> whether its tests are the timing ones


def in_phase(item: pytest.Item, phase: str) -> bool:
    """Whether ``item`` runs in the phase ``phase`` of scripts/test.sh (every test when there is none)."""
    return phase not in PHASES or PHASES[phase] == (item.get_closest_marker(TIMING) is not None)


def schedule(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` (marked and grouped) in the order xdist hands their groups out (``--no-loadscope-reorder``): the
    groups of the costliest tests first, so that the longest work does not start last. The order is the same on
    every worker, as xdist needs."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        names = [marker.args[0] for marker in item.iter_markers("xdist_group")]
        groups.setdefault(names[0] if names else item.nodeid, []).append(item)

    def cost(item: pytest.Item) -> int:
        return max((COST[marker.name] for marker in item.iter_markers() if marker.name in COST), default=0)

    ordered = sorted(groups.values(), key=lambda members: -sum(cost(item) for item in members))  # stable
    return [item for members in ordered for item in members]


def _reached(functions: list[Callable[..., Any]], keys: set[str]) -> Iterator[tuple[str, set[str]]]:
    """(module, the strings its code names) for each function reached from ``functions``: those they name, those
    named in turn by the test helpers among them, and the modules they name. Of a table of helpers keyed by a
    test's parameter (a harness per backend), only the one its ``keys`` pick."""
    seen: set[int] = set()
    todo = list(functions)
    while todo:
        function = inspect.unwrap(todo.pop())
        code = getattr(function, "__code__", None)
        if code is None or id(code) in seen:
            continue
        seen.add(id(code))
        names, words = _named(code)
        module = _canonical(function.__module__)
        yield module, words
        yield f"{module}:{function.__qualname__}", set()
        for name in names:
            if name.startswith("tests.") and name in sys.modules:  # imported inside the function
                yield name, set()
                continue
            value = function.__globals__.get(name)
            if isinstance(value, (dict, list, tuple)):  # a table of helpers (a harness per backend)
                values = value if not isinstance(value, dict) else (
                    [value[key] for key in keys & value.keys()] or list(value.values()))
                todo.extend(item for item in values if inspect.isfunction(item) and _ours(item.__module__))
                continue
            if isinstance(value, types.ModuleType):
                yield _canonical(value.__name__), set()
                continue
            module = getattr(value, "__module__", None)
            if not isinstance(module, str):
                continue
            module = _canonical(module)
            yield module, set()
            if _ours(module):  # follow the test helpers, never the project or a library
                todo.extend(_functions(value))


@functools.cache
def _canonical(module: str) -> str:
    """A test module by its path (pytest imports ``tests/integration/test_x.py`` as ``test_x``, a helper imports it
    as ``tests.integration.test_x``): ``tests.integration.test_x`` either way; any other module as it is."""
    path = Path(getattr(sys.modules.get(module), "__file__", None) or "/").resolve()
    return ".".join(path.relative_to(ROOT).with_suffix("").parts) if path.is_relative_to(TESTS) else module


def _ours(module: str) -> bool:
    """A module of the tests (its helpers are followed), not of the project or a library."""
    return _canonical(module).startswith("tests.")


def _named(code: types.CodeType) -> tuple[set[str], set[str]]:
    """The global names and the string constants of ``code`` and of the functions defined inside it."""
    names, words = set(code.co_names), set[str]()
    for const in code.co_consts:
        if isinstance(const, str):
            words.add(const)
        elif isinstance(const, tuple):  # a literal list or tuple of strings
            words |= {item for item in const if isinstance(item, str)}
        elif isinstance(const, types.CodeType):
            inner = _named(const)
            names |= inner[0]
            words |= inner[1]
    return names, words


def _functions(value: object) -> list[Callable[..., Any]]:
    """A function as itself; a class as its methods."""
    if inspect.isclass(value):
        return [member for member in vars(value).values() if inspect.isfunction(member)]
    return [value] if callable(value) else []
