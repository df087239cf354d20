"""The ssh backend against real sshd "machines" (tests/integration/ssh_hosts.py), through the real `mlenv` command:
deploy, sync, exec, a 2-host x 2-process torchrun launch of workspace/train_multi_node.py, fail-fast, Ctrl-C,
status, doctor, stacks (the rank behind in collective sequence named) and clean; a host behind a jump host; a
changed host key, unreachable hosts, a key that needs a passphrase and missing GPUs, each reported by the host's
name.

One module-scoped pair of machines sharing a filesystem (as NFS homes do) carries the workflow, and a pair with
separate workdirs the sync; single machines, started per test, the failures.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from mlenv.backends.sshlink.hosts import Resolved, resolve
from mlenv.backends.sshlink.transport import Transport
from mlenv.runtime.forensics.stacks import find_py_spy

from tests._prereq import require
from tests.helpers import MLENV, ROOT
from tests.integration.local_cluster import LocalProject

if TYPE_CHECKING:  # imported at run time as a plugin, so that pytest rewrites its asserts
    from tests.integration.ssh_hosts import SshCluster, SshHostsFactory

pytest_plugins = ["tests.integration.ssh_hosts"]

PAIR, APART = "pair", "apart"
FIRST_ADDRESS = IPv4Address("127.0.0.40")  # apart from the ssh_hosts fixture's machines (127.0.0.2, ...)
SLEEPER = "ssh_sleeper.py"
SLEEPER_JOB = """\
import os, sys, time
if "--fail" in sys.argv and os.environ["MLENV_NODE_RANK"] == "1" and os.environ["LOCAL_RANK"] == "0":
    print("failing on purpose", flush=True)
    sys.exit(3)
sys.stdout.write(f"sleeping {os.environ.get('SSH_TEST_SECRET', '-')}\\n")  # one write: lines never mix
sys.stdout.flush()
time.sleep(300)
"""
FORWARDED = "s3cr3t value"
DONE = re.compile(r"^\[node-\d r\d\] done steps=5 first_loss=([\d.]+) last_loss=([\d.]+) world_size=4$", re.MULTILINE)
PORT = re.compile(r"^MASTER_PORT (\d+) \(free on root@127\.0\.0\.40:\d+\), MASTER_ADDR 127\.0\.0\.40$", re.MULTILINE)
GONE_WITHIN = 20.0
LAUNCH_TIMEOUT = 240


@dataclass(frozen=True)
class Lab:
    """The project and its two pairs of machines."""

    project: LocalProject
    shared: SshCluster
    apart: SshCluster


def _project(home: Path, name: str) -> LocalProject:
    (home / "clusters").mkdir(parents=True)
    (home / "manifests").mkdir()
    return LocalProject(home, name, "ml-dev-env")


def _cluster_file(project: LocalProject, name: str, machines: SshCluster, *, hosts: list[str] | None = None,
                  identity: Path | None = None, connect_timeout: int = 5, gpus: int = 0) -> None:
    """``clusters/NAME.yaml`` for ``machines`` (or ``hosts``): CPU nodes (or ``gpus`` each), 2 processes each,
    its own workdir."""
    hosts = hosts or [host.spec for host in machines.hosts]
    (project.home / "clusters" / f"{name}.yaml").write_text(f"""\
backend: ssh
cluster:
  name: {name}
ssh:
  hosts: {json.dumps(hosts)}
  identity_file: {identity or machines.identity}
  known_hosts: {machines.known_hosts}
  workdir: {machines.workdir}/{name}
  python: {Path(MLENV).parent / "python"}
  connect_timeout: {connect_timeout}
gpus:
  per_node: {gpus}
  default_nodes: {len(hosts)}
  procs_per_node: 2
