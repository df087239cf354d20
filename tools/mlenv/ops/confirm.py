"""Ask before ``clean --delete-data`` deletes volumes, listing exactly what would go."""

from __future__ import annotations

import click

from mlenv.backends.base import Backend
from mlenv.plan import Deployment
from mlenv.ui import info


def confirm_data_deletion(backend: Backend, deployment: Deployment) -> bool:
    """List the volumes ``--delete-data`` deletes and ask [y/N]; True to go ahead (also when there are none)."""
    volumes = backend.data_volumes(deployment)
    if not volumes:
        info(f"no data volumes of {deployment.app} in {deployment.namespace}")
        return True
    info(f"--delete-data deletes these {len(volumes)} volumes of {deployment.app} in {deployment.namespace} "
         "and everything stored on them:")
    for name in volumes:
        info(f"  {name}")
    try:
        return click.confirm("Delete them?", default=False, err=True)
    except click.Abort:
        return False
