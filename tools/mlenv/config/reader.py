"""``ClusterReader``: typed reads of a schema-valid cluster file, for ``mlenv.config.validate`` and for each
backend's settings parser (``BackendInfo.settings``), and what config reads of the backend registry
(``BackendRules``, ``BackendTable``), which ``mlenv.core`` hands down.

A reader never raises for a bad value: it records a positioned problem (``file:line:col: path: message``) and
returns a usable value, so that every problem of a file is reported at once. A settings parser looks like::

    def parse(reader: ClusterReader) -> SlurmSettings:
        partition = reader.get("slurm", "partition", default="gpu")
        if "," in partition:
            reader.problem(("slurm", "partition"), f"expected one partition, got {show_value(partition)}")
        return SlurmSettings(partition=partition, nodes=reader.integer("slurm", "nodes", default=1, minimum=1))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from mlenv.config.load import LoadedFile
from mlenv.config.positions import JsonPath, format_path
from mlenv.config.quantity import QuantityError, parse_quantity
from mlenv.errors import Problem, show_value
from mlenv.runtime.records.jsonvalue import JsonObject

OWNED_VARIABLES = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                             "NODE_RANK"})
"""Variables mlenv or the launchers set on every node (besides every MLENV_* name)."""
QUANTITY_EXAMPLE = "a Kubernetes quantity such as 128Gi, 500Mi, 32 or 500m"


class BackendRules(Protocol):
    """What config reads of one registered backend (``mlenv.core.registry.BackendInfo`` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def section(self) -> str | None: ...
    @property
    def kube_family(self) -> bool: ...
    @property
    def creates_volumes(self) -> bool: ...
    @property
    def cpu_nodes(self) -> bool: ...
    @property
    def uses(self) -> frozenset[str]: ...
    @property
    def machines(self) -> tuple[str, ...] | None: ...

    def check_common(self, reader: ClusterReader) -> None:
        """The backend's own rules on the common sections, reported with ``reader.problem`` and ``reader.warn``."""

    def parse_settings(self, reader: ClusterReader) -> object | None:
        """Its own section as a frozen dataclass (``Cluster.settings``), bad values reported with
        ``reader.problem``; None when it has no section."""


@dataclass(frozen=True, eq=False)
class BackendTable:
    """The registered backends as config needs them: by name, the default, and the common sections only some
    backends read (``BackendRules.uses``)."""

    backends: Mapping[str, BackendRules]
    default: str
    selective: frozenset[str]


def env_text(value: object) -> str:
    """An environment value from YAML: booleans become 1 and 0 (what NCCL and most tools parse), others text."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _as_int(value: object) -> int | None:
    """``value`` as an int when it is a whole number (3, "3", 3.0), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    try:
        return int(value)
    except (ValueError, OverflowError):  # not digits, thousands of digits, or an infinite float
        return None


def owned_variable(name: str) -> str | None:
    """Why ``name`` cannot be set from ``env:`` (what to do instead), or None when it can."""
    if name.startswith("NCCL_"):
        return f"{name} is an NCCL setting: put it under nccl.env"
    if name.startswith("MLENV_") or name in OWNED_VARIABLES:
        return f"{name} is set by mlenv on every node (ranks and rendezvous); remove it"
    return None


class ClusterReader:
    """Reads a schema-valid cluster file by path, collecting problems and warnings as it goes.

    ``loaded`` is the parsed file, ``backend`` the file's backend; ``problems`` and ``warnings`` fill up as
    fields are read. Paths are the keys from the top of the file: ``reader.get("network", "rdma", "enabled")``.
    """

    def __init__(self, loaded: LoadedFile, backend: BackendRules) -> None:
        self.loaded = loaded
        self.backend = backend
        self.data: JsonObject = loaded.data  # schema_problems checked it is a mapping
        self.problems: list[Problem] = []
        self.warnings: list[str] = []

    def get(self, *path: str, default: Any = None) -> Any:
        """The raw value at ``path`` (as YAML read it), or ``default`` where it is absent or null."""
        node: Any = self.data
        for key in path:
            if not isinstance(node, dict) or node.get(key) is None:
                return default
            node = node[key]
        return node

    def problem(self, path: JsonPath, message: str) -> None:
        """Record a problem at ``path`` (a key or list index path), positioned at it or its nearest ancestor."""
        line, col = self.loaded.position(path)
        self.problems.append(Problem(self.loaded.path, line, col, format_path(path), message))

    def warn(self, message: str) -> None:
        """Record a warning: the file is usable, but probably not what its author meant."""
        self.warnings.append(message)

    def integer(self, *path: str, default: int | None = None, minimum: int = 0,
                maximum: int | None = None) -> int | None:
        """An integer that the file may write as a quoted string ("3"), checked against its range."""
        value = self.get(*path)
        if value is None:
            return default
        number = _as_int(value)
        if number is None or number < minimum or (maximum is not None and number > maximum):
            expected = f"{minimum}-{maximum}" if maximum is not None else f">= {minimum}"
            self.problem(path, f"expected an integer {expected}, got {show_value(value)}")
            return default if number is None else number
        return number

    def names(self, *path: str) -> tuple[str, ...]:
        """A comma-separated string or a YAML list, as a tuple of names."""
        value = self.get(*path)
        if value is None:
            return ()
        items = value.split(",") if isinstance(value, str) else value
        return tuple(str(item).strip() for item in items if str(item).strip())

    def quantity(self, *path: str, default: str | None = None, positive: bool = False) -> str | None:
        """A Kubernetes quantity (``128Gi``, ``32``, ``500m``) as text; never negative, never 0 if ``positive``."""
        value = self.get(*path)
        if value is None:
            return default
        try:
            amount = parse_quantity(value)
        except QuantityError as exc:
            hint = f"; {exc.hint}" if exc.hint else ""
            self.problem(path, f"expected {QUANTITY_EXAMPLE}, got {show_value(value)}{hint}")
            return str(value)
        if amount < 0 or (positive and amount == 0):
            least = "larger than 0" if positive else "of 0 or more"
            self.problem(path, f"expected a quantity {least}, got {show_value(value)}")
        return str(value)

    def env(self, *path: str) -> dict[str, str]:
        """A mapping of environment variables as text; names that mlenv sets itself are problems."""
        variables: dict[str, str] = {}
        for name, value in self.get(*path, default={}).items():
            reason = owned_variable(name)
            if reason is None:
                variables[name] = env_text(value)
            else:
                self.problem((*path, name), reason)
        return variables
