"""Helpers for the local-backend tests: a throw-away project (MLENV_HOME) with one local cluster file, the
`mlenv` command run against it, and what must be gone after a clean."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._prereq import require
from tests.helpers import run_mlenv, succeeded

TINY_JOB = """\
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(4) * (rank + 1)
for step in range(1, 4):
    dist.all_reduce(t)
    if rank == 0:
        print(f"step {step}/3 sum {t[0].item():.0f}", flush=True)
dist.barrier()
if rank == 0:
    print(f"done world_size={world} node_rank={os.environ['MLENV_NODE_RANK']}", flush=True)
dist.destroy_process_group()
"""

# No torch import: node 1 fails fast (or, with no argument, nobody does), everyone else would wait for
# five minutes.
FAILING_JOB = """\
import os, sys, time
if sys.argv[1:] == ["--fail"] and os.environ["MLENV_NODE_RANK"] == "1" and os.environ["LOCAL_RANK"] == "0":
    print("failing on purpose", flush=True)
    sys.exit(3)
print("sleeping", flush=True)
time.sleep(300)
"""


# Global rank 0's lines carry its node's prefix, the node's MLENV_NODE_RANK (node 0: ranks are pinned to nodes).
DONE = re.compile(r"^\[node-(\d) r\d\] done world_size=4 node_rank=\1$", re.MULTILINE)


def require_local(isolation: str) -> None:
    """rsync and torch always; root and iproute2 for network namespaces (fail under CI, else skip)."""
    require("rsync", "torch", *(["ip"] if isolation == "namespaces" else []))
    if isolation == "namespaces" and os.geteuid() != 0:
        message = "network namespaces need root"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@dataclass(frozen=True)
class LocalProject:
    """A project directory holding clusters/<name>.yaml; every command runs with MLENV_HOME pointing at it."""

    home: Path
    name: str
    app: str

    def mlenv(self, *args: str, timeout: float = 120, python: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run the real `mlenv` command against this project (by ``python``: ``run_mlenv``)."""
        return run_mlenv(*args, home=self.home, timeout=timeout, python=python)

    def ok(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run `mlenv` and insist that it succeeded."""
        return succeeded(self.mlenv(*args, timeout=timeout))

    def status(self) -> list[dict[str, object]]:
        """The pods of `mlenv status --json`."""
        return list(json.loads(self.ok("status", "--cluster", self.name, "--json").stdout)["pods"])

    def pod_dir(self, ordinal: int) -> Path:
        """Where the local backend keeps pod ``ordinal``."""
        return self.home / ".mlenv" / "local" / f"{self.name}-ns" / f"{self.app}-{ordinal}"

    def source(self, files: dict[str, str]) -> Path:
        """A directory to sync, holding ``files`` (relative path -> text)."""
        source = self.home / "src"
        for relative, text in files.items():
            (source / relative).parent.mkdir(parents=True, exist_ok=True)
            (source / relative).write_text(text)
        return source


def make_project(tmp_path: Path, name: str, subnet: str, isolation: str, storage: str = "") -> LocalProject:
    """A project with one local cluster ``name`` (app ``<name>-app``) on ``subnet``."""
    app = f"{name}-app"
    (tmp_path / "clusters").mkdir()
    (tmp_path / "manifests").mkdir()
    (tmp_path / "clusters" / f"{name}.yaml").write_text(f"""\
backend: local
cluster:
  name: {name}
  namespace: {name}-ns
app:
  name: {app}
network:
  rdma:
    enabled: false
  tcp:
    interface_exclude: "^lo"
gpus:
  per_node: 0
  default_nodes: 2
  procs_per_node: 2
{storage}
local:
  isolation: {isolation}
  interfaces: [ens1f1, ens1f0np0]
  subnet: {subnet}
""")
    return LocalProject(tmp_path, name, app)


@contextmanager
def deployed(directory: Path, name: str, subnet: str, files: dict[str, str]) -> Iterator[LocalProject]:
    """A local cluster of processes ``name``, deployed and synced with ``files``; cleaned, data and all, after."""
    require_local("processes")
    made = make_project(directory, name, subnet, "processes")
    made.ok("deploy", made.name)
    made.ok("sync", "--source", str(made.source(files)))
    yield made
    made.mlenv("clean", "--cluster", made.name, "--delete-data", "--yes")


def torchless_nodes(directory: Path) -> tuple[Path, Path]:
    """(a Python that runs mlenv, the Python without torch its local nodes then run). The local backend runs the
    nodes with the ``python3`` beside mlenv's own interpreter (its virtualenv's bin/ first on their PATH): here a
    virtualenv that reaches mlenv's packages through a .pth file, whose ``python3`` starts a bare virtualenv's."""
    bare, runner = directory / "bare", directory / "runner"
    for venv in (bare, runner):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = runner.glob("lib/python*/site-packages")
    (site / "mlenv-packages.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    nodes = runner / "bin" / "python3"
    nodes.unlink()
    nodes.write_text(f'#!/bin/sh\nexec {shlex.quote(str(bare / "bin" / "python3"))} "$@"\n')
    nodes.chmod(0o755)
    return runner / "bin" / "python", bare / "bin" / "python3"


def leftovers(project: LocalProject) -> list[str]:
    """Everything of ``project``'s deployment that still exists: namespaces, /etc/netns entries, pod
    directories and processes started in its pods."""
    found = []
    prefix = f"mlenv-{project.app}-"
    if os.geteuid() == 0 and os.path.exists("/run/netns"):
        found += [f"netns {n}" for n in os.listdir("/run/netns") if n.startswith(prefix)]
    if os.path.isdir("/etc/netns"):
        found += [f"/etc/netns/{n}" for n in os.listdir("/etc/netns") if n.startswith(prefix)]
    found += [f"dir {p}" for p in (project.home / ".mlenv" / "local").glob(f"*/{project.app}-*")]
    marker = f"MLENV_POD_DIR={project.home}".encode()
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if any(variable.startswith(marker) for variable in environ):
            found.append(f"process {entry.name}")
    return found
