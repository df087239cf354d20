"""One conformance suite for every registered backend: each capability it declares in the registry
(``mlenv.core.registry``), run through the real ``mlenv`` command against the backend's real harness:

    deploy -> status -> exec -> sync -> launch --detach -> status shows the run -> logs -f -> stop
           -> attached launches: one that succeeds, one whose last rank fails, one restarted
           -> (PREEMPTION) one whose last node is taken away, resumed -> (Kubernetes family) one whose last node
              shows a node fault, left out (Run:ai: says it cannot) -> doctor -> clean

against local (pods as processes), ssh (sshd machines), Slurm (slurmctld + slurmd), and Kubernetes, OpenShift and
Run:ai (fakekube from its command line with ``--run-pods``: the pods really run, reached by the real kubectl's
exec; Run:ai through its CLI stand-in). A backend registered without a harness here fails the suite: a new backend
gets these tests by registering and adding its harness.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from mlenv import state
from mlenv.core.capabilities import CAPABILITIES, CHECKS, DEPLOY, JOBS, NODE_ACCESS, Feature
from mlenv.core.registry import BACKENDS, BackendInfo, get

from tests._prereq import clean_environ, require
from tests.helpers import MLENV, run_mlenv, succeeded
from tests.integration.kube_pods import kube_cluster
from tests.integration.local_cluster import make_project, require_local

if TYPE_CHECKING:  # imported at run time as plugins, so that pytest rewrites their asserts
    from tests.integration.slurm_cluster import SlurmCluster
    from tests.integration.ssh_hosts import SshHostsFactory

pytest_plugins = ["tests.integration.slurm_cluster", "tests.integration.ssh_hosts"]
SPLIT_ACROSS_WORKERS = True  # each backend's run is its own, on its own harness: the longest module, spread out

JOB = "conformance_job.py"
JOB_TEXT = """\
import os, time
os.write(1, f"conformance node={os.environ['MLENV_NODE_RANK']} rank={os.environ['RANK']}\\n".encode())
time.sleep(600)
"""
"""Every rank says who it is (one write: the ranks of a node share its log), then waits to be stopped."""
CASES = "conformance_cases.py"
CASES_TEXT = """\
import os, sys, time
case, failing, attempt = sys.argv[1], sys.argv[2], int(os.environ["MLENV_RESTART_COUNT"])
node, rank = os.environ["MLENV_NODE_RANK"], os.environ["RANK"]
os.write(1, f"case {case} attempt={attempt} node={node} rank={rank} on {os.environ.get('MLENV_MACHINE')}\\n".encode())
if node == failing and os.environ["LOCAL_RANK"] == "1" and (case == "fails" or (case == "flaky" and attempt == 0)):
    sys.exit(7)
if node == failing and os.environ["LOCAL_RANK"] == "1" and case == "netfail" and attempt == 0:
    print("NCCL WARN NET/IB : Got completion from peer 10.0.0.1<33092> with error 12, opcode 0, len 0", flush=True)
    sys.exit(1)
while case == "preempted" and attempt == 0:
    time.sleep(0.1)
"""
"""An attached launch's job ``CASE FAILING_NODE``: every rank says who it is (and the machine it runs on); the second
rank of node FAILING_NODE exits 7 in case ``fails``, and in case ``flaky`` on attempt 0 only (MLENV_RESTART_COUNT);
in case ``netfail`` it prints one of NCCL's network failures (a node-fault sign) and exits 1 on attempt 0; in case
``preempted`` every rank of attempt 0 waits until it is taken away."""
CASE_LINE = re.compile(r"^\[node-(?P<tag>\d+)[^\]]*\] case (?P<case>\w+) attempt=(?P<attempt>\d+) node=(?P<node>\d+) "
                       r"rank=(?P<rank>\d+) on (?P<machine>\S+)$", re.MULTILINE)
LINE = re.compile(r"\[node-(?P<tag>\d+)[^\]]*\] conformance node=(?P<node>\d+) rank=(?P<rank>\d+)$")
"""A rank's line as logs shows it: ``[node-N rR] conformance node=N rank=R`` (the runtime tags it)."""
WAIT = 120.0
CALL_TIMEOUT = 240.0


