"""What a launch expects NCCL to prove about its transport, and how the job's own output proves it.

The expectation is ``--expect-transport`` (from ``mlenv launch``, ``EXPECT_TRANSPORT=`` or the cluster file's
``network.expect_transport``), else ``rdma`` in rdma mode and ``any`` otherwise. An explicit expectation that
nothing proves fails the job; the rdma-mode default only warns, saying why nothing was proven.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .ncclog import UNKNOWN, LogReport, judge

DEBUG_SUBSYS = "INIT,NET"
"""The NCCL_DEBUG_SUBSYS that prints what the proof reads: the network NCCL picks and the channels it sets up."""


@dataclass(frozen=True)
class Expectation:
    """``expect``: rdma, sockets or any; ``explicit``: the user asked for it (not the mode's default)."""

    expect: str
    explicit: bool

    @property
    def judged(self) -> bool:
        return self.expect != "any"


def expectation(option: str | None, environ: Mapping[str, str]) -> Expectation:
    """The user's ``--expect-transport``, else the default for ``MLENV_NETWORK_MODE``."""
    if option:
        return Expectation(option, True)
    return Expectation("rdma" if environ.get("MLENV_NETWORK_MODE") == "rdma" else "any", False)


def debug_env(expected: Expectation, environ: Mapping[str, str]) -> dict[str, str]:
    """NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=INIT,NET when a transport is to be proven, unless the user set
    their own NCCL_DEBUG."""
    if not expected.judged or "NCCL_DEBUG" in environ:
        return {}
    return {"NCCL_DEBUG": "INFO", **({} if "NCCL_DEBUG_SUBSYS" in environ else {"NCCL_DEBUG_SUBSYS": DEBUG_SUBSYS})}


def why_unproven(environ: Mapping[str, str], report: LogReport) -> str:
    """Why the output proves nothing: the NCCL_DEBUG settings that hide the lines, else what the lines lacked."""
    debug_file = environ.get("NCCL_DEBUG_FILE")
    if debug_file:
        return f"NCCL_DEBUG_FILE={debug_file} sends NCCL's lines to a file, not to the output"
    level = environ.get("NCCL_DEBUG", "").strip().upper()
    if level and level not in ("INFO", "TRACE"):
        return f"NCCL_DEBUG={environ['NCCL_DEBUG']} hides the INFO lines that name the transport"
    subsys = environ.get("NCCL_DEBUG_SUBSYS", "").upper()
    if subsys and not {"INIT", "NET", "ALL"} & set(subsys.replace("^", "").split(",")):
        return f"NCCL_DEBUG_SUBSYS={environ['NCCL_DEBUG_SUBSYS']} leaves out INIT and NET"
    if not report.ranks:
        return "no NCCL lines in the output: the job may not use NCCL"
    return report.reason


def final_verdict(report: LogReport, expected: Expectation, environ: Mapping[str, str],
                  status: int) -> tuple[int, list[str]]:
    """The node's exit status once the job ended and the lines that say why: a contradiction fails a successful
    job, and so does nothing proven under an explicit expectation; the default only warns."""
    if not expected.judged:
        return status, [f"NCCL transport: {report.verdict}"] if report.ranks else []
    if report.verdict == UNKNOWN:
        reason = why_unproven(environ, report)
        if expected.explicit:
            return status or 1, [f"error: could not prove {expected.expect}: {reason}"]
        return status, [f"warning: could not prove {expected.expect}: {reason}"]
    passed, message = judge(report, expected.expect)
    if not passed:
        return status or 1, [f"error: {message}"]
    return status, [message]
