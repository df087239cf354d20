"""One default launcher: ``mlenv launch`` and the runtime's ``launch`` (what runs on every node) state the same one,
and the README names it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from mlenv.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_cli_and_the_runtime_state_the_same_default_launcher() -> None:
    cli = CliRunner().invoke(main, ["launch", "--help"])
    runtime = subprocess.run([sys.executable, "-m", "mlenv.runtime", "launch", "--help"], capture_output=True,
                             text=True, check=True, cwd=ROOT / "tools", timeout=60)
    (said_by_cli,) = re.findall(r"\[default: (\w+)\]", " ".join(cli.stdout.split()))
    (said_by_runtime,) = re.findall(r"default: \$MLENV_LAUNCHER or (\w+)", " ".join(runtime.stdout.split()))
    assert said_by_cli == said_by_runtime == "torchrun"
    assert "The default launcher is torchrun" in (ROOT / "README.md").read_text()
