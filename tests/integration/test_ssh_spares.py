"""``ssh.spares`` against real sshd "machines" (tests/integration/ssh_hosts.py), through the real `mlenv` command:
deploy prepares the spare like the hosts, sync copies to it; a restarted run whose node-1 host fails first twice
is excluded and goes on with the spare as node-1 (said, in the dry run, in status); the next launch uses the spare
at once; when the spare fails too, no spare is left: the run stops, naming the nodes, with exit 1. Bad spares are
bad input (exit 2), and so is a standby's port already taken on its spare host."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from mlenv.backends.ssh.backend import check_standby_ports
from mlenv.backends.ssh.target import SshTarget
from mlenv.backends.sshlink.hosts import HostSpec
from mlenv.backends.sshlink.transport import Transport
from mlenv.core.capabilities import Node
from mlenv.errors import UsageError

from tests.helpers import MLENV, launch_said
from tests.integration.local_cluster import LocalProject

if TYPE_CHECKING:  # imported at run time as a plugin, so that pytest rewrites its asserts
    from tests.integration.ssh_hosts import SshHostsFactory

pytest_plugins = ["tests.integration.ssh_hosts"]

# The first rank of every node on a machine named in argv[1] fails (the machines' hostnames are node0, node1, ...).
JOB = """\
import os, socket, sys
print(f"attempt {os.environ['MLENV_RESTART_COUNT']} node {os.environ['MLENV_NODE_RANK']} rank {os.environ['RANK']} "
      f"on {socket.gethostname()}", flush=True)
if socket.gethostname() in sys.argv[1].split(",") and os.environ["LOCAL_RANK"] == "0":
    print("failing on purpose", flush=True)
    sys.exit(3)
"""
RAN = re.compile(r"attempt (\d) node (\d) rank (\d) on (node\d)")
LAUNCH_TIMEOUT = 300


def _project(home: Path, name: str, hosts: list[str], spares: list[str], machines_root: Path,
             identity: Path, known_hosts: Path) -> LocalProject:
    (home / "clusters").mkdir(parents=True)
    (home / "manifests").mkdir()
    (home / "clusters" / f"{name}.yaml").write_text(f"""\
backend: ssh
cluster:
  name: {name}
ssh:
  hosts: {json.dumps(hosts)}
  spares: {json.dumps(spares)}
  identity_file: {identity}
  known_hosts: {known_hosts}
  workdir: {machines_root}/{name}
  python: {Path(MLENV).parent / "python"}
  connect_timeout: 5
gpus:
  per_node: 0
  default_nodes: {len(hosts)}
  procs_per_node: 1
