"""The Makefile is a thin front end: targets reach the CLI, and variables reach it as data, never as shell."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml
from _prereq import require

ROOT = Path(__file__).resolve().parents[2]


def make(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-s", *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "MAKEFLAGS": ""})


def test_help_lists_every_workflow_target() -> None:
    require("make")
    listed = make("help").stdout
    for target in ("install", "test", "demo", "lint", "bench", "list-clusters", "validate-cluster", "render-cluster",
                   "deploy-cluster-dry-run", "deploy-cluster", "status-cluster", "sync-multi-node",
                   "shell-multi-node", "exec", "logs", "launch", "nccl-test", "clean-cluster"):
        assert f" {target} " in listed.replace("\x1b[1m", " ").replace("\x1b[0m", " ")


def test_render_target_writes_the_directory(tmp_path: Path) -> None:
    require("make")
    out = tmp_path / "barcelona rdma"
    result = make("render-cluster", "CLUSTER=barcelona", "MODE=rdma", f"OUT={out}")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load((out / "kustomization.yaml").read_text())["resources"][-1] == \
        "03-statefulset-ml-dev-env.yaml"


def test_variables_cannot_inject_shell(tmp_path: Path) -> None:
    require("make")
    marker = tmp_path / "injected"
    result = make("validate-cluster", f"CLUSTER=barcelona; touch {marker}")
    assert result.returncode != 0
    assert "barcelona; touch" in result.stderr and "not found" in result.stderr  # taken as one name
    image = f"registry.example/ml:$TAG;id>{marker}"  # spliced into a shell line, this would create the marker
    result = make("render-cluster", "CLUSTER=barcelona", f"IMAGE={image}")
    assert result.returncode == 0, result.stderr
    statefulset = list(yaml.safe_load_all(result.stdout))[-1]
    assert statefulset["spec"]["template"]["spec"]["containers"][0]["image"] == image  # verbatim, `$` included
    assert not marker.exists()


def test_dry_run_prints_what_deploy_would_apply() -> None:
    require("make")
    dry = make("deploy-cluster-dry-run", "CLUSTER=nerc-production", "MODE=tcp")
    rendered = subprocess.run([shutil.which("mlenv") or str(ROOT / ".venv/bin/mlenv"), "render", "nerc-production",
                               "--mode", "tcp"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert dry.returncode == 0 and dry.stdout == rendered.stdout
    assert [d["kind"] for d in yaml.safe_load_all(dry.stdout)] == [
        "ServiceAccount", "PersistentVolumeClaim", "PersistentVolumeClaim", "Service", "StatefulSet"]