@dataclass(frozen=True)
class Subject:
    """A cluster file ``name`` in the project ``home``, and the environment that reaches its harness."""

    name: str
    home: Path
    env: dict[str, str]
    nodes: int = 2
    take_away: Callable[[int], None] | None = None
    """Take node N away under a run, as a scheduler does (a pod deleted), where the backend's nodes can be."""

    def mlenv(self, *args: str, timeout: float = CALL_TIMEOUT) -> subprocess.CompletedProcess[str]:
        return run_mlenv(*args, cwd=self.home, env=self.env, input="", timeout=timeout)

    def ok(self, *args: str, timeout: float = CALL_TIMEOUT) -> subprocess.CompletedProcess[str]:
        result = succeeded(self.mlenv(*args, timeout=timeout))
        assert "Traceback" not in result.stderr, result.stderr
        return result

    def status(self) -> dict[str, Any]:
        return dict(json.loads(self.ok("status", "-c", self.name, "--json").stdout))


Harness = Callable[[pytest.FixtureRequest, Path], AbstractContextManager[Subject]]


def _project(tmp_path: Path) -> Path:
    """A project directory (MLENV_HOME) whose workspace/ holds the job."""
    home = tmp_path / "home"
    for directory in ("clusters", "manifests", "workspace"):
        (home / directory).mkdir(parents=True, exist_ok=True)
    _jobs_in(home / "workspace")
    return home


def _jobs_in(workspace: Path) -> None:
    """The suite's jobs, in the workspace that sync copies to the nodes."""
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / JOB).write_text(JOB_TEXT)
    (workspace / CASES).write_text(CASES_TEXT)