""")
    return LocalProject(home, name, "ml-dev-env")


def test_an_excluded_host_is_replaced_by_a_spare(ssh_hosts: SshHostsFactory, tmp_path: Path) -> None:
    machines = ssh_hosts(3, separate=True)  # each its own workdir: sync must copy to the spare too
    first, second, spare = machines.hosts
    project = _project(tmp_path / "project", "spr", [first.spec, second.spec], [spare.spec], machines.workdir,
                       machines.identity, machines.known_hosts)
    deployed = project.ok("deploy", "spr")
    assert f"{spare.spec} (spare) (node2): Python 3." in deployed.stderr, deployed.stderr
    assert "checking 2 hosts and 1 spare over ssh" in deployed.stderr
    report = json.loads(project.ok("doctor", "spr", "--json", timeout=180).stdout)  # the spare checked like the hosts
    checks = {check["name"]: check["status"] for check in report["checks"]}
    assert checks[f"{spare.spec}: master reachable"] == "PASS" and set(checks.values()) == {"PASS"}, report
    dry = project.ok("deploy", "spr", "--dry-run").stdout
    assert f"spares:\n- host: {spare.spec}\n" in dry, dry
    project.ok("sync", "--source", str(project.source({"job.py": JOB})))
    assert all((host.files / "spr" / "job.py").is_file() for host in machines.hosts)  # the spare's copy too
    assert (spare.files / "spr" / ".mlenv" / "mlenv" / "runtime" / "__main__.py").is_file()
    assert project.ok("exec", "--pod", "2", "--", "hostname").stdout.split()[-1] == "node2"  # the spare
    missing = project.mlenv("exec", "--pod", "5", "--", "hostname")
    assert (missing.returncode, missing.stderr.strip()) == (
        2, "error: pod 5 does not exist: spr has pods 0, 1, 2 (spare) (--pod N / POD=N)"), missing.stderr

    result = project.mlenv("launch", "--max-restarts", "3", "job.py", "node1", timeout=LAUNCH_TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    ran = {(int(a), int(n), int(r), host) for a, n, r, host in RAN.findall(result.stdout)}
    assert {(a, n, host) for a, n, _, host in ran if a == 2} == {(2, 0, "node0"), (2, 1, "node2")}, result.stdout
    assert (f"excluding {second.spec} (node-1) from the next attempts: it failed first in 2 attempts of the run"
            in result.stderr)
    said = (f"node-1: {second.spec} excluded (it failed first in 2 attempts of the run), using spare {spare.spec}")
    assert said in result.stderr, result.stderr
    report = json.loads(project.ok("status", "--json").stdout)
    rows = [(pod["pod"], pod["host"], pod["phase"], pod["extra"]["spare"]) for pod in report["pods"]]
    assert rows == [(first.spec, "node0", "Reachable", "no"), (second.spec, "node1", "Reachable", "no"),
                    (spare.spec, "node2", "Reachable", "yes")], rows  # the spare host has its row
    run = report["latest_run"]
    assert (run["state"], run["attempt"]) == ("succeeded", 2), run
    assert {rank["node"]: rank["host"] for rank in run["ranks"]} == {0: "node0", 1: "node2"}, run
    assert report["runs"][-1]["spares"] == [{"node": 1, "host": second.spec, "spare": spare.spec}]
    assert f"on spare hosts: node-1 on {spare.spec} (in place of {second.spec})" in project.ok("status").stdout
    logs = project.ok("logs", "--pod", "1", timeout=60).stdout  # from the spare, which ran node-1 last
    assert re.search(r"^\[node-1 r\d\] attempt 2 node 1 rank \d on node2$", logs, re.MULTILINE), logs
    assert "on node1" not in logs
    (spare_rank,) = [rank["rank"] for rank in run["ranks"] if rank["node"] == 1]  # torchrun's rendezvous decides
    assert f"attempt 2 node 1 rank {spare_rank} on node2" in project.ok("logs", "--rank", str(spare_rank),
                                                                        timeout=60).stdout

    # without a node-fault sign, node1's host was left out of that run only: the next run is sent to it again
    assert json.loads(project.ok("nodes", "--json").stdout)["excluded"] == []
    dry_launch = project.ok("launch", "--dry-run", "job.py", "none").stdout
    assert "using spare" not in dry_launch, dry_launch
    again = project.ok("launch", "job.py", "none", timeout=LAUNCH_TIMEOUT)
    assert {(int(n), host) for _, n, _, host in RAN.findall(again.stdout)} == {(0, "node0"), (1, "node1")}
    assert "using spare" not in again.stderr

    short = project.mlenv("launch", "--max-restarts", "5", "job.py", "node1,node2", timeout=2 * LAUNCH_TIMEOUT)
    assert short.returncode == 1, short.stdout + short.stderr
    assert said in short.stderr and re.search(r"attempt 3 node 1 rank \d on node2", short.stdout), short.stdout
    assert launch_said(short.stderr)[-1] == (
        f"error: {second.spec} must be left out of the run (mlenv nodes says why), and spr has no usable spares for "
        "the 1 excluded node (node-1): stopping. mlenv nodes --forget-excluded lets the run use them again")
    assert json.loads(project.ok("nodes", "--json").stdout)["excluded"] == []
    project.mlenv("clean", "--delete-data", "--yes")


# Attempt 0: every rank waits, node 1's first rank after leaving a mark (in its machine's workdir); later attempts end.
WAITING_JOB = """\
import os, socket, time
attempt = os.environ["MLENV_RESTART_COUNT"]
print(f"attempt {attempt} node {os.environ['MLENV_NODE_RANK']} rank {os.environ['RANK']} on {socket.gethostname()}",
      flush=True)
if attempt == "0":
    if os.environ["MLENV_NODE_RANK"] == "1" and os.environ["LOCAL_RANK"] == "0":
        open("reached", "w").close()
    time.sleep(600)
