"""``mlenv nodes``: the nodes excluded from a deployment's next runs, and ``--forget-excluded`` to clear them."""

from __future__ import annotations

from mlenv import state
from mlenv.ops.target import Target


def show_excluded(target: Target, forget: bool, as_json: bool) -> int:
    """Print (or clear, then print what was cleared) the excluded nodes of ``target``'s deployment, or of its
    cluster when it is not deployed (its Slurm batch jobs')."""
    from mlenv.ui import info, print_json, table

    name = target.handle.name
    listed = state.forget_excluded(name) if forget else state.load().excluded_of(name)
    if as_json:
        print_json({"cluster": name, "excluded": [] if forget else list(listed),
                    "forgotten": list(listed) if forget else None})
        return 0
    if forget:
        nodes = ", ".join(f"node-{entry['node']}" for entry in listed)
        info(f"{name}: {len(listed)} excluded node{'' if len(listed) == 1 else 's'} forgotten"
             + (f" ({nodes})" if listed else ""))
        return 0
    if not listed:
        print(f"{name}: no node is excluded")
        return 0
    table(f"{name}: excluded from the next runs", ["NODE", "HOST", "SINCE", "WHY"],
          [[f"node-{e['node']}", e.get("host", "-"), e.get("since", "-"), e.get("reason", "-")] for e in listed])
    return 0