""")


def _handle(project: LocalProject, name: str) -> dict[str, Any]:
    state = json.loads((project.home / ".mlenv" / "state.json").read_text())
    return dict(state["deployments"][name]["handle"])


def _config(project: LocalProject, name: str) -> str:
    """The ssh_config every ssh and rsync of deployment ``name`` is given."""
    return Path(Transport.from_data(_handle(project, name)["data"]["transport"]).config_path).read_text()


def _running(script: str) -> list[str]:
    """Processes anywhere on this box (every machine's PID namespace included) running ``script``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(script.encode()) for arg in argv):
            found.append(cmdline.parent.name)
    return found


def _cmdline(pid: str) -> bytes:
    try:
        return Path("/proc", pid, "cmdline").read_bytes()
    except OSError:
        return b""


def _gone(script: str) -> list[str]:
    """What still runs ``script`` after up to GONE_WITHIN seconds (stopping takes a SIGTERM grace)."""
    deadline = time.monotonic() + GONE_WITHIN
    while (left := _running(script)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Two machines sharing this machine's files, two with separate workdirs, and a project for both."""
    from tests.integration.ssh_hosts import create_cluster, require_ssh

    require_ssh()
    require("rsync", "torch", "deepspeed")
    root = tmp_path_factory.mktemp("ssh-lab")
    machines: list[SshCluster] = []
    try:
        for name, separate in (("shared", False), ("apart", True)):
            first = FIRST_ADDRESS + sum(len(m.hosts) for m in machines)
            machines.append(create_cluster(root / name, 2, separate=separate, first_address=first))
            for host in machines[-1].hosts:
                machines[-1].start(host)
        project = _project(root / "project", PAIR)
        shutil.copytree(ROOT / "workspace", project.home / "workspace")
        (project.home / "workspace" / SLEEPER).write_text(SLEEPER_JOB)
        _cluster_file(project, PAIR, machines[0])
        _cluster_file(project, APART, machines[1])
        yield Lab(project, *machines)
    finally:
        for cluster in machines:
            cluster.close()


@pytest.fixture(scope="module")
def deployed(lab: Lab) -> subprocess.CompletedProcess[str]:
    """``mlenv deploy pair``, then ``mlenv sync`` of the project's workspace/ (train_multi_node.py and the sleeper)."""
    result = lab.project.ok("deploy", PAIR)
    lab.project.ok("sync", "--cluster", PAIR)
    return result


def test_deploy_checks_every_host_and_finds_the_shared_workspace(lab: Lab,
                                                                 deployed: subprocess.CompletedProcess[str]) -> None:
    project, machines = lab.project, lab.shared
    workspace = f"{machines.workdir}/{PAIR}"
    for host in machines.hosts:
        assert re.search(rf"^{re.escape(host.spec)}: first contact: recorded ED25519 SHA256:\S+ in "
                         rf"{re.escape(str(machines.known_hosts))}$", deployed.stderr, re.MULTILINE), deployed.stderr
        assert f"{host.spec} ({host.name}): Python 3." in deployed.stderr
    assert "the hosts share the workspace" in deployed.stderr
    handle = _handle(project, PAIR)
    assert handle["shared_workspace"] is True
    assert handle["env"]["MASTER_ADDR"] == "127.0.0.40"
    assert handle["data"]["workspaces"] == [workspace, workspace]
    config = _config(project, PAIR).splitlines()
    assert config[1:4] == ["BatchMode yes", "ConnectTimeout 5", "StrictHostKeyChecking accept-new"]
    assert f'UserKnownHostsFile "{machines.known_hosts}"' in config
    assert not list((machines.workdir / PAIR / ".mlenv").glob("shared-*"))  # the marker is gone again
    again = project.ok("deploy", PAIR)  # converges: the same hosts, the workspace already there
    assert f"workspace {workspace} (already there)" in again.stderr and "first contact" not in again.stderr


def test_exec_runs_on_every_host_with_the_env_contract(lab: Lab, deployed: subprocess.CompletedProcess[str]) -> None:
    project, machines = lab.project, lab.shared
    probe = ('echo "$MLENV_NODE_RANK $MLENV_NUM_NODES $MLENV_PROCS_PER_NODE $MASTER_ADDR $MASTER_PORT '
             '$NCCL_IB_DISABLE $(hostname) $PWD"')
    out = project.ok("exec", "--cluster", PAIR, "--", "sh", "-c", probe).stdout
    workspace = machines.workdir / PAIR
    assert sorted(out.splitlines()) == [f"[node-0] 0 2 2 127.0.0.40 29500 1 node0 {workspace}",
                                        f"[node-1] 1 2 2 127.0.0.40 29500 1 node1 {workspace}"]
    verbatim = project.ok("exec", "--cluster", PAIR, "--pod", "1", "--", "printf", "[%s]", "a b", "$HOME", "it's",
                          "*", "x;touch y").stdout
    assert verbatim == "[node-1] [a b][$HOME][it's][*][x;touch y]\n"
    assert project.mlenv("exec", "--cluster", PAIR, "--", "sh", "-c", "exit $((MLENV_NODE_RANK * 3))").returncode == 3


def test_launch_trains_on_two_hosts_with_two_processes_each(lab: Lab,
                                                            deployed: subprocess.CompletedProcess[str]) -> None:
    project = lab.project
    result = project.ok("launch", "--cluster", PAIR, "--launcher", "torchrun", "train_multi_node.py", "--engine",
                        "ddp", "--steps", "5", "--log-every", "1", timeout=LAUNCH_TIMEOUT)
    done = DONE.search(result.stdout)
    assert done, result.stdout
    assert float(done[2]) < float(done[1])  # the loss fell
    port = PORT.search(result.stderr)
    assert port and port[1] != "29500", result.stderr
    assert f"--rdzv-endpoint 127.0.0.40:{port[1]}" in result.stdout
    (run,) = [p.name for p in (project.home / "runs").iterdir()]
    on_hosts = lab.shared.workdir / PAIR / ".mlenv" / "runs" / run  # one shared directory, a file per node rank
    assert sorted(p.parent.name for p in on_hosts.glob("attempt-0/node*/output.log")) == ["node0", "node1"]
    assert [(on_hosts / "attempt-0" / f"node{rank}" / "exit").read_text() for rank in (0, 1)] == ["0\n", "0\n"]


def test_fail_fast_stops_the_other_host(lab: Lab, deployed: subprocess.CompletedProcess[str]) -> None:
    result = lab.project.mlenv("launch", "--cluster", PAIR, "--launcher", "deepspeed", SLEEPER, "--fail",
                               timeout=LAUNCH_TIMEOUT)
    assert result.returncode == 3, result.stderr
    assert "error: node-1 failed with exit code 3; the other nodes were stopped." in result.stderr
    assert re.search(r"node-0\s+\S\s+stopped", result.stdout), result.stdout
    assert _gone(SLEEPER) == []


def test_ctrl_c_stops_every_host(lab: Lab, deployed: subprocess.CompletedProcess[str]) -> None:
    argv = [str(MLENV), "launch", "--cluster", PAIR, "--launcher", "torchrun", "--env", "SSH_TEST_SECRET", SLEEPER]
    env = {**os.environ, "MLENV_HOME": str(lab.project.home), "SSH_TEST_SECRET": FORWARDED}
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    watchdog = threading.Timer(LAUNCH_TIMEOUT, process.kill)  # a hung launch fails the test instead of hanging it
    watchdog.start()
    lines: list[str] = []
    try:
        assert process.stdout is not None
        while sum(line.count("sleeping") for line in lines) < 4:  # every process of both hosts (lines may mix)
            line = process.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        assert not [pid for pid in _running(SLEEPER) if FORWARDED.encode() in _cmdline(pid)]  # only in environments
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=60)
    finally:
        watchdog.cancel()
        process.kill()
    assert process.returncode == 130, "".join(lines) + rest
    assert "".join(lines).count(f"sleeping {FORWARDED}") == 4  # the forwarded secret reached every process
    assert "interrupted: every node stopped" in rest
    assert _gone(SLEEPER) == []


def test_status_and_doctor_per_host(lab: Lab, deployed: subprocess.CompletedProcess[str]) -> None:
    project, machines = lab.project, lab.shared
    pods = project.status()
    assert [(p["pod"], p["host"], p["phase"], p["ready"], p["ip"], p["gpus"], p["extra"]) for p in pods] == [
        (host.spec, host.name, "Reachable", True, host.address, 0, {"jobs": 0}) for host in machines.hosts]
    report = json.loads(project.ok("doctor", PAIR, "--json").stdout)
    assert {check["status"] for check in report["checks"]} == {"PASS"}, report
    names = [check["name"] for check in report["checks"]]
    assert f"{machines.hosts[1].spec}: master reachable" in names
    assert f"{machines.hosts[0].spec}: host key" in names


def test_sync_to_separate_workdirs_is_incremental_and_deletes_only_when_asked(lab: Lab, tmp_path: Path) -> None:
    project, machines = lab.project, lab.apart
    deployed = project.ok("deploy", APART)
    assert "each host has its own workspace: sync copies to every host" in deployed.stderr
    assert _handle(project, APART)["shared_workspace"] is False
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "a.txt").write_text("a\n")
    (source / "pkg" / "b.py").write_text("b = 1\n")

    def sync(*options: str) -> list[dict[str, Any]]:
        out = project.ok("sync", "--cluster", APART, "--source", str(source), "--json", *options).stdout
        return list(json.loads(out)["pods"])

    first = sync()
    assert [(p["method"], p["ok"]) for p in first] == [("rsync", True), ("rsync", True)]
    assert all(p["files"] >= 2 for p in first)
    for host in machines.hosts:
        assert (host.files / APART / "pkg" / "b.py").read_text() == "b = 1\n"
        assert (host.files / APART / ".mlenv" / "mlenv" / "runtime" / "__main__.py").is_file()
    assert [p["files"] for p in sync()] == [0, 0]  # nothing changed, nothing copied
    (source / "a.txt").unlink()
    sync()
    assert all((host.files / APART / "a.txt").exists() for host in machines.hosts)  # kept without --delete
    sync("--delete")
    assert not any((host.files / APART / "a.txt").exists() for host in machines.hosts)
    out = project.ok("exec", "--cluster", APART, "--", "sh", "-c", "ls; hostname").stdout
    assert sorted(out.splitlines()) == ["[node-0] node0", "[node-0] pkg", "[node-1] node1", "[node-1] pkg"]


