"""Where an excluded node's work goes: the one decision of which spare host takes which node's place (ssh.spares,
the spare nodes of a Slurm allocation). Pure: names in, placement out."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from mlenv.errors import OperationError

FORGET = "mlenv nodes --forget-excluded lets the run use them again"


def place(name: str, nodes: Sequence[str], spares: Sequence[str],
          exclude: Collection[str]) -> dict[int, tuple[str, str]]:
    """Node ordinal -> (its excluded host, the spare host that runs it instead), for every node of ``nodes`` (the
    hosts in node order) named in ``exclude``; spares in their order, never an excluded one or one already a node.
    OperationError naming the excluded nodes when the spares are too few (the run must stop, never retry)."""
    left_out = [(ordinal, host) for ordinal, host in enumerate(nodes) if host in exclude]
    usable = [spare for spare in spares if spare not in exclude and spare not in nodes]
    if len(usable) < len(left_out):
        hosts = ", ".join(host for _, host in left_out)
        which = ", ".join(f"node-{ordinal}" for ordinal, _ in left_out)
        if not spares:
            raise OperationError(f"{hosts} must be left out of the run (mlenv nodes says why), and {name} has no "
                                 f"spare node to take their place: stopping. {FORGET}")
        free = f" ({', '.join(usable)})" if usable else ""
        raise OperationError(f"{hosts} must be left out of the run (mlenv nodes says why), and {name} has "
                             f"{len(usable) or 'no'} usable spare{'' if len(usable) == 1 else 's'}{free} for the "
                             f"{len(left_out)} excluded node{'' if len(left_out) == 1 else 's'} ({which}): "
                             f"stopping. {FORGET}")
    return {ordinal: (host, spare) for (ordinal, host), spare in zip(left_out, usable, strict=False)}


def described(placed: Mapping[int, tuple[str, str]]) -> list[str]:
    """One line per node that runs on a spare, as ``launch --dry-run`` shows it."""
    return [f"# node-{ordinal}: {host} excluded, using spare {spare}"
            for ordinal, (host, spare) in sorted(placed.items())]
