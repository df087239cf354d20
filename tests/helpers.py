"""What tests share: the checkout, the real `mlenv` command (in-process and as a subprocess) and free ports.

Imported one way, ``from tests.helpers import ...`` (pytest puts the checkout on sys.path)."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from click.testing import CliRunner, Result

ROOT = Path(__file__).resolve().parents[1]
MLENV = Path(sys.executable).parent / "mlenv"


def invoke(*args: str) -> Result:
    """Run the CLI in-process (stdout and stderr kept apart); an exception propagates with its traceback."""
    from mlenv.cli import main  # imported when first used: collecting the fast tier pays no CLI import

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def run_mlenv(*args: str, home: Path | None = None, cwd: Path = ROOT, env: Mapping[str, str] | None = None,
              input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the installed `mlenv` console script as a user would: from ``cwd``, in ``env`` (default: this
    process's environment) with MLENV_HOME=``home`` when given, ``input`` on its stdin."""
    environ = {**(os.environ if env is None else env), **({"MLENV_HOME": str(home)} if home is not None else {})}
    return subprocess.run([str(MLENV), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=environ, input=input, check=False)


def succeeded(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """``result``, of a command that had to succeed; else the test fails with the command line and its output."""
    assert result.returncode == 0, (f"{shlex.join(map(str, result.args))}: exit {result.returncode}\n"
                                    f"{result.stdout}\n{result.stderr}")
    return result


def free_ports(count: int, address: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports on ``address`` that were free a moment ago (held together, so never the same)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind((address, 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def free_port(address: str = "127.0.0.1") -> int:
    """A port on ``address`` that was free a moment ago."""
    return free_ports(1, address)[0]