def test_stacks_name_the_rank_behind_in_collective_sequence(lab: Lab,
                                                           deployed: subprocess.CompletedProcess[str]) -> None:
    """Rank 2 (node-1) stops calling collectives after the warm-up's all-reduces; the other three wait in the next:
    ``mlenv stacks`` names rank 2 by sequence, through each host's runtime over ssh."""
    from tests.integration.test_stacks import WARM_UP, hanging_job, until_grouped

    if find_py_spy() is None:
        require("py-spy")
    project = lab.project
    (project.home / "workspace" / "hang.py").write_text(hanging_job("stuck_over_ssh", 2))
    project.ok("sync", "--cluster", PAIR)
    project.ok("launch", "--cluster", PAIR, "--launcher", "torchrun", "--detach", "hang.py")
    try:
        until_grouped(lambda: project.mlenv("stacks", "--cluster", PAIR, "--json", timeout=60), 2, "stuck_over_ssh",
                      120)
        named = json.loads(project.ok("stacks", "--cluster", PAIR, "--json", timeout=60).stdout)["collectives"]
        assert named["verdict"] == "behind" and named["unknown"] == [], named
        behind = named["groups"][0]["behind"]
        assert [(b["rank"], b["last_seq"]) for b in behind] == [(2, WARM_UP)], named
        said = project.ok("stacks", "--cluster", PAIR, timeout=60).stdout.splitlines()
        assert said[1].startswith(f"collectives: ranks 0-1,3 wait in all_reduce #{WARM_UP + 1}; rank 2 last "
                                  f"completed #{WARM_UP} and is in hang.py:7 stuck_over_ssh"), said
    finally:
        project.ok("stop", "--cluster", PAIR)
    assert _gone("hang.py") == []


