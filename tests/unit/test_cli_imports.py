"""``mlenv --help`` loads click and the CLI package's group, and of mlenv nothing else: it lists the commands from
COMMANDS without making them (the bench holds it to 1.15x of importing click)."""

from __future__ import annotations

import subprocess
import sys

HELP = "import sys; sys.argv = ['mlenv', '--help']; from mlenv.cli import main; main()"


def test_help_imports_only_click_and_the_cli_group() -> None:
    shown = subprocess.run([sys.executable, "-X", "importtime", "-c", HELP], capture_output=True, text=True,
                           timeout=60, check=True)
    imported = {line.rpartition("|")[2].strip() for line in shown.stderr.splitlines()
                if line.startswith("import time:")}
    assert "Usage: mlenv" in shown.stdout
    assert "click" in imported
    assert {name for name in imported if name.split(".")[0] == "mlenv"} == {"mlenv", "mlenv.cli"}


def test_the_commands_listed_are_the_commands_made() -> None:
    from mlenv.cli import COMMANDS
    from mlenv.cli.commands import MADE

    assert list(MADE) == list(COMMANDS)  # the order of COMMANDS is the order of commands.py
