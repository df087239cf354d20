"""What tests share: the checkout, the real `mlenv` command (in-process and as a subprocess) and free ports.

Imported one way, ``from tests.helpers import ...`` (pytest puts the checkout on sys.path)."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

ROOT = Path(__file__).resolve().parents[1]
MLENV = Path(sys.executable).parent / "mlenv"


def invoke(*args: str) -> Result:
    """Run the CLI in-process (stdout and stderr kept apart); an exception propagates with its traceback."""
    from mlenv.cli import main  # imported when first used: collecting the fast tier pays no CLI import

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def run_mlenv(*args: str, home: Path | None = None, cwd: Path = ROOT, env: Mapping[str, str] | None = None,
              input: str | None = None, timeout: float = 120,
              python: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed `mlenv` console script as a user would: from ``cwd``, in ``env`` (default: this
    process's environment) with MLENV_HOME=``home`` when given, ``input`` on its stdin, by ``python`` when given
    (else by its own, the virtualenv's)."""
    environ = {**(os.environ if env is None else env), **({"MLENV_HOME": str(home)} if home is not None else {})}
    return subprocess.run([*([str(python)] if python else []), str(MLENV), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=environ, input=input, check=False)


def succeeded(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """``result``, of a command that had to succeed; else the test fails with the command line and its output."""
    assert result.returncode == 0, (f"{shlex.join(map(str, result.args))}: exit {result.returncode}\n"
                                    f"{result.stdout}\n{result.stderr}")
    return result


@contextmanager
def lock_held(path: Path) -> Iterator[None]:
    """``path`` flock-ed exclusively by another process, as another mlenv holds its lock files, until the block
    ends."""
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()", str(path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # held until its stdin closes
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)


def said_until(process: subprocess.Popen[str], text: str) -> list[str]:
    """``process``'s lines on stderr up to the first holding ``text`` (all of them, should it end first)."""
    assert process.stderr is not None
    said = [process.stderr.readline()]
    while said[-1] and text not in said[-1]:
        said.append(process.stderr.readline())
    return said


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


def worker_index() -> int:
    """This pytest-xdist worker's number (``gw3``: 3; 0 in a serial run): a harness that needs its own share of
    something machine-wide that is not picked free (Slurm's job ids, which its jobs' ports derive from) derives it
    from this."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)


def free_port(address: str = "127.0.0.1") -> int:
    """A port on ``address`` that was free a moment ago."""
    return free_ports(1, address)[0]


def documented_shape(name: str) -> Any:
    """The example of JSON shape ``name`` in docs/json.md (the JSON block after ``<!-- shape: NAME -->``)."""
    text = (ROOT / "docs" / "json.md").read_text()
    start = text.index("```json\n", text.index(f"<!-- shape: {name} -->")) + len("```json\n")
    return json.loads(text[start:text.index("```", start)])


def assert_shaped(value: Any, example: Any, where: str = "$", optional: frozenset[str] = frozenset()) -> None:
    """``value`` has ``example``'s shape: the same keys in every object (those named ``optional`` may be there too;
    an empty one is a map, any keys), values of the same JSON type or null, each item of a list shaped as the
    example's item that has the same ``valid`` (else its first)."""
    if value is None or example is None:
        return
    if isinstance(example, dict):
        assert isinstance(value, dict), f"{where}: {value!r} is no object"
        if not example:  # a map (by ordinal, by name): any keys
            return
        keys = sorted(set(value) - (optional - set(example)))
        assert keys == sorted(example), f"{where}: keys {sorted(value)}, documented {sorted(example)}"
        for key in keys:
            assert_shaped(value[key], example[key], f"{where}.{key}")
    elif isinstance(example, list):
        assert isinstance(value, list), f"{where}: {value!r} is no list"
        for index, item in enumerate(value):
            like = [e for e in example if isinstance(e, dict) and isinstance(item, dict)
                    and e.get("valid") == item.get("valid")] or example
            if like:
                assert_shaped(item, like[0], f"{where}[{index}]")
    else:
        kinds = (bool,) if isinstance(example, bool) else (int, float) if isinstance(example, int | float) else \
            (type(example),)
        assert isinstance(value, kinds) and (isinstance(value, bool) == isinstance(example, bool)), \
            f"{where}: {value!r} is not a {type(example).__name__} as documented"


def launch_said(stderr: str) -> list[str]:
    """An attached launch's lines on stderr but its goodput line, which ends a run that ran (docs/runs.md)."""
    return [line for line in stderr.rstrip().splitlines() if not line.startswith("goodput: ")]
