"""The ssh backend's host forms (host, user@host:port, ssh:// URLs, [v6addr]:port, aliases), the ``ssh:`` section's
problems as file:line:col lines, and the command lines built from them (pure: nothing is run)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from mlenv.backends.ssh.backend import SshBackend
from mlenv.backends.ssh.settings import SshSettings
from mlenv.backends.ssh.target import SshTarget
from mlenv.backends.sshlink.hosts import HostError, HostSpec, parse_host
from mlenv.backends.sshlink.transport import Transport
from mlenv.plan import plan

from tests.unit.config.files import ROOT, edited, loaded, position, problems

LAB = (ROOT / "clusters/lab.yaml").read_text()
HOSTS_LINE = '  hosts: [gpu1.lab.example, "me@gpu2.lab.example:2222"]'

GOOD = [
    # (as written, host, user, port, ssh destination with default user "dflt", how messages name it)
    ("gpu1.lab.example", "gpu1.lab.example", None, None, "dflt@gpu1.lab.example", "gpu1.lab.example"),
    ("me@gpu2.lab.example:2222", "gpu2.lab.example", "me", 2222, "me@gpu2.lab.example", "me@gpu2.lab.example:2222"),
    ("ssh://me@gpu2:2222", "gpu2", "me", 2222, "me@gpu2", "me@gpu2:2222"),
    ("ssh://gpu2/", "gpu2", None, None, "dflt@gpu2", "gpu2"),
    ("GPU-Box_1", "GPU-Box_1", None, None, "dflt@GPU-Box_1", "GPU-Box_1"),  # an alias from ~/.ssh/config, case kept
    ("10.0.0.7:22", "10.0.0.7", None, 22, "dflt@10.0.0.7", "10.0.0.7:22"),
    ("[fd00::7]:2200", "fd00::7", None, 2200, "dflt@fd00::7", "[fd00::7]:2200"),
    ("root@[::1]", "::1", "root", None, "root@::1", "root@[::1]"),
    ("ssh://a.b@[fe80::1%eth0]:22", "fe80::1%eth0", "a.b", 22, "a.b@fe80::1%eth0", "a.b@[fe80::1%eth0]:22"),
]

BAD = [
    ("", "expected host, user@host"),
    ("fd00::7", "write an IPv6 address in brackets: [fd00::7] or [fd00::7]:22"),
    ("[fd00::7", "Invalid IPv6 URL"),
    ("[fd00::7]x", "unexpected 'x' after ']'"),
    ("[gpu1]:22", "'gpu1' does not appear to be an IPv4 or IPv6 address"),
    ("gpu1:", "expected a port 1-65535 after ':'"),
    ("gpu1:0", "expected a port 1-65535 after ':'"),
    ("gpu1:70000", "expected a port 1-65535 after ':', got '70000'"),
    ("gpu1:ssh", "expected a port 1-65535 after ':', got 'ssh'"),
    ("-oProxyCommand=touch /tmp/x", "a host cannot contain spaces"),
    ("-oProxyCommand=x", "a host cannot start with '-' (ssh would read it as an option)"),
    ("gpu1 gpu2", "a host cannot contain spaces or control characters"),
    ("gpu1\n", "a host cannot contain spaces or control characters"),
    ("https://gpu1", "only ssh:// URLs are understood"),
    ("ssh://gpu1/home/me", "unexpected path or query after the host"),
    ("gpu1?x=1", "unexpected path or query after the host"),
    ("me:secret@gpu1", "a password in the host is not supported"),
    ("a@b@gpu1", "expected a user name of letters, digits, '.', '_' or '-' before '@', got 'a@b'"),
    ("gpu1;touch", "expected a host name, alias or address of letters, digits, '.', '_' or '-', got 'gpu1;touch'"),
]


@pytest.mark.parametrize(("text", "host", "user", "port", "destination", "display"), GOOD, ids=[g[0] for g in GOOD])
def test_accepted_forms(text: str, host: str, user: str | None, port: int | None, destination: str,
                        display: str) -> None:
    spec = parse_host(text)
    assert spec == HostSpec(host, user, port)
    assert (spec.destination("dflt"), spec.display()) == (destination, display)


@pytest.mark.parametrize(("text", "message"), BAD, ids=[repr(b[0]) for b in BAD])
def test_rejected_forms_say_why(text: str, message: str) -> None:
    with pytest.raises(HostError, match=None) as caught:
        parse_host(text)
    assert message in str(caught.value)


def test_the_example_cluster_file_loads(tmp_path: Path) -> None:
    settings = loaded(tmp_path / "lab.yaml", LAB).settings
    assert settings == SshSettings(
        hosts=(HostSpec("gpu1.lab.example"), HostSpec("gpu2.lab.example", "me", 2222)), user="me",
        identity_file="~/.ssh/id_ed25519", jump="bastion.lab.example", known_hosts="~/.ssh/known_hosts",
        workdir="~/mlenv/workspace", python="/opt/conda/bin/python3", connect_timeout=10)


def test_every_bad_field_is_one_line_at_its_place(tmp_path: Path) -> None:
    text = edited(LAB, (HOSTS_LINE, '  hosts: [gpu1, "fd00::7", "gpu1", "ok:99999"]'),
                  ("identity_file: ~/.ssh/id_ed25519", "identity_file: keys/id"),
                  ("jump: bastion.lab.example", "jump: bastion,-x"),
                  ("workdir: ~/mlenv/workspace", "workdir: ~other/ws"),
                  ("python: /opt/conda/bin/python3", "python: python3 -u"))
    path = tmp_path / "x.yaml"
    snippets = {"v6": '"fd00', "twice": '"gpu1"', "port": '"ok:', "key": "identity_file", "jump": "jump:",
                "workdir": "workdir:", "python": "python:"}
    at = {name: f"{path}:{position(text, snippet)}" for name, snippet in snippets.items()}
    assert problems(path, text) == [
        f'{at["v6"]}: ssh.hosts[1]: write an IPv6 address in brackets: [fd00::7] or [fd00::7]:22, got "fd00::7"',
        f'{at["twice"]}: ssh.hosts[2]: "gpu1" is listed twice (first as hosts[0]); one node runs per host, so '
        "list each host once",
        f"{at['port']}: ssh.hosts[3]: expected a port 1-65535 after ':', got '99999', got \"ok:99999\"",
        f'{at["key"]}: ssh.identity_file: expected an absolute path or one starting with ~/, got "keys/id"',
        f"{at['jump']}: ssh.jump: a host cannot start with '-' (ssh would read it as an option), got "
        '"bastion,-x" (several hops: a,b)',
        f"{at['workdir']}: ssh.workdir: expected a directory path (absolute, or ~/... in the login's home), "
        'got "~other/ws"',
        f'{at["python"]}: ssh.python: expected a command or an absolute path like /opt/conda/bin/python3, got '
        '"python3 -u"',
    ]
    bad_schema = edited(LAB, ("connect_timeout: 10", "connect_timeout: 0"), ("user: me", "user: me;rm"))
    user, timeout = position(bad_schema, "user: me;rm"), position(bad_schema, "connect_timeout")
    assert problems(path, bad_schema) == [
        f"{path}:{user}: ssh.user: expected a login name (letters, digits, '.', '_' or '-'), got \"me;rm\"",
        f"{path}:{timeout}: ssh.connect_timeout: expected seconds 1-300 (ssh's ConnectTimeout), got 0"]


def test_hosts_are_the_nodes(tmp_path: Path) -> None:
    three = edited(LAB, (HOSTS_LINE, "  hosts: [a, b, c]"), ("  default_nodes: 2\n", ""))
    path = tmp_path / "x.yaml"
    assert plan(loaded(path, three)).nodes == 3  # without gpus.default_nodes, every host is a node
    assert plan(loaded(path, edited(three, ("gpus:\n", "gpus:\n  default_nodes: 1\n")))).nodes == 1
    more = edited(LAB, ("default_nodes: 2", "default_nodes: 3"))
    assert problems(path, more) == [
        f"{path}:{position(more, 'default_nodes')}: gpus.default_nodes: 3 nodes but ssh.hosts lists 2: one node "
        "runs per host; list more hosts or lower gpus.default_nodes"]
    missing = LAB[:LAB.index("ssh:\n")] + LAB[LAB.index("gpus:\n"):]
    assert problems(path, missing) == [
        f"{path}:1:1: ssh: backend ssh needs an ssh: section with its hosts (see clusters/lab.yaml)"]


def test_the_request_is_pure_and_every_value_is_quoted(tmp_path: Path) -> None:
    cluster = loaded(tmp_path / "lab.yaml", edited(LAB, ("~/.ssh/id_ed25519", "/keys/my key%1")))
    request = SshBackend(uid=1234).prepare(plan(cluster))
    assert request == SshBackend(uid=1234).prepare(plan(cluster))
    target = SshTarget.of(request.handle)
    transport = target.transport
    assert transport.control_dir == "/tmp/mlenv-ssh-1234" and not Path(transport.control_dir).exists()  # pure
    assert transport.config_path.startswith("/tmp/mlenv-ssh-1234/") and " " not in transport.config_path
    config = transport.config_text.splitlines()
    assert config[1:4] == ["BatchMode yes", "ConnectTimeout 10", "StrictHostKeyChecking accept-new"]
    assert 'IdentityFile "/keys/my key%%1"' in config and "ControlPath /tmp/mlenv-ssh-1234/%C" in config
    assert config[-2:] == ["Include ~/.ssh/config", "Include /etc/ssh/ssh_config"]  # after ours: ours win
    assert "StrictHostKeyChecking no" not in request.text
    second = target.hosts[1]
    argv = transport.ssh_argv(second, ["printf", "%s", "a b", "$HOME", "it's"])
    assert argv == ["ssh", "-F", transport.config_path, "-p", "2222", "-J", "bastion.lab.example", "-T", "--",
                    "me@gpu2.lab.example", "printf %s 'a b' '$HOME' 'it'\"'\"'s'"]
    assert shlex.split(argv[-1]) == ["printf", "%s", "a b", "$HOME", "it's"]
    assert transport.destination(target.hosts[0], "/home/me/ws") == "me@gpu1.lab.example:/home/me/ws/"
    v6 = Transport(5, "/tmp/c", "u")
    assert v6.destination(HostSpec("fd00::7", None, 2200), "/ws") == "u@[fd00::7]:/ws/"
    assert v6.ssh_argv(HostSpec("fd00::7", None, 2200), ["true"])[-3:] == ["--", "u@fd00::7", "true"]


def test_spares_are_hosts_checked_like_them(tmp_path: Path) -> None:
    spares = ["gpu3", "me@gpu2.lab.example:2222", "gpu3", "x;y"]
    text = edited(LAB, (HOSTS_LINE, HOSTS_LINE + "\n  spares:\n" + "".join(f"    - {s!r}\n" for s in spares)))
    path = tmp_path / "x.yaml"
    first = text.splitlines().index("  spares:") + 2  # the line of spares[0]; every item at column 7
    assert problems(path, text) == [
        f'{path}:{first + 1}:7: ssh.spares[1]: "me@gpu2.lab.example:2222" is listed twice (first as hosts[1]); one '
        "node runs per host, so list each host once",
        f'{path}:{first + 2}:7: ssh.spares[2]: "gpu3" is listed twice (first as spares[0]); one node runs per host, so '
        "list each host once",
        f"{path}:{first + 3}:7: ssh.spares[3]: expected a host name, alias or address of letters, digits, '.', '_' or "
        "'-', got 'x;y', got \"x;y\""]
    good = loaded(path, edited(LAB, (HOSTS_LINE, HOSTS_LINE + "\n  spares: [gpu3, 'ssh://gpu4:2200']"))).settings
    assert isinstance(good, SshSettings) and good.spares == (HostSpec("gpu3"), HostSpec("gpu4", None, 2200))


def test_a_left_out_host_is_replaced_by_a_spare_in_the_launch_and_its_dry_run(tmp_path: Path) -> None:
    from dataclasses import replace

    from mlenv.core.capabilities import LaunchSpec
    from mlenv.errors import OperationError

    text = edited(LAB, (HOSTS_LINE, HOSTS_LINE + "\n  spares: [gpu3, gpu4]"))
    backend = SshBackend(uid=1234)
    backend.control_dir = str(tmp_path / "ssh")  # nodes writes the ssh_config there, not in /tmp/mlenv-ssh-1234
    prepared = backend.prepare(plan(loaded(tmp_path / "lab.yaml", text))).handle
    target = SshTarget.of(prepared)
    assert [target.label(i) for i in range(4)] == ["me@gpu1.lab.example", "me@gpu2.lab.example:2222", "me@gpu3",
                                                   "me@gpu4"]
    handle = replace(prepared, data=replace(target, workspaces=("/w0", "/w1", "/w2", "/w3")).to_data())
    spec = LaunchSpec("torchrun", "train.py", run_id="r1", exclude=("me@gpu3", "me@gpu2.lab.example:2222"))
    request = backend.prepare_launch(handle, spec)
    assert request == backend.prepare_launch(handle, spec)  # pure
    assert request.spares == {1: ("me@gpu2.lab.example:2222", "me@gpu4")}  # gpu3 is excluded too: never used
    lines = request.text.splitlines()
    assert "# node-1: me@gpu2.lab.example:2222 excluded, using spare me@gpu4" in lines
    assert [line.split(":")[0] for line in lines if line.startswith("node-")] == ["node-0", "node-1"]  # ranks kept
    nodes = backend.placed(handle, backend.nodes(handle), request.spares)
    assert [(n.ordinal, n.name, n.workspace) for n in nodes] == [(0, "me@gpu1.lab.example", "/w0"),
                                                                 (1, "me@gpu4", "/w3")]
    assert SshTarget.of(handle).machine(nodes[1].name, nodes[1].ordinal) == HostSpec("gpu4")  # what exec reaches
    first = backend.prepare_launch(handle, replace(spec, exclude=("me@gpu1.lab.example",)))
    assert first.spares == {0: ("me@gpu1.lab.example", "me@gpu3")}
    assert "# MASTER_ADDR=<the address of node 0's spare me@gpu3, as its ssh server sees the connection>" \
        in first.text.splitlines()
    with pytest.raises(OperationError) as short:
        backend.prepare_launch(handle, replace(spec, exclude=("me@gpu1.lab.example", "me@gpu2.lab.example:2222",
                                                               "me@gpu4")))
    assert str(short.value) == (
        "me@gpu1.lab.example, me@gpu2.lab.example:2222 must be left out of the run (mlenv nodes says why), and lab "
        "has 1 usable spare (me@gpu3) for the 2 excluded nodes (node-0, node-1): stopping. mlenv nodes "
        "--forget-excluded lets the run use them again")
