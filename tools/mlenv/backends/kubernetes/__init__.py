"""Pieces of the OpenShift/Kubernetes backend: CLI client, preflight checks, pod views, explanations, waiting,
and the rsync remote shell. Constants shared with the rendered StatefulSet live here."""

CONTAINER = "ml-dev"
"""The container of every pod (statefulset.yaml.j2)."""
WORKSPACE = "/workspace"
"""Where the workspace volume is mounted in every pod."""
