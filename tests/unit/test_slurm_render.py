"""The Slurm backend without a Slurm: golden scripts for a seed-001-like file (clusters/olivia.yaml: apptainer,
binds, account, setup, extra_sbatch) and a seed-003-like one (clusters/slurm-gloo.yaml: 6 pinned single-GPU nodes
with their own NIC names), exactly as ``mlenv render`` and ``mlenv launch --dry-run`` print them; the validation of
the ``slurm:`` section; quoting that a shell really reads back; the parsers of squeue, scontrol and sinfo output
(formats pinned by tests/integration/test_slurm_harness.py); and the ssh command lines for a login host."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from mlenv import state
from mlenv.backends.slurm import jobs
from mlenv.backends.slurm.backend import SlurmBackend
from mlenv.backends.slurm.checks import NodeRow, minutes, parse_sinfo
from mlenv.backends.slurm.jobs import JobInfo
from mlenv.backends.slurm.login import Login
from mlenv.backends.slurm.script import grace_seconds, task_wrapper
from mlenv.backends.slurm.settings import SlurmSettings, owned_option
from mlenv.config.model import Bind, Container
from mlenv.core.capabilities import Feature, LaunchSpec, Refused
from mlenv.core.clusters import load_plan

from tests.helpers import invoke as mlenv

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "fixtures" / "slurm"
RUN_ID = re.compile(r"\d{8}-\d{6}-(olivia|slurm-gloo|x)")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project holding the repository's two Slurm cluster files, as the current directory (so messages and
    scripts name them clusters/NAME.yaml)."""
    (tmp_path / "clusters").mkdir()
    (tmp_path / "manifests").mkdir()
    for name in ("olivia", "slurm-gloo"):
        shutil.copy(ROOT / "clusters" / f"{name}.yaml", tmp_path / "clusters")
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def golden(name: str) -> str:
    return (GOLDEN / name).read_text()


@pytest.mark.parametrize("cluster", ["olivia", "slurm-gloo"])
def test_render_and_deploy_dry_run_print_the_allocation_script(project: Path, cluster: str) -> None:
    rendered = mlenv("render", cluster)
    assert (rendered.exit_code, rendered.stdout) == (0, golden(f"{cluster}.allocation.sbatch"))
    assert mlenv("deploy", cluster, "--dry-run").stdout == rendered.stdout


@pytest.mark.parametrize(("cluster", "args"), [("olivia", ["--steps", "5"]), ("slurm-gloo", ["--engine", "ddp"])])
def test_launch_dry_run_prints_the_batch_job(project: Path, cluster: str, args: list[str]) -> None:
    result = mlenv("launch", "-c", cluster, "--launcher", "torchrun", "--dry-run", "train_multi_node.py", *args)
    assert result.exit_code == 0, result.output
    assert RUN_ID.sub("RUN", result.stdout) == golden(f"{cluster}.batch.sbatch")


def test_the_container_line_of_seed_001(project: Path) -> None:
    text = golden("olivia.batch.sbatch")
    assert ("  apptainer exec --nv --bind /opt/cray/libfabric/1.22.0/lib64:/opt/libfabric/lib "
            "--bind /opt/cray/libfabric/1.22.0/include:/opt/libfabric/include "
            "--bind /cluster/work/support/nccl:/opt/nccl "
            "--bind /usr/lib64:/usr/lib64 --bind /opt/nvidia/hpc_sdk/Linux_aarch64/24.11/compilers/lib:"
            "/opt/nvidia/hpc_sdk/lib --bind /cluster/work/users/me/mlenv --pwd /cluster/work/users/me/mlenv "
            "--env 'LD_LIBRARY_PATH=/opt/libfabric/lib:/opt/nccl/lib:/opt/nvidia/hpc_sdk/lib:/usr/lib64:"
            "$LD_LIBRARY_PATH' --env 'CPATH=/opt/libfabric/include:$CPATH' "
            "--env PYTHONPATH=/cluster/work/users/me/mlenv/.mlenv "
            "/cluster/work/support/container/pytorch_nvidia_25.06_arm64.sif \\\n"
            "  python3 -m mlenv.runtime launch --launcher torchrun --run-dir .mlenv/runs/RUN -- train_multi_node.py "
            "--steps 5\n") in text
    assert "#SBATCH --exclusive\n" in text and "\nmodule load NRIS/GPU\n" in text


