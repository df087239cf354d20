"""ssh's failures as one line naming the host, with the fix as its own value: the doctor's fix column is that
value, never a piece cut out of the message."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from mlenv.backends.ssh.diagnose import CHANGED, failure
from mlenv.backends.ssh.facts import _reply
from mlenv.backends.sshlink.hosts import parse_host
from mlenv.backends.sshlink.transport import SSH_FAILED, Transport


def _transport(tmp_path: Path, **fields: str) -> Transport:
    return Transport(connect_timeout=5, control_dir=str(tmp_path), known_hosts=str(tmp_path / "known"), **fields)


def test_a_changed_host_key_gives_the_keygen_command_as_the_fix(tmp_path: Path) -> None:
    transport = _transport(tmp_path)
    said = failure(transport, parse_host("gpu1"), f"@@@\n@ WARNING: {CHANGED}! @\nHost key verification failed.\n")
    assert said.fix == f"ssh-keygen -R gpu1 -f {shlex.quote(str(tmp_path / 'known'))}"
    assert said.message.startswith("gpu1: its host key has changed") and said.message.endswith(said.fix)


def test_a_key_that_needs_a_passphrase_gives_ssh_add_of_that_key(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(key)], check=True)
    reply = _reply(_transport(tmp_path, identity_file=str(key)), parse_host("gpu1"), "python3", SSH_FAILED, "",
                   "gpu1: Permission denied (publickey).\n")
    assert reply.facts is None and reply.fix == f"ssh-add {key}"
    assert reply.error is not None and "needs a passphrase" in reply.error


def test_a_refused_login_without_a_locked_key_has_no_fix(tmp_path: Path) -> None:
    said = failure(_transport(tmp_path), parse_host("gpu1"), "gpu1: Permission denied (publickey).\n")
    assert (said.message, said.fix) == ("gpu1: login refused (gpu1: Permission denied (publickey).)", None)
