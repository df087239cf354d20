"""Backends: the only code that talks to the outside world (oc/kubectl, ip netns, subprocesses, ...).
Each is found by name in ``registry.BACKENDS`` and imported only when used."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, cast

from mlenv.backends.registry import BACKENDS
from mlenv.errors import UsageError

if TYPE_CHECKING:
    from mlenv.backends.base import Backend

def get(name: str) -> Backend:
    """A backend called ``name``, made now (it reads what it needs of this machine when made)."""
    info = BACKENDS.get(name)
    if info is None:
        raise UsageError(f"unknown backend {name!r}: expected one of {', '.join(sorted(BACKENDS))}")
    module, _, attribute = info.factory.partition(":")
    return cast("Backend", getattr(import_module(module), attribute)())
