"""Stragglers from arrival at collectives (runtime/forensics/arrivals.py): entry times of ranks in lockstep, as the
all-reduce makes them (everyone leaves a collective when the last one arrived), from a per-rank compute time."""

from __future__ import annotations

import random

from mlenv.runtime.forensics.arrivals import Judgement, judge, stragglers

NODE_OF = {0: 0, 1: 0, 2: 1, 3: 1}
HOSTS = {0: "gpu-a", 1: "gpu-b"}


def lockstep(compute: dict[int, float], steps: int = 60, jitter: float = 0.0,
             seed: int = 7) -> dict[int, dict[int, int]]:
    """Each rank computes, enters collective ``seq``; all leave when the last one entered."""
    draw = random.Random(seed)  # noqa: S311 - a test's jitter, not a secret
    arrivals: dict[int, dict[int, int]] = {rank: {} for rank in compute}
    left = 1_800_000_000.0
    for seq in range(1, steps + 1):
        entered = {rank: left + seconds + draw.uniform(0, jitter) for rank, seconds in compute.items()}
        for rank, at in entered.items():
            arrivals[rank][seq] = int(at * 1e9)
        left = max(entered.values()) + 0.001
    return arrivals


def test_a_rank_three_times_slower_is_named_with_its_evidence() -> None:
    found = stragglers(lockstep({0: 0.05, 1: 0.05, 2: 0.15, 3: 0.05}, jitter=0.005), NODE_OF, HOSTS)
    assert [(s.rank, s.node, s.host) for s in found.named] == [(2, 1, "gpu-b")]
    named = found.named[0]
    assert named.last == 60 and 0.09 < named.median_margin_s < 0.11 and named.share > 0.5
    assert list(named.to_json()) == ["rank", "node", "last", "median_margin_s", "share", "host", "text"]
    assert named.text.startswith("rank 2 (node-1) (gpu-b) is a straggler: last into 60 of 60 collectives")


def test_equal_ranks_with_jitter_name_nobody() -> None:
    for seed in range(20):
        assert stragglers(lockstep(dict.fromkeys(range(4), 0.05), jitter=0.02, seed=seed), NODE_OF,
                          HOSTS).named == ()


def test_a_slow_node_is_named_when_no_rank_of_it_stands_out() -> None:
    found = stragglers(lockstep({0: 0.05, 1: 0.05, 2: 0.15, 3: 0.15}, jitter=0.002), NODE_OF, HOSTS)
    assert [(s.rank, s.node) for s in found.named] == [(None, 1)]
    assert found.named[0].text.startswith("node-1 (gpu-b) is a straggler") and "rank" not in found.named[0].to_json()


def test_too_few_collectives_or_no_overlap_judge_nothing() -> None:
    assert judge(lockstep({0: 0.05, 1: 0.2}, steps=5)).collectives == 0
    apart = {0: {seq: seq * 10**9 for seq in range(1, 50)}, 1: {seq: seq * 10**9 for seq in range(100, 150)}}
    assert judge(apart) == Judgement(0, 0.0, ())
    assert judge({0: {1: 1}}).late == ()