def test_the_per_host_interfaces_of_seed_003_replace_its_rank_table(project: Path) -> None:
    text = golden("slurm-gloo.batch.sbatch")
    assert ("case \"$SLURMD_NODENAME\" in master-node) export NCCL_SOCKET_IFNAME=ens1f1 GLOO_SOCKET_IFNAME=ens1f1 ;; "
            "node01) export NCCL_SOCKET_IFNAME=ens1f1 GLOO_SOCKET_IFNAME=ens1f1 ;; node02) export "
            "NCCL_SOCKET_IFNAME=ens1f0np0 GLOO_SOCKET_IFNAME=ens1f0np0 ;;") in text
    assert "case $RANK" not in text and "\nexec python3 -m mlenv.runtime slurm-attempts " in text


def test_fewer_nodes_take_the_first_pinned_ones_and_more_are_refused(project: Path) -> None:
    four = mlenv("render", "slurm-gloo", "--nodes", "4").stdout
    path = project / "clusters/slurm-gloo.yaml"
    path.write_text(path.read_text().replace("  default_nodes: 6\n", ""))  # default: every pinned node
    assert "#SBATCH --nodes=6\n" in mlenv("render", "slurm-gloo").stdout
    assert "#SBATCH --nodes=4\n" in four and "#SBATCH --nodelist=master-node,node01,node02,node03\n" in four
    refused = mlenv("render", "slurm-gloo", "--nodes", "7")
    line = (project / "clusters/slurm-gloo.yaml").read_text().splitlines().index(
        "  nodelist: [master-node, node01, node02, node03, node04, node05]") + 1
    assert (refused.exit_code, refused.stderr) == (2, f"error: clusters/slurm-gloo.yaml:{line}:3: slurm.nodelist: 7 "
                                                      "nodes requested but only 6 are pinned here; use --nodes 6 or "
                                                      "fewer, or pin more nodes\n")


def test_the_launch_inside_an_allocation(project: Path) -> None:
    backend = SlurmBackend(state.RECORDS)
    handle = backend.prepare(load_plan("olivia")).handle
    handle = replace(handle, data={**handle.data, "allocation": {"id": "4242", "digest": "x"}})
    spec = LaunchSpec("torchrun", "train_multi_node.py", ("--steps", "5"), run_id="RUN", secrets=("HF_TOKEN",))
    request = backend.prepare_launch(handle, spec)
    assert request.text == golden("olivia.allocation-launch.sh")
    assert "HF_TOKEN=" not in request.text and request.env == {"MLENV_RUN_ID": "RUN"}
    task = ["python3", "-m", "mlenv.runtime", "launch", "--launcher", "torchrun", "--run-dir", ".mlenv/runs/RUN", "--",
            "train_multi_node.py", "--steps", "5"]
    assert dict(request.commands) == {0: task, 1: task}


def test_what_slurm_refuses_for_one_deployment_is_a_refusal_of_a_feature(project: Path) -> None:
    backend = SlurmBackend(state.RECORDS)
    handle = backend.prepare(load_plan("olivia")).handle
    spec = LaunchSpec("torchrun", "train_multi_node.py", run_id="RUN", secrets=("HF_TOKEN",))
    with pytest.raises(Refused) as refused:  # a batch job would need the secret after mlenv is gone
        backend.prepare_launch(handle, spec)
    assert refused.value.feature is Feature.JOBS and str(refused.value).startswith("--env HF_TOKEN: on Slurm, a batch")
    allocated = replace(handle, data={**handle.data, "allocation": {"id": "4242", "digest": "x"}})
    preempt = backend.preemption_refused(allocated)
    assert preempt is not None and preempt.feature is Feature.TAKE_AWAY and "steps of its allocation" in str(preempt)