def test_clean_stops_jobs_and_deletes_the_workspace_only_when_asked(lab: Lab,
                                                                    deployed: subprocess.CompletedProcess[str]) -> None:
    project, workspace = lab.project, lab.shared.workdir / PAIR
    started = project.ok("launch", "--cluster", PAIR, "--launcher", "torchrun", "--detach", SLEEPER)
    assert started.stdout.count("started in the background: pid") == 2
    assert [p["extra"]["jobs"] for p in project.status()] == [1, 1]
    cleaned = project.ok("clean", "--cluster", PAIR)
    # each node's supervisor passes a user's stop to the other over the control channel: a node may have ended of
    # its peer's stop before clean reached it ("nothing to stop" there)
    assert cleaned.stderr.count("stopped node ") in (1, 2), cleaned.stderr
    assert _gone(SLEEPER) == []
    assert (workspace / "train_multi_node.py").is_file()  # kept without --delete-data
    project.ok("deploy", PAIR)
    deleted = project.ok("clean", "--cluster", PAIR, "--delete-data", "--yes")
    assert f"deleted the workspace {lab.shared.hosts[0].spec}:{workspace}" in deleted.stderr
    assert not workspace.exists()
    project.ok("clean", "--cluster", PAIR, "--delete-data", "--yes")  # twice is fine


