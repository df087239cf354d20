"""The Makefile is a thin front end: every target a user types, through make, with the variables it takes; the
values reach the CLI verbatim as data, never as shell or make syntax. Cluster targets run on a local cluster
(pods as processes) in a throw-away project (MLENV_HOME)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
import yaml
from mlenv.runtime.launchers import DEFAULT_LAUNCHER

from tests._prereq import require
from tests.helpers import succeeded
from tests.integration.local_cluster import (
    DONE,
    FAILING_JOB,
    TINY_JOB,
    LocalProject,
    leftovers,
    make_project,
    require_local,
)

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("install", "install-train", "install-system", "test", "test-fast", "lint", "bench", "demo", "list-clusters",
           "validate-cluster", "render-cluster", "deploy-cluster-dry-run", "deploy-cluster", "use", "status-cluster",
           "sync-multi-node", "shell-multi-node", "exec", "logs", "launch", "launch-dry-run", "stop", "nccl-test",
           "drill", "doctor", "discover", "clean-cluster", "top", "stacks", "runs")
BOOLEANS = ("FOLLOW", "DELETE_DATA", "YES", "DETACH", "ALL")


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
    return succeeded(make(*args, home=home, stdin=stdin, extra_env=extra_env))


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


def test_make_test_lints_once_and_test_fast_not_at_all() -> None:
    """Lint runs once, as make test's first step (CI fails on it); no test runs it again, test-fast skips it."""
    require("make")
    planned = ok("-n", "test").stdout
    tools = ("bin/ruff\" check", "bin/mypy", "bin/lint-imports", "scripts/shellcheck.sh")
    assert [planned.count(tool) for tool in tools] == [1, 1, 1, 1]
    fast = ok("-n", "test-fast").stdout
    assert "bin/ruff" not in fast and "bin/mypy" not in fast and 'scripts/test.sh -m "not (' in fast, fast
    again = [f'{runner}("lint")' for runner in ("ok", "make")]
    assert [path for path in (ROOT / "tests").rglob("test_*.py") if any(a in path.read_text() for a in again)] == []


def test_make_test_runs_lint_first_ruff_strict_mypy_and_import_linter() -> None:
    require("make")
    planned = ok("-n", "test").stdout.splitlines()  # what make would run, in order, without running it
    steps = [next(i for i, line in enumerate(planned) if needle in line)
             for needle in ("bin/ruff\" check", "bin/mypy", "bin/lint-imports", "scripts/shellcheck.sh",
                            "scripts/test.sh")]
    assert steps == sorted(steps), planned
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["strict"] is True


