"""Pieces of the OpenShift/Kubernetes backend: the CLI client, preflight checks, pod views, waiting, rsh."""
