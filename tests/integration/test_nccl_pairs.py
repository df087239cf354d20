"""``mlenv nccl-test --pairs``, pairwise fabric bisection: the rounds of pairs, the judgment of pairs and nodes, and
the whole run on a 4-node local cluster (network namespaces) with one node's link throttled by tc's token bucket
filter, which it must name, alone, in slow_nodes; --exclude-bad records it, status shows it, nodes
--forget-excluded clears it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path

import pytest
from mlenv.ops.nccltest import ExpectedBandwidth
from mlenv.ops.pairs import PairResult, judge, threshold
from mlenv.runtime.fabric.pairs import rounds

from tests.helpers import assert_shaped, documented_shape
from tests.integration.local_cluster import LocalProject, make_project, require_local
from tests.integration.test_nccl_test import png_size


@pytest.mark.parametrize("nodes", [4, 5, 6, 7, 8, 9, 16, 33])
def test_rounds_are_disjoint_pairs_and_every_node_meets_two_partners(nodes: int) -> None:
    schedule = rounds(nodes)
    seen: set[tuple[int, int]] = set()
    for pairs in schedule:
        members = [node for pair in pairs for node in pair]
        assert len(members) == len(set(members)) == nodes - nodes % 2
        assert not seen & set(pairs)  # the pairs rotate: no pair twice
        seen |= set(pairs)
    for node in range(nodes):
        assert len({b if a == node else a for a, b in seen if node in (a, b)}) >= 2


def test_rounds_of_four_are_every_pair_once() -> None:
    assert sorted(pair for pairs in rounds(4) for pair in pairs) == list(combinations(range(4), 2))


def pair(a: int, b: int, busbw: float, round_: int = 0) -> PairResult:
    return PairResult(round_, (a, b), 1 << 20, 1.0, busbw)


@pytest.mark.parametrize(("pairs", "below", "why", "named"), [
    pytest.param([pair(0, 3, 1.0, 0), pair(1, 2, 10.0, 0), pair(0, 1, 9.0, 1), pair(2, 3, 0.9, 1),
                  pair(0, 2, 11.0, 2), pair(1, 3, 1.1, 2)],
                 5.5, "50% of the best pair's 11 GB/s (no expected bandwidth)", [3],
                 id="all its pairs slow, another pair not"),
    # node 3's healthy pairs came out under half of the best pair's, but far above node 2's throttled ones
    pytest.param([pair(0, 2, 1.0, 0), pair(1, 3, 18.0, 0), pair(0, 1, 40.0, 1), pair(2, 3, 1.1, 1),
                  pair(0, 3, 15.0, 2), pair(1, 2, 0.9, 2)],
                 15.0, "15 GB/s, the pair above the widest gap between the pairs' figures (no expected bandwidth; "
                 "50% of the best pair's 40 GB/s is higher)", [2],
                 id="a loaded machine spreads the fast pairs apart"),
])
def test_a_node_is_named_when_all_its_pairs_are_slow(pairs: list[PairResult], below: float, why: str,
                                                     named: list[int]) -> None:
    assert threshold(pairs, None) == (below, why)
    judged, slow_nodes = judge(pairs, below)
    assert [p.slow for p in judged] == [True, False, False, True, False, True]
    assert slow_nodes == named


def test_no_node_is_named_when_every_pair_is_slow_or_a_slow_node_had_a_fast_pair() -> None:
    slow_everywhere = [pair(0, 1, 1.0), pair(2, 3, 1.0), pair(0, 2, 1.0), pair(1, 3, 1.0)]
    below, why = threshold(slow_everywhere, ExpectedBandwidth(10.0, "network.expected_busbw"))
    assert below == 8.0 and why.startswith("80% of the expected 10 GB/s")
    assert judge(slow_everywhere, below)[1] == []
    one_bad_link = [pair(0, 1, 1.0), pair(2, 3, 10.0), pair(0, 2, 10.0), pair(1, 3, 10.0)]
    assert judge(one_bad_link, threshold(one_bad_link, None)[0])[1] == []


# --- the whole run on local clusters ---


@pytest.fixture
def four_nodes(tmp_path: Path) -> Iterator[LocalProject]:
    """A deployed 4 x 1 local cluster (namespaces), never synced, no expected bandwidth."""
    require_local("namespaces")
    require_tc()
    project = make_project(tmp_path, "lpairs", "10.77.66.0/24", "namespaces")
    path = project.home / "clusters" / f"{project.name}.yaml"
    path.write_text(path.read_text().replace("default_nodes: 2", "default_nodes: 4")
                    .replace("procs_per_node: 2", "procs_per_node: 1"))
    project.ok("deploy", project.name, timeout=240)
    yield project
    project.mlenv("clean", "--cluster", project.name, "--delete-data", "--yes", timeout=240)


def require_tc() -> None:
    from tests._prereq import require

    require("tc")


def throttle(project: LocalProject, ordinal: int) -> None:
    """Slow node ``ordinal``'s sending to 4 Mbit/s (0.5 MB/s) with a token bucket on its NIC, in its namespace: gloo
    between two unthrottled nodes of a loaded 2-core machine moves 15 to 40 MB/s."""
    state = json.loads((project.home / ".mlenv" / "state.json").read_text())
    pod = state["deployments"][project.name]["handle"]["data"]["pods"][ordinal]
    subprocess.run(["ip", "netns", "exec", pod["netns"], "tc", "qdisc", "add", "dev", pod["nic"], "root", "tbf",
                    "rate", "4mbit", "burst", "32kb", "latency", "2s"], check=True, capture_output=True)


def test_pairs_name_the_throttled_node(four_nodes: LocalProject) -> None:
    throttle(four_nodes, 2)
    # 1 MiB per all-reduce: about 2 s through the throttled link, 25 to 70 ms through the others
    found = four_nodes.mlenv("nccl-test", "--pairs", "--sizes", "1M", "--json", "--exclude-bad", timeout=600)
    assert found.returncode == 1, found.stderr[-3000:]
    summary = json.loads(found.stdout)
    assert_shaped(summary, documented_shape("nccl-pairs"))
    pairs = summary["pairs"]
    assert summary["slow_nodes"] == [2], pairs
    assert (summary["ok"], summary["verdict"]) == (False, "FAIL")
    assert sorted(tuple(p["nodes"]) for p in pairs) == list(combinations(range(4), 2))
    assert all(p["size_bytes"] == 1 << 20 and p["busbw_gbps"] > 0 for p in pairs)
    throttled = [p for p in pairs if 2 in p["nodes"]]
    assert len(throttled) == 3 and all(p["slow"] for p in throttled)
    others = [p["busbw_gbps"] for p in pairs if 2 not in p["nodes"]]
    assert min(others) > 5 * max(p["busbw_gbps"] for p in throttled), pairs  # clearly apart, not a close call
    assert png_size(Path(summary["files"]["png"])) == (640, 400)
    assert json.loads(Path(summary["files"]["json"]).read_text()) == summary
    assert [(e["node"], e["host"]) for e in summary["excluded"]] == [(2, "lpairs-app-2")]

    status = json.loads(four_nodes.ok("status", "--json").stdout)
    assert [e["node"] for e in status["excluded"]] == [2]
    assert "nccl-test --pairs" in status["excluded"][0]["reason"]
    text = four_nodes.ok("status").stdout
    assert "excluded: node-2 (lpairs-app-2)" in text
    forgotten = json.loads(four_nodes.ok("nodes", "--forget-excluded", "--json").stdout)
    assert [e["node"] for e in forgotten["forgotten"]] == [2] and forgotten["excluded"] == []
    assert json.loads(four_nodes.ok("status", "--json").stdout)["excluded"] == []


def test_pairs_need_four_nodes(tmp_path: Path) -> None:
    require_local("processes")
    project = make_project(tmp_path, "lpairs2", "10.77.67.0/24", "processes")
    project.ok("deploy", project.name)
    try:
        refused = project.mlenv("nccl-test", "--pairs")
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "has 2 nodes; it cannot bisect fewer than 4" in refused.stderr
        alone = project.mlenv("nccl-test", "--exclude-bad")
        assert alone.returncode == 2 and "--exclude-bad goes with --pairs" in alone.stderr
    finally:
        project.mlenv("clean", "--cluster", project.name, "--delete-data", "--yes")