"""


def test_a_host_lost_during_the_run_is_unreachable_and_left_out_at_once(ssh_hosts: SshHostsFactory,
                                                                         tmp_path: Path) -> None:
    """node-1's machine powers off while attempt 0 runs: its ssh ends with 255 and its records cannot be read, so
    it is judged unreachable at once (no second failure), and attempt 1 runs node-1 on the spare."""
    machines = ssh_hosts(3, separate=True)
    first, second, spare = machines.hosts
    project = _project(tmp_path / "project", "lost", [first.spec, second.spec], [spare.spec], machines.workdir,
                       machines.identity, machines.known_hosts)
    project.ok("deploy", "lost")
    project.ok("sync", "--source", str(project.source({"wait.py": WAITING_JOB})))
    launch = subprocess.Popen([str(MLENV), "launch", "--max-restarts", "2", "wait.py"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "MLENV_HOME": str(project.home)}, cwd=project.home)
    try:
        mark = second.files / "lost" / "reached"
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        while not mark.exists():
            assert launch.poll() is None and time.monotonic() < deadline, "node-1 never started attempt 0"
            time.sleep(0.1)
        machines.stop(second)  # every process on it ends, its port refuses connections
        out, err = launch.communicate(timeout=LAUNCH_TIMEOUT)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.communicate()
    assert launch.returncode == 0, out + err
    assert re.search(rf"excluding {re.escape(second.spec)} \(node-1\) from the next attempts: unreachable: exit 255 "
                     r"and no record of the run there", err), err
    assert f"node-1: {second.spec} excluded (unreachable: exit 255 and no record of the run there), using spare " \
           f"{spare.spec}" in err, err
    ran = {(int(a), int(n), host) for a, n, _, host in RAN.findall(out)}
    assert {(n, host) for a, n, host in ran if a == 1} == {(0, "node0"), (1, "node2")}, out
    assert not any(a == 2 for a, _, _ in ran), out
    listed = json.loads(project.ok("nodes", "--json").stdout)["excluded"]
    assert [(entry["node"], entry["host"]) for entry in listed] == [(1, second.spec)], listed


def _latest(project: LocalProject) -> dict[str, Any]:
    return json.loads(project.ok("status", "--json").stdout)["latest_run"] or {}


def _until(condition: Callable[[], bool], what: str, seconds: float = LAUNCH_TIMEOUT) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {seconds} s"
        time.sleep(0.5)


def test_a_detached_run_s_standby_takes_the_place_of_a_node_that_failed_first_twice(ssh_hosts: SshHostsFactory,
                                                                                   tmp_path: Path) -> None:
    """Detached, with no terminal waiting: the spare host waits as the run's standby; once node1 failed first in
    attempts 0 and 1, node 0's supervisor hands node-1 to it, and attempt 2 runs on node0 and the spare. A run that
    needs no spare ends its standby; mlenv stop stops a waiting one."""
    machines = ssh_hosts(3, separate=True)
    first, second, spare = machines.hosts
    project = _project(tmp_path / "project", "sby", [first.spec, second.spec], [spare.spec], machines.workdir,
                       machines.identity, machines.known_hosts)
    project.ok("deploy", "sby")
    project.ok("sync", "--source", str(project.source({"job.py": JOB, "wait.py": WAITING_JOB})))
    dry = project.ok("launch", "--detach", "--max-restarts", "3", "--dry-run", "job.py", "node1").stdout
    assert f"MLENV_STANDBYS={spare.address}" in dry, dry
    assert re.search(rf"^standby on {re.escape(spare.spec)}: .* launch .*--detach --max-restarts 3 --standby 0 -- "
                     r"job.py node1$", dry, re.MULTILINE), dry
    started = project.ok("launch", "--detach", "--max-restarts", "3", "job.py", "node1", timeout=LAUNCH_TIMEOUT)
    assert re.search(rf"{re.escape(spare.spec)}: mlenv: standby 0 of run \S+ on node2: waiting on port \d+",
                     started.stderr), started.stderr
    _until(lambda: (_latest(project).get("state"), _latest(project).get("attempt")) == ("succeeded", 2),
           "attempt 2 succeeded")
    run = _latest(project)
    assert {rank["node"]: rank["host"] for rank in run["ranks"]} == {0: "node0", 1: "node2"}, run
    logs = project.ok("logs", timeout=60).stdout
    said = (f"mlenv: node-1 must be left out of the run (it failed first in 2 attempts of the run): the standby on "
            f"{spare.address} takes its place")
    assert said in logs, logs  # node 0's log, which handed it over
    assert re.search(r"^\[node-1 r\d\] attempt 2 node 1 rank \d on node2$", logs, re.MULTILINE), logs
    runs = spare.files / "sby" / ".mlenv" / "runs"
    (standby_log,) = runs.glob("*/standby-0.log")
    assert f"mlenv: taking node-1's place in run {run['id']} from attempt 2 on" in standby_log.read_text()

    project.ok("launch", "--detach", "--max-restarts", "3", "job.py", "none", timeout=LAUNCH_TIMEOUT)
    _until(lambda: _latest(project).get("state") == "succeeded" and _latest(project)["id"] != run["id"],
           "the second run to succeed")
    unused = runs / _latest(project)["id"] / "standby-0.log"
    _until(lambda: "needs this standby no more" in (unused.read_text() if unused.exists() else ""),
           "the unused standby to end")

    assert not _standbys(_latest(project)["id"])
    project.ok("launch", "--detach", "--max-restarts", "3", "wait.py", timeout=LAUNCH_TIMEOUT)
    waiting = json.loads(project.ok("status", "--json").stdout)["runs"][-1]["id"]
    assert len(_standbys(waiting)) == 1
    project.ok("stop", timeout=120)  # the spare host's stop, or node 0's supervisor, ends it
    _until(lambda: not _standbys(waiting), "the stopped run's standby to end", 30)


def _standbys(run_id: str) -> list[int]:
    """The standby processes of run ``run_id`` on every machine (they share this machine's processes)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            variables = (entry / "environ").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if any(v.startswith(b"MLENV_STANDBY=") and run_id.encode() in v for v in variables):
            found.append(int(entry.name))
    return found


def test_bad_spares_are_bad_input(tmp_path: Path) -> None:
    project = _project(tmp_path / "project", "bad", ["a.example", "b.example"], ["b.example", "-oProxyCommand=x"],
                       tmp_path, tmp_path / "id", tmp_path / "known")
    result = project.mlenv("validate", "bad")
    assert result.returncode == 2, result.stderr
    path = project.home / "clusters" / "bad.yaml"
    assert result.stderr.splitlines() == [
        f'error: {path}:6:12: ssh.spares[0]: "b.example" is listed twice (first as hosts[1]); one node runs per host, '
        "so list each host once",
        f"error: {path}:6:25: ssh.spares[1]: a host cannot start with '-' (ssh would read it as an option), got "
        '"-oProxyCommand=x"']
    assert project.mlenv("deploy", "bad").returncode == 2


def test_a_standby_port_taken_on_its_spare_host_is_named_before_anything_starts(ssh_hosts: SshHostsFactory) -> None:
    """The standby's port (MASTER_PORT + 2 + its slot) is checked on the spare host, as node 0's ports are, through
    the real probe over ssh: a port another process holds on the spare's address is named with the host, as bad
    input (exit 2), before any node or standby starts; a free one passes."""
    machines = ssh_hosts(2)
    first, spare = machines.hosts
    transport = Transport(connect_timeout=5, control_dir=str(machines.control_dir), user=first.spec.split("@")[0],
                          identity_file=str(machines.identity), known_hosts=str(machines.known_hosts))
    transport.write_config()
    target = SshTarget((HostSpec(first.address, port=first.port),), transport, str(machines.workdir),
                       str(Path(MLENV).parent / "python"), "test", 0,
                       spares=(HostSpec(spare.address, port=spare.port),))
    standby = Node(1, target.label(1), str(machines.workdir), spare.address, ready=True)
    with socket.create_server((spare.address, 0)) as holder:  # anything holding the port on the spare's address
        taken = holder.getsockname()[1]
        with pytest.raises(UsageError) as refused:
            check_standby_ports(target, [standby], {"MASTER_PORT": str(taken - 2)})
    assert refused.value.exit_code == 2
    assert str(refused.value) == (f"the run's standby cannot listen: port {taken} on {target.label(1)} is taken "
                                  f"(MASTER_PORT {taken - 2} + 2 + the standby's slot); nothing was started: free it, "
                                  "or launch again (each launch picks another MASTER_PORT)")
    check_standby_ports(target, [standby], {"MASTER_PORT": str(taken - 2)})  # released: free again
