"""Run:ai backend: a distributed PyTorch workload submitted with the ``runai`` CLI (v1 ``runai submit-dist pytorch``
or v2 ``runai training pytorch submit``), whose pods are then followed, entered and cleaned through the Kubernetes
API with the Kubernetes backend's pieces. Flags, pod names, labels and environment: tests/fixtures/runai/REFERENCE.md.
"""