def test_request_and_handle(project: Path) -> None:
    request = SlurmBackend(state.RECORDS).prepare(load_plan("slurm-gloo"))
    assert request.files == {"allocation.sbatch": golden("slurm-gloo.allocation.sbatch")}
    handle = request.handle
    assert (handle.backend, handle.name, handle.nodes, handle.mode, handle.shared_workspace) == (
        "slurm", "slurm-gloo", 6, "tcp", True)
    assert handle.data["allocation"] is None
    assert list(handle.data["job"]["hosts"]) == ["master-node", "node01", "node02", "node03", "node04", "node05"]
    assert "MASTER_ADDR" not in handle.env and handle.env["MLENV_NUM_NODES"] == "6"


SLURM_FILE = """\
backend: slurm
cluster: {name: x}
slurm:
  partition: debug
  workdir: /scratch/x
  extra_sbatch: ["--exclusive", "--gres=gpu:a100:4"]
gpus: {per_node: 0, default_nodes: 2, procs_per_node: 2}
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "clusters" / "x.yaml"
    path.write_text(text)
    return "clusters/x.yaml"


@pytest.mark.parametrize(("option", "owned", "instead"), [
    ("--nodes=4", "--nodes", "gpus.default_nodes (or mlenv --nodes)"),
    ("-N4", "--nodes", "gpus.default_nodes (or mlenv --nodes)"),
    ("--outp=x.log", "--output", "nothing: mlenv writes the output to slurm.workdir/.mlenv/runs/<run>/"),
    ("-J", "--job-name", "cluster.name (jobs are named mlenv-<name>)"),
    ("--partition=gpu", "--partition", "slurm.partition"),
    ("--ntasks-per-node=4", "--ntasks-per-node", "gpus.procs_per_node (mlenv runs one task per node, which starts "
                                                 "the processes)"),
])
def test_extra_sbatch_cannot_set_what_mlenv_sets(project: Path, option: str, owned: str, instead: str) -> None:
    path = write(project, SLURM_FILE.replace('"--exclusive"', f'"{option}"'))
    result = mlenv("validate", path)
    assert (result.exit_code, result.stderr) == (
        2, f'error: {path}:6:18: slurm.extra_sbatch[0]: "{option}" sets {owned}, which mlenv sets itself; '
           f"use {instead}\n")


def test_options_of_their_own_pass() -> None:
    assert [owned_option(o) for o in ("--exclusive", "--gres=gpu:4", "--mem-per-cpu=4G", "--time-min=10",
                                      "--nodefile=h", "--ntasks-per-core=1", "-x", "--mail-type=END")] == [None] * 8


def test_the_slurm_section_is_validated_like_every_file(project: Path) -> None:
    text = SLURM_FILE.replace("  partition: debug\n", "  partiton: debug\n  time: 1 hour\n").replace(
        "  workdir: /scratch/x\n", "  workdir: relative/dir\n  login: -oProxyCommand=x\n")
    result = mlenv("validate", write(project, text))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: clusters/x.yaml:3:1: slurm: missing required field 'partition'; add it (see clusters/template.yaml)",
        "error: clusters/x.yaml:4:3: slurm.partiton: unknown field; did you mean 'partition'?",
        'error: clusters/x.yaml:5:3: slurm.time: expected a Slurm time limit: minutes, "HH:MM:SS", "D-HH:MM:SS" '
        'or "UNLIMITED", got "1 hour"',
        'error: clusters/x.yaml:6:3: slurm.workdir: expected an absolute path without spaces, \':\' or \',\', got '
        '"relative/dir"',
        "error: clusters/x.yaml:7:3: slurm.login: expected an ssh destination like me@login.cluster.example "
        '(user@host:port, ssh://user@host:port or an alias from ~/.ssh/config), got "-oProxyCommand=x"']


def test_settings_and_the_ignored_sections(project: Path) -> None:
    extra = "storage: {mode: rwx, class_rwx: nfs}\nnodes: {gpu_nodes: [a, b]}\n"
    cluster = load_plan(write(project, SLURM_FILE + extra)).cluster
    assert cluster.settings == SlurmSettings(partition="debug", workdir="/scratch/x",
                                             extra_sbatch=("--exclusive", "--gres=gpu:a100:4"))
    assert cluster.warnings == ("storage: is ignored: backend slurm does not use it",
                                "nodes: is ignored: backend slurm does not use it")


def test_slurm_ssh_says_how_ssh_reaches_the_login_host(project: Path) -> None:
    text = SLURM_FILE.replace("  workdir: /scratch/x\n", "  workdir: /scratch/x\n  login: me@login.example\n  ssh: {"
                              "identity_file: ~/.ssh/hpc_ed25519, known_hosts: /etc/hpc_known_hosts, jump: bastion, "
                              "connect_timeout: '25'}\n")
    settings = load_plan(write(project, text)).cluster.settings
    login = Login.of(settings)
    assert login == Login("me@login.example", "~/.ssh/hpc_ed25519", "/etc/hpc_known_hosts", "bastion", 25)
    argv = login.argv(["squeue"])
    assert argv[3:5] == ["-J", "bastion"]
    config = Path(argv[2]).read_text().splitlines()
    for option in ('IdentityFile "~/.ssh/hpc_ed25519"', "IdentitiesOnly yes",
                   'UserKnownHostsFile "/etc/hpc_known_hosts"', "ConnectTimeout 25"):
        assert option in config
    assert Login.of(SlurmSettings(partition="p", workdir="/w", login="h")).argv(["squeue"])[3:5] == ["-T", "--"]


def test_slurm_ssh_is_checked_as_the_ssh_backend_checks_it(project: Path) -> None:
    text = SLURM_FILE.replace("  workdir: /scratch/x\n", "  workdir: /scratch/x\n  ssh: {identity_file: key, "
                              "known_hosts: '~/x\"y', jump: '-oProxyCommand=x', connect_timeout: 0, user: me}\n")
    result = mlenv("validate", write(project, text))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: clusters/x.yaml:6:77: slurm.ssh.connect_timeout: expected seconds 1-300 (ssh's ConnectTimeout), got 0",
        "error: clusters/x.yaml:6:97: slurm.ssh.user: unknown field; allowed here: connect_timeout, identity_file, "
        "jump, known_hosts"]
    result = mlenv("validate", write(project, text.replace(", connect_timeout: 0, user: me", "")))
    assert result.stderr.splitlines() == [
        "error: clusters/x.yaml:6:3: slurm.ssh: slurm.ssh says how to reach slurm.login, which is not set: set "
        "slurm.login to the login host, or remove slurm.ssh",
        'error: clusters/x.yaml:6:9: slurm.ssh.identity_file: expected an absolute path or one starting with ~/, '
        'got "key"',
        'error: clusters/x.yaml:6:29: slurm.ssh.known_hosts: expected an absolute path or one starting with ~/, '
        'got "~/x\\"y"',
        "error: clusters/x.yaml:6:51: slurm.ssh.jump: a host cannot start with '-' (ssh would read it as an option), "
        'got "-oProxyCommand=x" (several hops: a,b)']


def test_values_reach_the_nodes_exactly_and_never_run(project: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = {"A": f"$(touch {marker})", "B": "it's `id`; echo \"x\" \\ $HOME", "C": "a\tb"}
    text = SLURM_FILE + f"env: {json.dumps(hostile)}\n"
    path = write(project, text)
    args = ["--x", f"$(touch {marker})", "a'b"]
    result = mlenv("launch", "-c", path, "--launcher", "torchrun", "--dry-run", "job.py\nrm -rf /", *args)
    assert result.exit_code == 0, result.output
    script = result.stdout
    assert "# mlenv launch: run " in script and "job.py\\nrm -rf /" in script.splitlines()[1]
    exports = "\n".join(line for line in script.splitlines() if line.startswith("export "))
    shown = subprocess.run(["bash", "-c", exports + '\nprintf "%s\\0" "$A" "$B" "$C"'], capture_output=True,
                           timeout=10, check=True, env={"PATH": "/usr/bin:/bin"}).stdout.decode()
    assert shown.split("\0")[:3] == list(hostile.values())
    task = script[script.index("  python3 -m mlenv.runtime launch"):]  # the last of the script
    assert shlex.split(task)[-4:] == ["job.py\nrm -rf /", *args]
    assert subprocess.run(["bash", "-n", "-c", script], timeout=10, check=False).returncode == 0
    assert not marker.exists()


def test_setup_lines_are_the_users_own_code(project: Path) -> None:
    path = write(project, SLURM_FILE.replace("  extra_sbatch", "  setup: ['source ~/venv/bin/activate && "
                                                               "export X=$(hostname)']\n  extra_sbatch"))
    script = mlenv("launch", "-c", path, "--dry-run", "t.py").stdout
    assert ("\n# slurm.setup: your own shell code, run as written\n"
            "source ~/venv/bin/activate && export X=$(hostname)\n") in script


def test_squeue_and_scontrol_output() -> None:
    assert jobs.parse_squeue("5|RUNNING|None|n[1-2]|1:28\n6|PENDING|PartitionDown||0:00\n") == {
        "5": JobInfo("5", "RUNNING", "None", "n[1-2]", "1:28"),
        "6": JobInfo("6", "PENDING", "PartitionDown", None, "0:00")}
    fields = jobs.parse_scontrol("JobId=6 JobName=wrap UserId=root(0) JobState=FAILED Reason=NonZeroExitCode "
                                 "Dependency=(null) ExitCode=3:0 RunTime=00:00:01 NodeList=n[1-2] BatchHost=n1 "
                                 "StdOut=/tmp/x/job_6.out\n")
    assert {k: fields[k] for k in ("JobState", "Reason", "ExitCode", "NodeList", "StdOut")} == {
        "JobState": "FAILED", "Reason": "NonZeroExitCode", "ExitCode": "3:0", "NodeList": "n[1-2]",
        "StdOut": "/tmp/x/job_6.out"}
    assert [jobs.exit_code(text) for text in ("3:0", "0:15", "0:0", "")] == [3, 143, 0, None]
    pending = JobInfo("6", "PENDING", "PartitionNodeLimit")
    assert pending.permanent and pending.words() == (
        "PENDING (PartitionNodeLimit: it asks for more nodes than the partition allows: lower the node count or "
        "pick another partition)")
    assert not JobInfo("7", "PENDING", "Resources").permanent
    assert JobInfo("8", "FAILED", exit_code=3).words() == "FAILED (exit code 3)"
    assert JobInfo("9", "RUNNING", nodelist="gpu-[08-10]").hosts == ["gpu-08", "gpu-09", "gpu-10"]


def test_sinfo_output_and_time_limits() -> None:
    assert parse_sinfo("n1|up|mixed|gpu:2|infinite\nn2|up|drained*|gpu:a100:4(S:0-1)|1-00:00:00\n") == [
        NodeRow("n1", True, "mixed", 2, "infinite"), NodeRow("n2", True, "drained*", 4, "1-00:00:00")]
    assert [row.usable for row in parse_sinfo("a|up|idle|(null)|5\nb|up|down*|(null)|5\nc|up|mix~|(null)|5\n")] == [
        True, False, True]
    assert [minutes(t) for t in ("60", "1:30", "01:00:00", "1-00:00:00", "2-12", "infinite", "x")] == [
        60, 1.5, 60, 1440, 3600, float("inf"), None]


def test_commands_run_here_or_over_ssh_on_the_login_host() -> None:
    command = ["sh", "-c", 'echo "$1"', "sh", "a b;c"]
    assert Login(None).argv(command) == command
    assert Login(None).copy_target("/scratch/x").destination == "/scratch/x/"
    login = Login("me@login.example:2222")
    argv = login.argv(command)
    assert argv[:2] == ["ssh", "-F"] and argv[3:] == ["-p", "2222", "-T", "--", "me@login.example",
                                                      shlex.join(command)]
    config = Path(argv[2]).read_text()
    for option in ("BatchMode yes", "ConnectTimeout 10", "StrictHostKeyChecking accept-new", "ControlMaster auto"):
        assert option in config.splitlines()
    assert login.argv(["bash"], tty=True)[3:] == ["-p", "2222", "-t", "--", "me@login.example", "bash"]
    target = login.copy_target("/scratch/x")
    assert (target.destination, target.rsh) == ("me@login.example:/scratch/x/", argv[:5])


def test_the_login_shell_gets_back_exactly_the_arguments() -> None:
    """sshd hands the remote command to the login shell as one string: ``sh -c`` must split it into the argv."""
    command = ["printf", "%s\\n", "a b;c", "$(touch /nonexistent/x)", "it's", "`id`", "*", "tab\there", ""]
    remote = Login("me@login.example").argv(command)[-1]
    shown = subprocess.run(["sh", "-c", remote], capture_output=True, text=True, timeout=10, check=True).stdout
    assert shown == "".join(f"{arg}\n" for arg in command[2:])


def test_the_handle_keeps_the_settings_and_container(project: Path) -> None:
    backend = SlurmBackend(state.RECORDS)
    handle = backend.prepare(load_plan("olivia")).handle
    from mlenv.backends.slurm.backend import job_from

    job = job_from(handle)
    assert job.container == Container("apptainer", "/cluster/work/support/container/pytorch_nvidia_25.06_arm64.sif",
                                      True, tuple(Bind(h, c, "rw") for h, c in (
                                          ("/opt/cray/libfabric/1.22.0/lib64", "/opt/libfabric/lib"),
                                          ("/opt/cray/libfabric/1.22.0/include", "/opt/libfabric/include"),
                                          ("/cluster/work/support/nccl", "/opt/nccl"),
                                          ("/usr/lib64", "/usr/lib64"),
                                          ("/opt/nvidia/hpc_sdk/Linux_aarch64/24.11/compilers/lib",
                                           "/opt/nvidia/hpc_sdk/lib"))),
                                      {"LD_LIBRARY_PATH": "/opt/libfabric/lib:/opt/nccl/lib:/opt/nvidia/hpc_sdk/lib:"
                                                          "/usr/lib64:$LD_LIBRARY_PATH",
                                       "CPATH": "/opt/libfabric/include:$CPATH"})
    assert job.settings.account == "nn1234k" and job.settings.cpus_per_task == 72


# --- slurm.signal and slurm.requeue ---


def with_warning(project: Path, signal: str = '"USR1@60"') -> None:
    """slurm-gloo.yaml asking for the warning signal and requeue."""
    path = project / "clusters/slurm-gloo.yaml"
    path.write_text(path.read_text().replace("  workdir: /home/shared/mlenv\n", "  workdir: /home/shared/mlenv\n"
                                             f"  signal: {signal}\n  requeue: true\n"))


def test_the_warning_signal_and_requeue_go_to_batch_scripts_only(project: Path) -> None:
    with_warning(project)
    result = mlenv("launch", "-c", "slurm-gloo", "--launcher", "torchrun", "--dry-run", "train_multi_node.py")
    assert result.exit_code == 0, result.output
    assert RUN_ID.sub("RUN", result.stdout) == golden("slurm-gloo.requeue.batch.sbatch")
    assert "#SBATCH --signal=B:USR1@60\n#SBATCH --requeue\n" in result.stdout
    assert "\nexport MLENV_CHECKPOINT_SIGNAL=SIGUSR1\n" in result.stdout  # the ranks' checkpoint signal, by name
    allocation = mlenv("render", "slurm-gloo").stdout  # the warning would end the allocation: never there
    assert "--signal" not in allocation and "--requeue" not in allocation and "trap ''" not in allocation
    assert "MLENV_CHECKPOINT_SIGNAL" not in allocation
    path = project / "clusters/slurm-gloo.yaml"  # by number: named for the training script's getattr(signal, ...)
    path.write_text(path.read_text().replace('signal: "USR1@60"', 'signal: "12@60"'))
    numbered = mlenv("launch", "-c", "slurm-gloo", "--launcher", "torchrun", "--dry-run", "train_multi_node.py")
    assert "\nexport MLENV_CHECKPOINT_SIGNAL=SIGUSR2\n" in numbered.stdout, numbered.output


@pytest.mark.parametrize(("signal", "kept"), [('"B:USR1@120"', "USR1@120"), ('"SIGUSR2@90"', "USR2@90"),
                                              ('"10@30"', "10@30"), ("usr1@5", "USR1@5")])
def test_the_warning_signal_by_name_or_number(project: Path, signal: str, kept: str) -> None:
    with_warning(project, signal)
    settings = load_plan("slurm-gloo").cluster.settings
    assert isinstance(settings, SlurmSettings) and (settings.signal, settings.requeue) == (kept, True)


def test_a_warning_at_or_before_the_time_limit_s_start_is_bad_input(project: Path) -> None:
    """A lead of the whole time limit would warn, checkpoint and requeue every start, forever."""
    cluster = project / "clusters" / "slurm-gloo.yaml"
    cluster.write_text(cluster.read_text().replace('time: "02:00:00"', 'time: "00:01:00"'))
    with_warning(project, '"USR1@120"')
    result = mlenv("validate", "slurm-gloo")
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(
        "error: clusters/slurm-gloo.yaml:16:3: slurm.signal: USR1@120 warns 120 s before the time limit, but "
        "slurm.time (clusters/slurm-gloo.yaml:13:3) is 00:01:00, 60 s: every start would get the warning at "
        "once"), result.stderr
    cluster.write_text(cluster.read_text().replace("USR1@120", "USR1@59"))
    assert mlenv("validate", "slurm-gloo").exit_code == 0


@pytest.mark.parametrize(("signal", "why"), [
    ('"USR1@x"', "expected sbatch's [B:]SIG@SECONDS like USR1@120 (SECONDS a whole number up to 65535), got "
                 '"USR1@x"'),
    ('"KILL@60"', '"KILL@60": SIGKILL cannot be caught, so it gives the job no time to checkpoint; use USR1 (or '
                  "another catchable signal)"),
    ('"9@60"', '"9@60": SIGKILL cannot be caught'),
    ('"STOP@60"', '"STOP@60": SIGSTOP cannot be caught'),
    ('"HUNGRY@60"', '"HUNGRY@60" names no signal: use a name like USR1, TERM, URG or a number'),
    ('"99@60"', "99 is not a signal number (1 to 64)"),
    ("USR1", "expected sbatch's [B:]SIG@SECONDS like USR1@120"),
])
def test_a_bad_warning_signal_is_bad_input(project: Path, signal: str, why: str) -> None:
    with_warning(project, signal)
    result = mlenv("validate", "slurm-gloo")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: clusters/slurm-gloo.yaml:16:3: slurm.signal: ") and why in result.stderr


def test_requeue_must_be_a_boolean(project: Path) -> None:
    path = project / "clusters/slurm-gloo.yaml"
    path.write_text(path.read_text().replace("  workdir: /home/shared/mlenv\n",
                                             "  workdir: /home/shared/mlenv\n  requeue: sometimes\n"))
    result = mlenv("validate", "slurm-gloo")
    assert (result.exit_code, result.stderr) == (
        2, 'error: clusters/slurm-gloo.yaml:16:3: slurm.requeue: expected true or false, got "sometimes"\n')


def test_the_warning_is_ignored_by_the_task_and_passed_on_by_the_batch_shell() -> None:
    wrapper = task_wrapper({}, warning="USR1")
    assert wrapper.startswith("export MLENV_NODE_RANK=\"$SLURM_NODEID\"; trap '' USR1; ")
    assert "trap" not in task_wrapper({})
    assert grace_seconds(120) == 90 and grace_seconds(1) == 1


@pytest.mark.parametrize(("placed", "rank"), [(False, "0"), (True, "1")])
def test_a_task_s_node_rank_is_its_place_in_the_nodelist_when_srun_placed_it_there(tmp_path: Path, placed: bool,
                                                                                     rank: str) -> None:
    """n2, second in the run's --nodelist (a spare in node 1's place) but first in Slurm's order (SLURM_NODEID 0):
    node 1 where srun placed the tasks in the order of the list (SLURM_PROCID), else Slurm's order; the failed file
    names the same node."""
    (tmp_path / "attempt-0").mkdir()
    env = {"PATH": os.environ["PATH"], "SLURM_NODEID": "0", "SLURM_PROCID": "1", "SLURMD_NODENAME": "n2",
           "MLENV_RUN_DIR": str(tmp_path), "MLENV_RESTART_COUNT": "0"}
    wrapper = task_wrapper({}, placed=placed)
    said = subprocess.run(["sh", "-c", wrapper, "sh", "sh", "-c", 'echo "$MLENV_NODE_RANK"; exit 3'], env=env,
                          capture_output=True, text=True, check=False)
    assert (said.returncode, said.stdout) == (3, f"{rank}\n"), said.stderr
    assert (tmp_path / "attempt-0" / "failed").read_text() == f"{rank} 3\n"
