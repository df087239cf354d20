"""The Makefile is a thin front end: every target a user types, through make, with the variables it takes; the
values reach the CLI verbatim as data, never as shell or make syntax. Cluster targets run on a local cluster
(pods as processes) in a throw-away project (MLENV_HOME)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests._prereq import require
from tests.integration.local_cluster import DONE, FAILING_JOB, TINY_JOB, LocalProject, make_project, require_local

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("install", "install-train", "install-system", "test", "lint", "bench", "demo", "list-clusters",
           "validate-cluster", "render-cluster", "deploy-cluster-dry-run", "deploy-cluster", "use", "status-cluster",
           "sync-multi-node", "shell-multi-node", "exec", "logs", "launch", "launch-dry-run", "stop", "nccl-test",
           "doctor", "discover", "clean-cluster", "top", "stacks")


def make(*args: str, home: Path | None = None, stdin: str | None = None,
         extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``make -s ARGS`` in the checkout, as a user types it (MLENV_HOME: the project to act on)."""
    env = {**os.environ, "MAKEFLAGS": "", **(extra_env or {})}
    if home is not None:
        env["MLENV_HOME"] = str(home)
    return subprocess.run(["make", "-s", *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False, env=env, input=stdin, start_new_session=True)  # no terminal to ask on


def ok(*args: str, home: Path | None = None, stdin: str | None = None,
       extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = make(*args, home=home, stdin=stdin, extra_env=extra_env)
    assert result.returncode == 0, f"make {' '.join(args)}: {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    """A local cluster ``mk`` deployed through make, its workspace/ holding the test jobs."""
    require("make")
    require_local("processes")
    home = tmp_path_factory.mktemp("make")
    deployed = make_project(home, "mk", "10.77.66.0/24", "processes")
    workspace = home / "workspace"
    workspace.mkdir()
    (workspace / "tiny.py").write_text(TINY_JOB)
    (workspace / "fail.py").write_text(FAILING_JOB)
    ok("deploy-cluster", "CLUSTER=mk", "NODES=2", home=home)
    yield deployed
    make("clean-cluster", "CLUSTER=mk", "DELETE_DATA=1", "YES=1", home=home)


def test_help_lists_every_target() -> None:
    require("make")
    listed = ok("help").stdout.replace("\x1b[1m", " ").replace("\x1b[0m", " ")
    assert [t for t in TARGETS if f" {t} " not in listed] == []


def test_install_targets_are_idempotent() -> None:
    require("make")
    for target in ("install", "install-train", "install-system"):
        assert ok(target).stderr == ""  # everything is there already: nothing to do, nothing said


def test_lint_is_clean() -> None:
    require("make")
    ok("lint")


def test_validate_list_render_and_dry_run(tmp_path: Path) -> None:
    require("make")
    assert "OK clusters/barcelona.yaml: barcelona (openshift, 3 x 4 GPUs, tcp" in ok(
        "validate-cluster", "CLUSTER=barcelona", "MODE=tcp", "NODES=3").stdout
    assert "barcelona" in ok("list-clusters").stdout
    out = tmp_path / "barcelona rdma"
    ok("render-cluster", "CLUSTER=barcelona", "MODE=rdma", "NODES=3", f"OUT={out}")
    assert yaml.safe_load((out / "kustomization.yaml").read_text())["resources"][-1] == \
        "04-statefulset-ml-dev-env.yaml"
    assert yaml.safe_load((out / "04-statefulset-ml-dev-env.yaml").read_text())["spec"]["replicas"] == 3
    dry = ok("deploy-cluster-dry-run", "CLUSTER=nerc-production", "MODE=tcp", "IMAGE=registry.example/ml:2").stdout
    assert dry == ok("render-cluster", "CLUSTER=nerc-production", "MODE=tcp", "IMAGE=registry.example/ml:2").stdout
    assert [d["kind"] for d in yaml.safe_load_all(dry)] == [
        "ServiceAccount", "PersistentVolumeClaim", "PersistentVolumeClaim", "Service", "NetworkPolicy", "StatefulSet"]


def test_variables_reach_the_cli_verbatim(tmp_path: Path, project: LocalProject) -> None:
    marker = tmp_path / "injected"
    result = make("validate-cluster", f"CLUSTER=barcelona; touch {marker}")
    assert result.returncode == 2
    assert "barcelona; touch" in result.stderr and "not found" in result.stderr  # taken as one name
    image = f"registry.example/ml:$TAG;id>{marker}"  # spliced into a shell line, this would create the marker
    rendered = ok("render-cluster", "CLUSTER=barcelona", f"IMAGE={image}").stdout
    statefulset = list(yaml.safe_load_all(rendered))[-1]
    assert statefulset["spec"]["template"]["spec"]["containers"][0]["image"] == image  # verbatim, `$` included
    spliced = f"$(shell touch {marker})"  # expanded by make, this would create the marker
    for variable in ("FOLLOW", "DELETE_DATA", "YES", "POD", "ARGS", "ENV", "NAME", "DETACH", "STEPS", "VENV",
                     "LOG_RANK", "EXPECT_TRANSPORT", "MAX_RESTARTS"):
        shown = make("-n", "clean-cluster", "logs", "launch", "demo", f"{variable}={spliced}")  # print, run nothing
        assert shown.returncode == 0, shown.stderr
    make("status-cluster", f"POD={spliced}", home=project.home)  # and for real, where it runs nothing else
    assert not marker.exists()


def test_cluster_targets_take_cluster_and_pod(project: LocalProject) -> None:
    home = project.home
    ok("use", "NAME=mk", home=home)
    status = ok("status-cluster", "CLUSTER=mk", home=home).stdout
    assert "mk (local, tcp, namespace mk-ns, current)" in status and "mk-app-1" in status
    synced = ok("sync-multi-node", "CLUSTER=mk", home=home).stdout
    assert synced.count(" ok") == 2
    one = ok("exec", "POD=1", "CMD=echo rank=$MLENV_NODE_RANK in $(basename $(dirname $PWD))", home=home).stdout
    assert one == "[node-1] rank=1 in mk-app-1\n"
    every = ok("exec", "CLUSTER=mk", "CMD=echo $MLENV_NODE_RANK", home=home).stdout
    assert sorted(every.splitlines()) == ["[node-0] 0", "[node-1] 1"]
    shell = ok("shell-multi-node", "POD=1", home=home, stdin="echo shell-rank=$MLENV_NODE_RANK\nexit\n")
    assert "shell-rank=1" in shell.stdout + shell.stderr
    assert ok("doctor", "CLUSTER=mk", home=home).stdout.count("PASS") >= 2


def test_launch_logs_stop_and_dry_run(project: LocalProject) -> None:
    home = project.home
    dry = ok("launch-dry-run", "SCRIPT=tiny.py", "LAUNCHER=torchrun", "ARGS=--steps 'two words'", "ENV=HF_TOKEN",
             home=home, extra_env={"HF_TOKEN": "hf_secret"}).stdout
    assert "launch --launcher torchrun --run-dir .mlenv/runs/" in dry and "-- tiny.py --steps 'two words'" in dry
    assert "HF_TOKEN=<forwarded from your environment>" in dry and "hf_secret" not in dry
    expecting = ok("launch-dry-run", "SCRIPT=tiny.py", "EXPECT_TRANSPORT=sockets", home=home).stdout
    assert "--expect-transport sockets -- tiny.py" in expecting
    fast = make("launch-dry-run", "SCRIPT=tiny.py", "EXPECT_TRANSPORT=fast", home=home)
    assert fast.returncode == 2 and "'fast' is not one of 'rdma', 'sockets', 'any'" in fast.stderr
    launched = ok("launch", "SCRIPT=tiny.py", "LAUNCHER=torchrun", "ENV=HF_TOKEN", home=home,
                  extra_env={"HF_TOKEN": "hf_secret"})
    assert DONE.search(launched.stdout), launched.stdout
    assert "hf_secret" not in launched.stdout + launched.stderr
    assert not [p for p in (home / "runs").rglob("*") if p.is_file() and "hf_secret" in p.read_text()]
    logs = ok("logs", "POD=0", "FOLLOW=1", home=home).stdout  # a finished run: follow ends with it
    assert logs == "" or all(line.startswith(("[node-0] ", "[node-0 r")) for line in logs.splitlines())
    rank0 = ok("logs", "LOG_RANK=0", home=home).stdout.splitlines()  # tiny.py prints on rank 0 only
    assert rank0 and all(re.match(r"\[node-\d r0\] ", line) for line in rank0) and "done world_size=4" in rank0[-1]
    unknown = make("logs", "LOG_RANK=9", home=home)
    assert unknown.returncode == 2 and "rank 9 is not in the latest run" in unknown.stderr, unknown.stderr
    detached = ok("launch", "SCRIPT=fail.py", "LAUNCHER=torchrun", "DETACH=1", home=home)
    assert "started in the background" in detached.stderr
    stopped = ok("stop", "CLUSTER=mk", home=home).stdout
    assert stopped.count("stopped node") == 2, stopped


def test_nccl_test_target(project: LocalProject) -> None:
    shutil.copy(ROOT / "workspace" / "allreduce_bench.py", project.home / "workspace")
    ok("sync-multi-node", home=project.home)
    assert "gloo over TCP sockets" in ok("nccl-test", "CLUSTER=mk", home=project.home).stdout


def test_clean_target_keeps_data_unless_asked(project: LocalProject) -> None:
    home = project.home
    ok("clean-cluster", "CLUSTER=mk", home=home)
    assert (project.pod_dir(0) / "workspace" / "tiny.py").is_file()
    refused = make("clean-cluster", "CLUSTER=mk", "DELETE_DATA=1", home=home)  # no terminal to ask on, no YES
    assert refused.returncode == 2 and "YES=1" in refused.stderr
    assert (project.pod_dir(0) / "workspace" / "tiny.py").is_file()
    ok("clean-cluster", "CLUSTER=mk", "DELETE_DATA=1", "YES=1", home=home)
    assert not project.pod_dir(0).exists()
    assert json.loads((home / ".mlenv" / "state.json").read_text())["deployments"] == {}