@contextmanager
def local(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    require_local("processes")
    (tmp_path / "home").mkdir()
    project = make_project(tmp_path / "home", "conf", "10.77.91.0/24", "processes")
    home = _project(tmp_path)
    yield Subject(project.name, home, {**os.environ, "MLENV_HOME": str(home)})


@contextmanager
def ssh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    require("torch", "rsync")
    factory: SshHostsFactory = request.getfixturevalue("ssh_hosts")
    machines = factory(2)
    home = _project(tmp_path)
    (home / "clusters" / "conf.yaml").write_text(yaml.safe_dump({
        "backend": "ssh", "cluster": {"name": "conf"},
        "ssh": {"hosts": [host.spec for host in machines.hosts], "identity_file": str(machines.identity),
                "known_hosts": str(machines.known_hosts), "workdir": f"{machines.workdir}/conf",
                "python": str(MLENV.parent / "python")},
        "gpus": {"per_node": 0, "default_nodes": 2, "procs_per_node": 2}}, sort_keys=False))
    yield Subject("conf", home, {**os.environ, "MLENV_HOME": str(home)})


@contextmanager
def slurm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    require("torch", "rsync")
    cluster: SlurmCluster = request.getfixturevalue("slurm_cluster")
    home = _project(tmp_path)
    (home / "clusters" / "conf.yaml").write_text(yaml.safe_dump({
        "backend": "slurm", "cluster": {"name": "conf"},
        "slurm": {"partition": "debug", "time": "15", "workdir": str(tmp_path / "work"),
                  "setup": [f"source {Path(sys.executable).parent.parent}/bin/activate"]},
        "gpus": {"per_node": 0, "default_nodes": 2, "procs_per_node": 2},
        "network": {"tcp": {"interface_exclude": "^docker0"}}}, sort_keys=False))
    yield Subject("conf", home, clean_environ({**cluster.env, "MLENV_HOME": str(home)}))


def _kube(backend: str) -> Harness:
    @contextmanager
    def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
        """fakekube from its command line with ``--run-pods`` (pods really run), the real kubectl and, for
        Run:ai, the ``runai`` stand-in (:func:`tests.integration.kube_pods.kube_cluster`)."""
        with kube_cluster(tmp_path, backend) as project:
            _jobs_in(project.home / "workspace")

            def delete_pod(node: int) -> None:
                deleted = project.kubectl("delete", "pod", f"ml-dev-env-{node}", "--wait=false")
                assert deleted.returncode == 0, deleted.stderr

            yield Subject(project.cluster_file.stem, project.home, project.env, take_away=delete_pod)

    return harness


HARNESSES: dict[str, Harness] = {"local": local, "ssh": ssh, "slurm": slurm, "kubernetes": _kube("kubernetes"),
                                 "openshift": _kube("openshift"), "runai": _kube("runai")}


def wait_for(condition: Callable[[], bool], what: Callable[[], str], timeout: float = WAIT) -> None:
    """Poll ``condition`` until it holds; fail saying ``what()`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what()}"
        time.sleep(0.2)


class Follower:
    """``mlenv logs -f`` running in the background, its lines collected as they come."""

    def __init__(self, subject: Subject) -> None:
        self.process = subprocess.Popen([str(MLENV), "logs", "-c", subject.name, "--follow"], cwd=subject.home,
                                        env=subject.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        stdin=subprocess.PIPE)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        self.lines.extend(line.rstrip("\n") for line in self.process.stdout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@pytest.mark.parametrize("name", list(BACKENDS))
def test_every_declared_capability_is_implemented(name: str) -> None:
    """What the registry says a backend offers, the backend object offers (checked without any harness)."""
    if name in {"kubernetes", "openshift", "runai"}:
        require("kubectl")
    backend = get(name, state.RECORDS)
    declared = {c.feature for c in CAPABILITIES if backend.info.supports(c.feature)}
    assert [c.feature for c in CAPABILITIES if c.feature in declared and backend.need(c) is not backend.impl] == []
    # the class declares each Protocol it implements, so mypy checks every signature against it (make lint)
    assert {c.feature for c in CAPABILITIES if c.protocol in type(backend.impl).__mro__} == declared


@pytest.mark.parametrize("name", list(BACKENDS))
def test_conformance(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    harness = HARNESSES.get(name)
    assert harness is not None, f"backend {name} is registered but has no harness in {__file__}: add one"
    declared = frozenset(c.feature for c in CAPABILITIES if BACKENDS[name].supports(c.feature))
    with harness(request, tmp_path) as subject:
        try:
            _run(subject, declared, BACKENDS[name])
        finally:
            if DEPLOY.feature in declared:
                subject.mlenv("clean", "-c", subject.name, "--yes", "--delete-data")


def _run(subject: Subject, declared: frozenset[Feature], info: BackendInfo) -> None:
    name = subject.name
    assert DEPLOY.feature in declared, "every backend deploys"
    subject.ok("deploy", name, "--timeout", "180")
    report = subject.status()
    assert [(pod["node"], pod["ready"]) for pod in report["pods"]][:subject.nodes] == [
        (n, True) for n in range(subject.nodes)], report

    if NODE_ACCESS.feature in declared:
        executed = subject.ok("exec", "-c", name, "--", "sh", "-c", 'echo "rank=$MLENV_NODE_RANK"')
        assert sorted(executed.stdout.splitlines()) == [f"[node-{n}] rank={n}" for n in range(subject.nodes)]
        synced = subject.ok("sync", "-c", name, "--json")
        assert json.loads(synced.stdout)["ok"] is True

    if JOBS.feature in declared:
        _jobs(subject)
        _attached(subject)
        if info.supports(Feature.PREEMPTION):
            _resumed(subject)
        if info.kube_family:  # a node judged faulty is left out where the cluster's scheduler places pods elsewhere
            _left_out(subject, info)

    if CHECKS.feature in declared:
        doctor = subject.mlenv("doctor", name, "--json")
        assert doctor.returncode in (0, 1) and "Traceback" not in doctor.stderr, doctor.stderr
        checks = json.loads(doctor.stdout)["checks"]
        assert checks and {check["status"] for check in checks} <= {"PASS", "WARN", "FAIL"}

    subject.ok("clean", "-c", name, "--yes", "--delete-data")
    everything = json.loads(subject.ok("status", "--all", "--json").stdout)
    assert name not in [deployment["name"] for deployment in everything["deployments"]]


def _jobs(subject: Subject) -> None:
    """launch --detach -> status shows the run -> logs -f -> stop -> status shows it ended."""
    name = subject.name
    subject.ok("launch", "-c", name, "--launcher", "torchrun", "--detach", JOB)

    def states() -> dict[str, str]:
        return dict(subject.status().get("run_states") or {})

    running = {str(n): "running" for n in range(subject.nodes)}
    wait_for(lambda: states() == running, lambda: f"the detached run running on every node ({states()})")
    everything = subject.ok("status", "--all", "--json")
    assert not [d for d in json.loads(everything.stdout)["deployments"] if d.get("error")], everything.stdout

    follower = Follower(subject)
    try:
        def seen() -> list[tuple[int, int]]:
            """(node, global rank) of every rank's line, from a node tagged as it says (torchrun gives out the
            global ranks)."""
            found = (LINE.search(line) for line in follower.lines)
            return sorted((int(m["node"]), int(m["rank"])) for m in found if m and m["node"] == m["tag"])

        wait_for(lambda: [node for node, _ in seen()] == sorted(list(range(subject.nodes)) * 2)
                 and sorted(rank for _, rank in seen()) == list(range(subject.nodes * 2)),
                 lambda: f"logs -f to show every rank's line ({follower.lines[-6:]})")
        subject.ok("stop", "-c", name)
        wait_for(lambda: follower.process.poll() is not None,
                 lambda: f"logs -f to end with the stopped run ({follower.lines[-6:]})")
    finally:
        follower.close()
    wait_for(lambda: "running" not in states().values(), lambda: f"status to show the run ended ({states()})")


def _attached(subject: Subject) -> None:
    """Attached launches: one that succeeds (exit 0, every rank's line), one whose last rank exits 7 (the launch
    exits 7 naming the node and the rank) and one under ``--max-restarts 1`` whose last rank fails on attempt 0
    only (it ends 0 with every rank's line of attempt 1, and logs show attempt 1)."""
    name, last = subject.name, str(subject.nodes - 1)

    def launch(*args: str) -> subprocess.CompletedProcess[str]:
        result = subject.mlenv("launch", "-c", name, "--launcher", "torchrun", *args)
        assert "Traceback" not in result.stderr, result.stderr
        return result

    def lines(output: str, case: str, attempt: int) -> list[tuple[int, int]]:
        """(node, global rank) of every line of ``case``'s ``attempt``, from a node tagged as it says."""
        return sorted((int(m["node"]), int(m["rank"])) for m in CASE_LINE.finditer(output)
                      if (m["case"], int(m["attempt"])) == (case, attempt) and m["node"] == m["tag"])

    def whole(seen: list[tuple[int, int]]) -> bool:
        """Two ranks a node, the global ranks 0..2N-1 once each (torchrun gives them out in its own order)."""
        return ([node for node, _ in seen] == sorted(list(range(subject.nodes)) * 2)
                and sorted(rank for _, rank in seen) == list(range(subject.nodes * 2)))

    ok = launch(CASES, "ok", last)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert whole(lines(ok.stdout, "ok", 0)), ok.stdout

    failed = launch(CASES, "fails", last)
    assert failed.returncode == 7, failed.stdout + failed.stderr
    assert f"error: node-{last} failed with exit code 7" in failed.stderr, failed.stderr
    named = re.search(rf"rank (\d+) \(node-{last}, pid \d+\) exited with 7 first", failed.stdout)
    assert named and (int(last), int(named[1])) in lines(failed.stdout, "fails", 0), failed.stdout

    restarted = launch("--max-restarts", "1", CASES, "flaky", last)
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert "restarting it, attempt 1 of at most 1 restarts (MLENV_RESTART_COUNT=1)" in restarted.stderr
    assert whole(lines(restarted.stdout, "flaky", 1)), restarted.stdout
    logs = subject.ok("logs", "-c", name).stdout
    assert whole(lines(logs, "flaky", 1)), logs
    headers = re.findall(r"mlenv: ==== attempt 1 \(MLENV_RESTART_COUNT=1\) of run \S+, node (\d+) ====$", logs,
                         re.MULTILINE)
    assert sorted(headers) == [str(node) for node in range(subject.nodes)], logs


def _cases(subject: Subject, output: str, case: str, attempt: int) -> list[tuple[int, int, str]]:
    """(node, global rank, machine) of every line of ``case``'s ``attempt`` in ``output``, from a node tagged as it
    says."""
    return sorted((int(m["node"]), int(m["rank"]), m["machine"]) for m in CASE_LINE.finditer(output)
                  if (m["case"], int(m["attempt"])) == (case, attempt) and m["node"] == m["tag"])


def _left_out(subject: Subject, info: BackendInfo) -> None:
    """Under ``--max-restarts 1``, the last node's second rank prints an NCCL network failure (a node-fault sign)
    and fails: its machine is left out and recorded, the pods are kept off it, and attempt 1 completes on other
    machines; where the backend cannot leave a node out, the run stops saying so (core/registry.py)."""
    name, last = subject.name, subject.nodes - 1
    result = subject.mlenv("launch", "-c", name, "--launcher", "torchrun", "--max-restarts", "1", CASES, "netfail",
                           str(last))
    assert "Traceback" not in result.stderr, result.stderr
    [bad] = {machine for node, _, machine in _cases(subject, result.stdout, "netfail", 0) if node == last}
    if not info.supports(Feature.NODE_EXCLUSION):
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"the {info.name} backend cannot {Feature.NODE_EXCLUSION.value}" in result.stderr, result.stderr
        subject.ok("nodes", "-c", name, "--forget-excluded")
        return
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"excluding {bad} (node-{last}) from the next attempts: NCCL network error" in result.stderr
    resumed = _cases(subject, result.stdout, "netfail", 1)
    assert len(resumed) == 2 * subject.nodes and bad not in {machine for _, _, machine in resumed}, result.stdout
    listed = json.loads(subject.ok("nodes", "-c", name, "--json").stdout)
    assert [entry["host"] for entry in listed["excluded"]] == [bad], listed
    assert bad not in [node["host"] for node in listed["nodes"]], listed
    subject.ok("nodes", "-c", name, "--forget-excluded")


def _resumed(subject: Subject) -> None:
    """An attached run whose last node is taken away under it (a pod deleted) is preempted, not failed: it resumes
    as attempt 1 once the node is back, and completes."""
    assert subject.take_away is not None, "a backend that resumes preempted runs needs a harness that takes nodes away"
    name, last = subject.name, subject.nodes - 1
    out, err = subject.home / "preempted.out", subject.home / "preempted.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        run = subprocess.Popen([str(MLENV), "launch", "-c", name, "--launcher", "torchrun", CASES, "preempted",
                                str(last)], cwd=subject.home, env=subject.env, stdout=stdout, stderr=stderr,
                               stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(_cases(subject, out.read_text(), "preempted", 0)) == 2 * subject.nodes,
                 lambda: f"every rank of attempt 0 running ({out.read_text()[-400:]})")
        subject.take_away(last)
        run.wait(timeout=CALL_TIMEOUT)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    said = err.read_text()
    assert run.returncode == 0, out.read_text() + said
    assert f"preempted: node-{last} (" in said and "resuming it as attempt 1" in said, said
    assert len(_cases(subject, out.read_text(), "preempted", 1)) == 2 * subject.nodes, out.read_text()
    assert subject.status()["runs"][-1]["preemptions"] == 1
