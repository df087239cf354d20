"""``mlenv status --gpus`` and ``mlenv top`` on a local cluster of two nodes: the runtime's GPU reader runs on
every node through the backend's exec, against the nvidia-smi stand-in (the real CLI's formats) first on PATH;
a node that cannot answer is named while the other answers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator

import pytest

from tests._prereq import require
from tests.helpers import MLENV, ROOT
from tests.integration.local_cluster import LocalProject, make_project, require_local

STANDIN = ROOT / "tests" / "fixtures" / "nvidia_smi"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    require_local("processes")
    deployed = make_project(tmp_path_factory.mktemp("gpus"), "lgp", "10.77.71.0/24", "processes")
    deployed.ok("deploy", deployed.name)
    deployed.ok("sync", "--source", str(deployed.source({"noop.py": "pass\n"})))
    yield deployed
    deployed.mlenv("clean", "--delete-data", "--yes")


@pytest.fixture(autouse=True)
def standin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")


def test_status_gpus_of_every_node(project: LocalProject) -> None:
    report = json.loads(project.ok("status", "--gpus", "--json").stdout)
    states = report["gpu_state"]
    assert [(s["node"], s["pod"], s["host"]) for s in states] == [(0, "lgp-app-0", "lgp-app-0"),
                                                                  (1, "lgp-app-1", "lgp-app-1")]
    for state in states:
        h100 = "NVIDIA H100 80GB HBM3"
        assert [(g["index"], g["name"], g["memory_total_mib"], g["ecc"]["volatile_uncorrectable"])
                for g in state["gpus"]] == [(0, h100, 81559, 0), (1, h100, 81559, 0)]
    text = project.ok("status", "--gpus").stdout
    assert "node-1 lgp-app-1 (host lgp-app-1)" in text and text.count("NVIDIA H100 80GB HBM3") == 4
    assert "lgp (local, tcp" in text  # the plain status comes first, as without --gpus


def test_a_node_that_cannot_answer_is_named_and_the_other_answers(project: LocalProject) -> None:
    workspace = project.pod_dir(1) / "workspace"  # the exec cannot enter node 1 (env -C fails)
    assert workspace.is_dir()
    moved = workspace.with_name("workspace.away")
    workspace.rename(moved)
    try:
        result = project.mlenv("status", "--gpus", "--json")
        assert result.returncode == 1, result.stderr
        states = json.loads(result.stdout)["gpu_state"]
        assert "gpus" in states[0] and len(states[0]["gpus"]) == 2
        assert states[1]["node"] == 1 and "No such file or directory" in states[1]["error"]
        text = project.mlenv("status", "--gpus").stdout
        assert "node-1 lgp-app-1: unreachable: " in text and "node-0 lgp-app-0 (host" in text
    finally:
        moved.rename(workspace)


def test_top_refreshes_until_count_and_make_top_until_ctrl_c(project: LocalProject) -> None:
    frames = project.ok("top", "--pod", "1", "--count", "2", "--interval", "0.5").stdout
    assert frames.count("mlenv top: lgp at ") == 2 and "node-0" not in frames and "node-1 lgp-app-1" in frames
    require("make")
    make = subprocess.Popen(["make", "-s", "top", "POD=0"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "MAKEFLAGS": "", "MLENV_HOME": str(project.home)},
                            start_new_session=True)
    assert make.stdout is not None
    seen = []
    for line in make.stdout:  # waits on the first frame, however slow the machine
        seen.append(line)
        if "NVIDIA H100 80GB HBM3" in line:
            break
    os.killpg(make.pid, signal.SIGINT)
    make.wait(timeout=60)
    assert any(line.startswith("node-0 lgp-app-0 (host lgp-app-0)") for line in seen), seen
    assert shutil.which("nvidia-smi") == str(STANDIN / "nvidia-smi")
    assert MLENV.exists()


def test_a_node_without_nvidia_smi_is_named(project: LocalProject, monkeypatch: pytest.MonkeyPatch) -> None:
    path = os.pathsep.join(part for part in os.environ["PATH"].split(os.pathsep) if part != str(STANDIN))
    if shutil.which("nvidia-smi", path=path):
        pytest.skip("this machine has nvidia-smi")
    monkeypatch.setenv("PATH", path)
    states = json.loads(project.ok("status", "--gpus", "--json").stdout)["gpu_state"]
    said = [(state["node"], state["errors"][0]) for state in states]
    assert said == [(n, "GPUs: nvidia-smi not found") for n in (0, 1)]
    text = project.ok("status", "--gpus").stdout
    assert "node-1 " in text and "GPUs: nvidia-smi not found" in text and "No such file" not in text
