"""A detached run's Secret (``<app>-run``): its control secret, the secrets forwarded to it and its id, which the
pod template mounts as files (an optional ``secret`` volume at podinit.RUN_SECRET_DIR), so that a pod that comes
back after a preemption resumes its share of the run (its PID 1 runs the runtime's ``resume``:
backends/kubernetes/podinit.py, runtime/supervise/detached.py).

Sent as a server-side apply on stdin: the values reach no command line, and no last-applied annotation keeps them.
An attached run (which mlenv resumes itself) removes the Secret, so no pod resumes an older run; clean deletes it."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping

from mlenv.backends.kubeapi.client import Client
from mlenv.backends.kubeapi.naming import KubeHandle, owned_labels, run_secret
from mlenv.runtime.records.runlayout import RESUME_RUN

KIND = "secret"
"""What a launch makes beside the deployment's objects: clean deletes it by mlenv's labels."""


def manifest(target: KubeHandle, run_id: str, secrets: Mapping[str, str]) -> str:
    """The Secret of detached run ``run_id`` with ``secrets`` (variable -> value), as JSON (a YAML document)."""
    values = {**secrets, RESUME_RUN: run_id}
    return json.dumps({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": run_secret(target.app), "namespace": target.namespace, "labels": owned_labels(target.app)},
        "data": {name: base64.b64encode(value.encode()).decode() for name, value in sorted(values.items())},
    })


def keep(client: Client, target: KubeHandle, run_id: str | None, secrets: Mapping[str, str]) -> None:
    """Before a run starts: its Secret for a detached run (``run_id``), none for an attached one (None)."""
    if run_id is not None:
        client.apply(manifest(target, run_id, secrets))
    else:
        client.run("delete", [KIND, run_secret(target.app), "--ignore-not-found", "--wait=false"])