def test_changed_host_key_is_refused_naming_the_host(ssh_hosts: SshHostsFactory, tmp_path: Path) -> None:
    machines = ssh_hosts(1)
    (host,) = machines.hosts
    # how hints name the host: ssh -G, which also resolves aliases (here the harness's ssh_config's)
    assert resolve(["ssh", "-F", str(machines.config)], host.name) == Resolved(
        host.address, host.port, "root", (str(machines.known_hosts),), (str(machines.identity),))
    project = _project(tmp_path / "project", "one")
    _cluster_file(project, "one", machines)
    project.ok("deploy", "one")
    known = machines.known_hosts.read_text()
    machines.change_host_key(host)
    ran = project.mlenv("exec", "--cluster", "one", "--", "touch", "ran")
    assert ran.returncode == 255 and "[node-0] Host key verification failed." in ran.stdout, ran.stdout
    assert not (machines.workdir / "one" / "ran").exists()
    (row,) = project.status()
    assert row["phase"] == "Unreachable" and row["detail"].startswith(f"{host.spec}: its host key has changed")
    refused = project.mlenv("deploy", "one")
    assert refused.returncode == 1
    assert (f"error: {host.spec}: its host key has changed (REMOTE HOST IDENTIFICATION HAS CHANGED): ssh refuses "
            "to connect") in refused.stderr
    assert f"ssh-keygen -R '[{host.address}]:{host.port}' -f {machines.known_hosts}" in refused.stderr
    assert machines.known_hosts.read_text() == known  # accept-new never replaces a key


def test_unreachable_hosts_are_named_with_the_connect_timeout(ssh_hosts: SshHostsFactory, tmp_path: Path) -> None:
    machines = ssh_hosts(1)
    refused, silent = machines.refused_address(), machines.silent_address()
    project = _project(tmp_path / "project", "far")
    _cluster_file(project, "far", machines, hosts=[machines.hosts[0].spec, refused, silent], connect_timeout=2)
    result = project.mlenv("deploy", "far")
    assert result.returncode == 1
    assert "error: deploy failed on 2 of 3 hosts:" in result.stderr
    assert f"error: {refused}: connection refused: no ssh server listens there" in result.stderr
    assert (f"error: {silent}: no answer within 2 s (ssh.connect_timeout): the machine is down, or a firewall drops "
            "the connection") in result.stderr
    assert f"{machines.hosts[0].spec} (node0): Python" in result.stderr  # the good host was checked all the same
    assert "ConnectTimeout 2\n" in _config(project, "far")  # the timeout ssh was given, recorded before any change
    report = json.loads(project.mlenv("status", "--cluster", "far", "--json").stdout)  # recorded for clean ...
    assert report["deploy"]["state"] == "failed" and "deploy failed on 2 of 3 hosts" in report["deploy"]["error"]
    assert [pod["ready"] for pod in report["pods"]] == [False, False, False]
    assert "far: deploy failed: deploy failed on 2 of 3 hosts" in project.mlenv("status", "--cluster", "far").stdout
    bare = project.mlenv("status")  # ... but never made current
    assert bare.returncode == 2 and "no deployment recorded" in bare.stderr
    cleaned = project.mlenv("clean", "--cluster", "far")  # found: it stops what runs on the host it reaches
    assert cleaned.returncode == 1 and f"error: {refused}: connection refused" in cleaned.stderr