def test_the_test_script_runs_the_venv_it_is_given(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    marker = tmp_path / "used"
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\ntouch {marker}\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    ran = subprocess.run([str(ROOT / "scripts" / "test.sh"), "-q", "-p", "no:cacheprovider", "tests/unit/test_plot.py"],
                         cwd=ROOT, env={**os.environ, "VENV": str(venv)}, capture_output=True, text=True, timeout=300,
                         check=False)
    assert ran.returncode == 0 and marker.exists(), ran.stdout + ran.stderr


@pytest.mark.parametrize(("target", "variable"), [("exec", "CMD"), ("use", "NAME"), ("discover", "NAME")])
def test_a_required_variable_left_out_stops_make(target: str, variable: str) -> None:
    """Exit 2 naming the variable, before the CLI runs (make exec without CMD ran sh -c "" on every node)."""
    require("make")
    for given in ((), (f"{variable}=",), (f"{variable}= ",)):
        stopped = make("-n", target, *given)  # -n: print the command lines, run nothing
        assert stopped.returncode == 2, stopped.stdout
        assert f"{variable} is required: make {target} {variable}=" in stopped.stderr
        assert "bin/mlenv" not in stopped.stdout
    assert "bin/mlenv" in ok("-n", target, f"{variable}=x").stdout


def test_help_shows_defaults_and_styles_only_a_terminal() -> None:
    require("make")
    listed = ok("help").stdout
    assert "\x1b" not in listed  # piped: no escapes
    launch = next(line for line in listed.splitlines() if line.split()[0] == "launch")
    assert "[SCRIPT=train_multi_node.py]" in launch and f"[LAUNCHER={DEFAULT_LAUNCHER}]" in launch
    nccl = next(line for line in listed.splitlines() if line.split()[0] == "nccl-test")
    assert "[SIZES=1M:1G:4 on GPUs, 4K:4M:4 on CPUs]" in nccl and "NO GATE" in nccl
    assert "CLUSTER= is the current\ndeployment, POD= every node" in listed  # the defaults every target shares
    assert '"${SCRIPT:-train_multi_node.py}"' in ok("-n", "launch").stdout  # the default it names is the one used


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
    held = ok("deploy-cluster-dry-run", "CLUSTER=olivia", "SPARES=1").stdout.splitlines()  # 2 nodes + 1 spare
    assert "#SBATCH --nodes=3" in held and "# mlenv deploy: allocation of 2 nodes and 1 spare for olivia" in held
    refused = make("deploy-cluster-dry-run", "CLUSTER=olivia", "SPARES=-1")
    assert refused.returncode == 2 and "'--spares': -1 is not in the range" in refused.stderr, refused.stderr


def test_max_preemptions_reaches_launch() -> None:
    require("make")
    capped = ok("launch-dry-run", "CLUSTER=barcelona", "MAX_PREEMPTIONS=3").stdout
    assert capped.startswith("# mlenv launch: run ") and "(torchrun)" in capped.splitlines()[0], capped
    detached = ok("launch-dry-run", "CLUSTER=barcelona", "MAX_PREEMPTIONS=3", "DETACH=1").stdout
    assert "--detach --max-preemptions 3" in detached, detached  # the pods' supervisors count them
    refused = make("launch-dry-run", "CLUSTER=olivia", "MAX_PREEMPTIONS=3")  # what a backend cannot do
    assert refused.returncode == 2 and "error: the slurm backend cannot resume a run" in refused.stderr, refused.stderr
    refused = make("launch-dry-run", "CLUSTER=barcelona", "MAX_PREEMPTIONS=-1")
    assert refused.returncode == 2 and "'--max-preemptions': -1 is not in the range" in refused.stderr


def test_on_straggler_reaches_the_nodes_launch() -> None:
    require("make")
    excluded = ok("launch-dry-run", "CLUSTER=slurm-gloo", "ON_STRAGGLER=exclude").stdout
    assert "--on-straggler exclude" in excluded, excluded
    assert "--on-straggler" not in ok("launch-dry-run", "CLUSTER=slurm-gloo", "ON_STRAGGLER=warn").stdout  # the default
    refused = make("launch-dry-run", "CLUSTER=slurm-gloo", "ON_STRAGGLER=sometimes")
    assert refused.returncode == 2 and "Invalid value for '--on-straggler'" in refused.stderr, refused.stderr


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
    for variable in ("POD", "ARGS", "ENV", "NAME", "STEPS", "VENV", "LOG_RANK", "EXPECT_TRANSPORT",
                     "MAX_RESTARTS", "MAX_PREEMPTIONS", "ON_IDLE", "ON_STRAGGLER", "SPARES", "RUN"):
        shown = make("-n", "clean-cluster", "logs", "launch", "deploy-cluster", "demo", f"{variable}={spliced}")
        assert shown.returncode == 0, shown.stderr
    for variable in BOOLEANS:  # not a boolean: a usage error naming it, still never expanded
        refused = make("-n", "clean-cluster", "logs", "launch", "runs", f"{variable}={spliced}")
        assert refused.returncode == 2 and f"{variable}={spliced}: expected 1, yes or true" in refused.stderr
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
    attached = ok("launch", "SCRIPT=tiny.py", "LAUNCHER=torchrun", "DETACH=0", home=home)  # 0 is no
    assert DONE.search(attached.stdout) and "started in the background" not in attached.stderr
    maybe = make("launch", "SCRIPT=tiny.py", "DETACH=maybe", home=home)
    assert maybe.returncode == 2 and "DETACH=maybe: expected" in maybe.stderr and "started" not in maybe.stderr
    detached = ok("launch", "SCRIPT=fail.py", "LAUNCHER=torchrun", "DETACH=1", home=home)
    assert "started in the background" in detached.stderr
    unfollowed = make("logs", "POD=0", "FOLLOW=0", home=home)  # the job sleeps 300 s: following would hang
    assert unfollowed.returncode == 0, unfollowed.stderr
    stopped = ok("stop", "CLUSTER=mk", home=home).stdout
    # a node may have ended of its peer's stop (passed over the control channel) before stop reached it
    assert stopped.count("stopped node") + stopped.count("nothing to stop") == 2 and "stopped node" in stopped, stopped


def test_nccl_test_target(project: LocalProject) -> None:
    shutil.copy(ROOT / "workspace" / "allreduce_bench.py", project.home / "workspace")
    ok("sync-multi-node", home=project.home)
    judged = make("nccl-test", "CLUSTER=mk", "EXPECT=1000GB/s", home=project.home)  # far above what gloo does
    assert judged.returncode != 0 and "gloo over TCP sockets" in judged.stdout, judged.stdout + judged.stderr  # FAIL
    assert "of the expected 1000.00 GB/s (--expect 1000GB/s)" in judged.stdout + judged.stderr


def test_nccl_test_target_reads_an_nccl_tests_output(tmp_path: Path) -> None:
    """make nccl-test READ=FILE judges the file and runs nothing: no cluster, CLUSTER left out."""
    from tests.unit.runtime.test_runtime_nccltests import NEW

    require("make")
    output = tmp_path / "all reduce; $(touch x).txt"
    output.write_text(NEW)
    judged = make("nccl-test", f"READ={output}", "EXPECT=180GB/s", "CLUSTER=nowhere")
    assert judged.returncode == 0, judged.stdout + judged.stderr
    assert "PASS: 196.41 GB/s at 1073741824 bytes is 109% of the expected 180.00 GB/s" in judged.stdout
    failed = make("nccl-test", f"READ={output}", "EXPECT=400GB/s")
    assert failed.returncode != 0 and "FAIL: 196.41 GB/s" in failed.stdout, failed.stdout + failed.stderr
    assert not (ROOT / "x").exists()


def test_clean_target_keeps_data_unless_asked(project: LocalProject) -> None:
    home = project.home
    ok("clean-cluster", "CLUSTER=mk", home=home)
    assert (project.pod_dir(0) / "workspace" / "tiny.py").is_file()
    for kept in (("DELETE_DATA=0", "YES=0"), ("DELETE_DATA=no", "YES=1"), ("DELETE_DATA=False", "YES=")):
        ok("clean-cluster", "CLUSTER=mk", *kept, home=home)
        assert (project.pod_dir(0) / "workspace" / "tiny.py").is_file(), kept
    refused = make("clean-cluster", "CLUSTER=mk", "DELETE_DATA=1", home=home)  # no terminal to ask on, no YES
    assert refused.returncode == 2 and "YES=1" in refused.stderr
    assert (project.pod_dir(0) / "workspace" / "tiny.py").is_file()
    ok("clean-cluster", "CLUSTER=mk", "DELETE_DATA=1", "YES=1", home=home)
    assert not project.pod_dir(0).exists()
    assert json.loads((home / ".mlenv" / "state.json").read_text())["deployments"] == {}


@pytest.mark.parametrize("value", ["1", "yes", "TRUE", "True", "0", "no", "FALSE", "", "maybe", "yes no", "2"])
def test_every_boolean_variable_reads_the_same(value: str) -> None:
    """One helper decides every boolean variable: 1/yes/true and 0/no/false/empty in any case; else exit 2."""
    require("make")
    for variable, target, option in (("FOLLOW", "logs", "--follow"), ("DETACH", "launch", "--detach"),
                                     ("DELETE_DATA", "clean-cluster", "--delete-data"),
                                     ("YES", "clean-cluster", "--yes")):
        shown = make("-n", target, f"{variable}={value}")  # -n: print the command line, run nothing
        if value.lower() in ("maybe", "yes no", "2"):
            assert shown.returncode == 2, shown.stdout
            assert f"{variable}={value}: expected 1, yes or true (or 0, no, false or nothing)" in shown.stderr
            assert "bin/mlenv" not in shown.stdout
            continue
        assert shown.returncode == 0, shown.stderr
        line = shown.stdout.splitlines()[-1]
        assert (option in line.split()) == (value.lower() in ("1", "yes", "true")), line


def test_clean_cluster_twice_is_fine(tmp_path: Path) -> None:
    """As `mlenv clean` twice: the second finds nothing current to delete, says so and exits 0."""
    require("make")
    require_local("processes")
    project = make_project(tmp_path, "twice", "10.77.59.0/24", "processes")
    project.ok("deploy", project.name)  # the current deployment
    ok("clean-cluster", "DELETE_DATA=1", "YES=1", home=tmp_path)
    again = ok("clean-cluster", home=tmp_path)
    assert "nothing to clean" in again.stderr
    assert "nothing to clean" in project.ok("clean").stderr
    assert leftovers(project) == []


def test_a_second_clean_keeping_data_says_nothing_was_left(tmp_path: Path) -> None:
    """The workspaces stay after a clean without --delete-data: a second clean says the pods were cleaned before
    (it removes nothing, so it names no pod removed); --delete-data then deletes the workspaces."""
    require_local("processes")
    project = make_project(tmp_path, "kept", "10.77.80.0/24", "processes")
    project.ok("deploy", project.name)
    first = project.ok("clean", "--cluster", project.name).stderr
    assert "pod kept-app-0 removed" in first and "pod kept-app-1 removed" in first, first
    second = project.ok("clean", "--cluster", project.name).stderr
    assert "removed" not in second and "nothing to clean: the pods of kept-app were cleaned before" in second, second
    third = project.ok("clean", "--cluster", project.name, "--delete-data", "--yes").stderr
    assert "pod kept-app-0 removed with its data" in third, third
    assert leftovers(project) == []
