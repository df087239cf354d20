"""The network modes and the node limit are decided once, by the plan: the CLI's --mode and --nodes reach it and
its one-line errors (exit 2) are what the user sees."""

from __future__ import annotations

from click.testing import CliRunner
from mlenv.cli import main
from mlenv.plan import MAX_NODES


def test_bad_mode_and_too_many_nodes_are_the_plans_one_line_errors() -> None:
    mode = CliRunner().invoke(main, ["validate", "barcelona", "--mode", "bogus"])
    assert (mode.exit_code, mode.output) == (
        2, "error: mlenv: --mode: expected rdma or tcp, got 'bogus' (MODE=rdma or MODE=tcp)\n")
    nodes = CliRunner().invoke(main, ["validate", "barcelona", "--nodes", str(MAX_NODES + 1)])
    assert (nodes.exit_code, nodes.output) == (2, f"error: mlenv: --nodes: expected an integer 1-{MAX_NODES}, got "
                                                  f"{MAX_NODES + 1}\n")