def test_a_key_with_a_passphrase_gets_an_agent_hint(ssh_hosts: SshHostsFactory, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    machines = ssh_hosts(1)
    key = tmp_path / "locked_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(key)], check=True, timeout=30)
    project = _project(tmp_path / "project", "locked")
    _cluster_file(project, "locked", machines, identity=key)
    result = project.mlenv("deploy", "locked")
    assert result.returncode == 1
    assert f"error: {machines.hosts[0].spec}: login refused (" in result.stderr
    assert "Permission denied (publickey)" in result.stderr
    assert (f"the key {key} needs a passphrase, which ssh cannot ask for here (BatchMode): load it into an ssh-agent "
            f'first (eval "$(ssh-agent)"; ssh-add {key})') in result.stderr


def test_gpus_are_checked_when_the_file_wants_them(ssh_hosts: SshHostsFactory, tmp_path: Path) -> None:
    machines = ssh_hosts(1)
    project = _project(tmp_path / "project", "gpu")
    _cluster_file(project, "gpu", machines, gpus=2)
    result = project.mlenv("deploy", "gpu")
    assert result.returncode == 1
    assert (f"error: {machines.hosts[0].spec}: gpus.per_node is 2 but nvidia-smi not found (no NVIDIA driver?)"
            in result.stderr), result.stderr


def test_a_host_behind_a_jump_host(ssh_hosts: SshHostsFactory, tmp_path: Path) -> None:
    machines = ssh_hosts(2)
    bastion, inner = machines.hosts
    project = _project(tmp_path / "project", "inner")
    _cluster_file(project, "inner", machines, hosts=[inner.spec])
    cluster_file = project.home / "clusters" / "inner.yaml"
    cluster_file.write_text(cluster_file.read_text().replace("ssh:\n", f"ssh:\n  jump: {bastion.spec}\n"))
    project.ok("deploy", "inner")
    out = project.ok("exec", "--cluster", "inner", "--", "sh", "-c", 'hostname; echo "$SSH_CONNECTION"').stdout
    name, connection = out.splitlines()
    assert name == "[node-0] node1" and connection.split()[3] == inner.address
    known = subprocess.run(["ssh-keygen", "-F", bastion.known_hosts_name, "-f", str(machines.known_hosts)],
                           capture_output=True, text=True, timeout=10, check=False)
    assert known.returncode == 0  # the jump host was reached with the same config (key, known_hosts)


def test_a_team_workspace_root_keeps_its_mode_owner_and_group(ssh_hosts: SshHostsFactory, tmp_path: Path) -> None:
    """sync (from workspace/, 755) and doctor (which ships the runtime from a 0700 temporary directory) copy
    into a 2775 team directory without changing its mode, owner or group."""
    machines = ssh_hosts(1)
    project = _project(tmp_path / "project", "team")
    (project.home / "workspace").mkdir(mode=0o755)
    (project.home / "workspace" / "run.sh").write_text("#!/bin/sh\n")
    (project.home / "workspace" / "run.sh").chmod(0o755)
    _cluster_file(project, "team", machines)
    root = machines.workdir / "team"
    root.mkdir()
    os.chown(root, -1, 4242)
    root.chmod(0o2775)
    before = (stat.S_IMODE(root.stat().st_mode), root.stat().st_uid, root.stat().st_gid)
    project.ok("deploy", "team")
    project.ok("sync", "--cluster", "team")
    assert (stat.S_IMODE(root.stat().st_mode), root.stat().st_uid, root.stat().st_gid) == before == (0o2775, 0, 4242)
    assert (root / "run.sh").stat().st_mode & 0o111  # executable stays executable
    doctor = project.mlenv("doctor", "team", "--json")
    assert "runtime copied" not in doctor.stdout, doctor.stdout
    assert (stat.S_IMODE(root.stat().st_mode), root.stat().st_uid, root.stat().st_gid) == before
    project.ok("sync", "--cluster", "team", "--delete")
    assert (stat.S_IMODE(root.stat().st_mode), root.stat().st_uid, root.stat().st_gid) == before
    asked = project.mlenv("clean", "--cluster", "team", "--delete-data")  # no terminal to ask on: lists, refuses
    assert asked.returncode == 2 and "deletes this volume of team and everything stored on it:" in asked.stderr


def test_sync_fails_naming_a_host_it_cannot_reach_even_when_shared(ssh_hosts: SshHostsFactory,
                                                                   tmp_path: Path) -> None:
    machines = ssh_hosts(2)  # one shared workdir: sync copies once, through host 0
    first, second = machines.hosts
    project = _project(tmp_path / "project", "both")
    (project.home / "workspace").mkdir()
    (project.home / "workspace" / "a.txt").write_text("a\n")
    _cluster_file(project, "both", machines)
    assert "the hosts share the workspace" in project.ok("deploy", "both").stderr
    machines.stop(second)
    down = project.mlenv("sync", "--cluster", "both")
    assert down.returncode == 1, down.stdout + down.stderr
    assert re.search(rf"^error: sync to {re.escape(second.spec)}: FAILED: cannot be reached: .*Connection refused",
                     down.stderr, re.MULTILINE), down.stderr
    assert f"sync to {first.spec}" not in down.stderr
    machines.change_host_key(second)  # back, but reinstalled
    changed = project.mlenv("sync", "--cluster", "both")
    assert changed.returncode == 1
    assert (f"error: sync to {second.spec}: FAILED: cannot be reached: Host key verification failed."
            in changed.stderr), changed.stderr
    machines.change_host_key(first)  # the host sync copies through: rsync's own ssh is refused
    copied = project.mlenv("sync", "--cluster", "both")
    assert copied.returncode == 1
    assert f"error: sync to {first.spec}: FAILED: Host key verification failed." in copied.stderr, copied.stderr


def test_a_failed_redeploy_keeps_the_running_job_in_reach(ssh_hosts: SshHostsFactory, tmp_path: Path) -> None:
    """Launch detached on two hosts, take one down, deploy again: the deploy fails, and the job can still be
    seen, followed and stopped; nothing is left running."""
    machines = ssh_hosts(2)
    second = machines.hosts[1]
    project = _project(tmp_path / "project", "keep")
    (project.home / "workspace").mkdir()
    (project.home / "workspace" / SLEEPER).write_text(SLEEPER_JOB)
    _cluster_file(project, "keep", machines)
    project.ok("deploy", "keep")
    project.ok("sync", "--cluster", "keep")
    started = project.ok("launch", "--cluster", "keep", "--launcher", "torchrun", "--detach", SLEEPER)
    assert started.stdout.count("started in the background: pid") == 2
    handle = _handle(project, "keep")
    machines.stop(second)
    refused = project.mlenv("deploy", "keep")
    assert refused.returncode == 1 and f"error: {second.spec}: connection refused" in refused.stderr
    recorded = json.loads((project.home / ".mlenv" / "state.json").read_text())
    assert recorded["current"] == "keep"
    kept = recorded["deployments"]["keep"]
    assert kept["handle"] == handle and len(kept["runs"]) == 1  # the hosts, workspaces and runs it knew
    assert kept["deploy"]["state"] == "partial" and "deploy failed on 1 of 2 hosts" in kept["deploy"]["error"]
    assert kept["attempt"]["handle"]["data"]["hosts"] == handle["data"]["hosts"]  # for clean
    report = json.loads(project.mlenv("status", "--json").stdout)
    assert report["deploy"]["state"] == "partial" and report["runs"][0]["id"] == kept["runs"][0]["id"]
    assert report["pods"][0]["extra"] == {"jobs": 1}
    shown = project.mlenv("status").stdout
    assert "keep: the last deploy failed: deploy failed on 1 of 2 hosts" in shown
    assert "[node-0] mlenv: node 0/2" in project.ok("logs", "--pod", "0").stdout  # followed as before
    stopped = project.mlenv("stop")
    assert "stopped node" in stopped.stdout + stopped.stderr, stopped.stdout + stopped.stderr
    assert "not deployed yet" not in stopped.stdout + stopped.stderr
    assert _gone(SLEEPER) == []
    machines.start(second)
    assert project.ok("stop").returncode == 0  # every host answers again: nothing left to stop
    asked = project.mlenv("clean", "--delete-data")  # no terminal to ask on: lists, then refuses
    assert asked.returncode == 2, asked.stderr
    assert "--delete-data deletes these 2 volumes of keep and everything stored on them:" in asked.stderr  # both
    project.ok("deploy", "keep")
    recorded = json.loads((project.home / ".mlenv" / "state.json").read_text())["deployments"]["keep"]
    assert "deploy" not in recorded and "attempt" not in recorded  # ready: written as before
    assert json.loads(project.ok("status", "--json").stdout)["deploy"] == {"state": "ready", "error": None}
    assert len(recorded["runs"]) == 1


def test_deploy_dry_run_shows_no_fixed_master_port(tmp_path: Path) -> None:
    """launch picks the port free on host 0: the dry run says so instead of showing 29500 as the port."""
    project = _project(tmp_path / "project", "dry")
    (project.home / "clusters" / "dry.yaml").write_text(
        "backend: ssh\ncluster: {name: dry}\nssh: {hosts: [a.example, b.example], workdir: /srv/ml}\n"
        "gpus: {per_node: 0, default_nodes: 2, procs_per_node: 1}\n")
    dry = project.ok("deploy", "dry", "--dry-run").stdout
    env = yaml.safe_load(dry)["env"]
    assert env["MASTER_PORT"] == "<picked free on host 0 at launch; exec and shell see 29500>", dry
    assert "'29500'" not in dry


def test_status_gpus_over_ssh_names_a_host_that_went_down(ssh_hosts: SshHostsFactory, tmp_path: Path) -> None:
    standin = ROOT / "tests" / "fixtures" / "nvidia_smi"
    machines = ssh_hosts(2, env={"PATH": f"{standin}:/usr/local/bin:/usr/bin:/bin"})  # the hosts' nvidia-smi
    project = _project(tmp_path / "project", "gpus")
    _cluster_file(project, "gpus", machines, connect_timeout=2)
    project.ok("deploy", "gpus")
    project.ok("sync", "--cluster", "gpus", "--source", str(project.source({"noop.py": "pass\n"})))  # the runtime
    states = json.loads(project.ok("status", "--gpus", "--json").stdout)["gpu_state"]
    assert [(s["node"], [g["name"] for g in s["gpus"]]) for s in states] == [
        (0, ["NVIDIA H100 80GB HBM3"] * 2), (1, ["NVIDIA H100 80GB HBM3"] * 2)]
    machines.stop(machines.hosts[1])
    result = project.mlenv("status", "--gpus", "--json")
    assert result.returncode == 1, result.stderr
    states = json.loads(result.stdout)["gpu_state"]
    assert len(states[0]["gpus"]) == 2 and "error" not in states[0]
    assert states[1]["node"] == 1 and states[1]["error"], states[1]
