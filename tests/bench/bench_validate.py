"""A new process validating one StatefulSet: cached compiled validator vs kubernetes-validate, vs `python -c pass`."""

from __future__ import annotations

import sys
import tempfile

from tests.bench.timing import command, median_time, row

REPEAT = 15
STATEFULSET = {
    "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "ml", "labels": {"app": "ml"}},
    "spec": {"serviceName": "ml-headless", "replicas": 2, "podManagementPolicy": "Parallel",
             "selector": {"matchLabels": {"app": "ml"}},
             "template": {"metadata": {"labels": {"app": "ml"}},
                          "spec": {"containers": [{"name": "ml", "image": "pytorch:latest", "command": ["sleep", "inf"],
                                                   "resources": {"limits": {"nvidia.com/gpu": 8}},
                                                   "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}],
                                   "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]}}},
}
FAST = ("from mlenv.fastschema.kubernetes import kubernetes_validator\n"
        f"assert kubernetes_validator('apps/v1', 'StatefulSet', '1.30')({STATEFULSET!r})")
SLOW = f"import kubernetes_validate\nkubernetes_validate.validate({STATEFULSET!r}, '1.30', strict=True)"


def run() -> list[dict[str, object]]:
    """Aim: the cached validator within 2x of a bare interpreter start (the whole render must stay within 10x)."""
    bare = median_time(command([sys.executable, "-c", "pass"]), REPEAT)
    with tempfile.TemporaryDirectory() as cache:
        fast = median_time(command([sys.executable, "-c", FAST], env={"MLENV_CACHE_DIR": cache}), REPEAT, warmup=2)
    slow = median_time(command([sys.executable, "-c", SLOW]), REPEAT)
    return [
        row("python -c pass", bare, bare, "python -c pass"),
        row("validate a StatefulSet: cached fastschema", fast, bare, "python -c pass"),
        row("validate a StatefulSet: kubernetes_validate", slow, bare, "python -c pass"),
    ]
