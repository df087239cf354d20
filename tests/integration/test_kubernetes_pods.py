"""The Kubernetes backend end to end against pods that really run: fakekube from its command line with
``--run-pods``, the real kubectl (WebSocket exec, logs -f) and the real ``mlenv``: deploy, status, exec, sync
(rsync over kubectl exec), a 2x2 torchrun/gloo job, logs, stop and clean."""

from __future__ import annotations

import json
import re

from tests.integration.kube_pods import APP, KubeProject, kube_project, pod_processes  # noqa: F401 - fixture
from tests.integration.local_cluster import TINY_JOB

DONE = re.compile(r"done world_size=4 node_rank=\d")


def test_deploy_sync_exec_torchrun_clean(kube_project: KubeProject) -> None:  # noqa: F811 - fixture
    project = kube_project
    project.ok("deploy", str(project.cluster_file))
    pods = json.loads(project.ok("status", "--json").stdout)["pods"]
    assert [(p["name"], p["phase"], p["ready"]) for p in pods] == [(f"{APP}-{i}", "Running", True) for i in (0, 1)]

    source = project.home / "workspace"
    source.mkdir()
    (source / "tiny.py").write_text(TINY_JOB)
    project.ok("sync", "--source", str(source))
    for ordinal in (0, 1):
        answer = project.ok("exec", "--pod", str(ordinal), "--", "sh", "-c", 'echo "$(hostname) $(pwd)"; ls')
        assert f"{APP}-{ordinal} /workspace" in answer.stdout and "tiny.py" in answer.stdout, answer.stdout

    launched = project.ok("launch", "--launcher", "torchrun", "tiny.py", timeout=300)
    assert DONE.search(launched.stdout), launched.stdout + launched.stderr
    assert "sum 4" in launched.stdout.replace("step 1/3 sum 10", ""), launched.stdout

    project.ok("clean")
    assert not pod_processes(project.pods_root)
