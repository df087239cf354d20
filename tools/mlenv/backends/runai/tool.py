"""The ``runai`` binary: found on PATH, asked who is logged in and which flags it knows (``--help``, once per
process), and run with a time limit. Only its exit codes are read; its words are shown to the user as they are,
because what a given build prints is not documented (tests/fixtures/runai/REFERENCE.md)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from functools import lru_cache

from mlenv.backends.runai import argv as commands
from mlenv.backends.runai import flags
from mlenv.core.capabilities import Check
from mlenv.errors import OperationError, UsageError

CALL_TIMEOUT = 300
"""Seconds one runai call may take (v2 submit waits up to a minute for the workload to be created)."""
INSTALL_HINT = ("install the Run:ai CLI (the Run:ai UI's 'Researcher Command Line Interface' download, or "
                "https://docs.run.ai) and log in with: runai login")
LOGIN_HINT = "runai login (the v2 CLI also has runai login sso / runai login user -u USER)"
WHOAMI = ["runai", "whoami"]
_LONG_FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")


def binary() -> str:
    """The runai CLI's path; UsageError saying how to install it when missing."""
    found = shutil.which("runai")
    if found is None:
        raise UsageError(f"runai not found on PATH: {INSTALL_HINT}")
    return found


def run(argv: Sequence[str], timeout: int = CALL_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (``runai ...``) with the installed binary, output captured, stdin closed."""
    try:
        return subprocess.run([binary(), *argv[1:]], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise OperationError(f"{shlex.join(argv[:5])} ... got no answer within {timeout}s") from None


def said(result: subprocess.CompletedProcess[str]) -> str:
    """What a failed call said, in one line: its last error line (or output line), and its exit code."""
    lines = [line.strip() for line in (result.stderr or result.stdout or "").splitlines() if line.strip()]
    return f"{lines[-1] if lines else 'no output'} (exit {result.returncode})"


def login_check() -> Check:
    """``runai whoami``: a non-zero exit means not logged in (its own words shown)."""
    result = run(WHOAMI)
    if result.returncode != 0:
        return Check("runai login", "FAIL", f"runai whoami failed: {said(result)}", LOGIN_HINT)
    user = result.stdout.strip().splitlines()[-1:] or ["the current user"]
    return Check("runai login", "PASS", f"logged in as {user[0]}")


@lru_cache(maxsize=4)
def _help(path: str, cli: str) -> tuple[int, frozenset[str], str]:
    """(exit code, long flags listed, what it said) of the submit command's ``--help``; asked once per process."""
    result = run(commands.submit_help(cli))
    return result.returncode, frozenset(_LONG_FLAG.findall(result.stdout + result.stderr)), said(result)


def known_flags(cli: str) -> frozenset[str]:
    """The long flags the installed CLI's submit command lists; OperationError when it has no such command."""
    code, found, words = _help(binary(), cli)
    if code != 0 or not found:
        other = flags.V1 if cli == flags.V2 else flags.V2
        raise OperationError(f"{shlex.join(commands.submit_help(cli))} failed: {words}; this runai may be the "
                             f"{other} CLI (set runai.cli: {other})")
    return found


def spelling_problems(submission: commands.Submission) -> list[str]:
    """For each flag of the submission that builds spell differently and the installed CLI does not list: what
    to do."""
    if not submission.variants:
        return []
    found = known_flags(submission.cli)
    problems = []
    for variant in submission.variants:
        if variant.spelling in found:
            continue
        other = next((flag for flag in variant.known if flag in found), None)
        fix = (f"this build spells it {other}: set runai.flag_spellings.{variant.role}: {other}" if other
               else f"none of {', '.join(variant.known)} is listed either: update the runai CLI")
        problems.append(f"the installed runai ({binary()}) has no {variant.spelling} "
                        f"({shlex.join(commands.submit_help(submission.cli))} does not list it); {fix}")
    return problems


def flags_check(submission: commands.Submission) -> Check:
    """doctor: the installed CLI is of the file's generation and lists the flags mlenv sends."""
    command = shlex.join(commands.submit_help(submission.cli))
    try:
        found = known_flags(submission.cli)
        problems = spelling_problems(submission)
    except OperationError as exc:
        return Check("runai flags", "FAIL", str(exc), "runai version shows which CLI this is")
    if problems:
        return Check("runai flags", "FAIL", "; ".join(problems))
    unknown = sorted({arg for arg in submission.argv if _LONG_FLAG.fullmatch(arg)} - found)
    if unknown:
        return Check("runai flags", "WARN", f"{command} does not list {', '.join(unknown)}",
                     "check the runai CLI version against runai.cli")
    return Check("runai flags", "PASS", f"{command} lists every flag mlenv sends")
