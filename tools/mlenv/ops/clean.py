"""``mlenv clean``: delete what a deployment created (every handle it recorded: a failed re-deploy's and earlier
attempts' too), its data volumes only when asked and confirmed, then forget its record."""

from __future__ import annotations

from mlenv import state
from mlenv.ops.confirm import confirm_data_deletion
from mlenv.ops.target import Target


def clean(target: Target, *, delete_data: bool, yes: bool) -> bool:
    """Clean ``target``; with ``delete_data`` its data volumes too, once confirmed on the terminal (unless
    ``yes``). False when the user did not confirm (nothing deleted)."""
    handles = target.recorded.handles if target.recorded else (target.handle,)
    if delete_data and not yes and not confirm_data_deletion(target.backend.deploy, handles):
        return False
    with state.deploying(target.handle.name):
        for handle in handles:  # a failed re-deploy's too
            target.backend.deploy.clean(handle, delete_data=delete_data)
    state.forget(target.handle.name)
    return True
