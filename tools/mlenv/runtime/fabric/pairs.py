"""The rounds of a pairwise fabric bisection: in each round the nodes form disjoint pairs that run at once, and the
pairs rotate from round to round (the circle method of a round-robin tournament), so that every node meets several
partners. With an odd number of nodes one node sits each round out."""

from __future__ import annotations

MIN_NODES = 4
"""Fewer nodes cannot tell a bad node from a bad partner."""
ROUNDS = 3
"""Every node meets 3 partners with an even number of nodes, at least 2 with an odd one (one round off)."""

Pair = tuple[int, int]


def rounds(nodes: int, count: int = ROUNDS) -> list[list[Pair]]:
    """``count`` rounds (at most every pair once) of disjoint node pairs, each pair (lower, higher)."""
    if nodes < 2:
        return []
    seats: list[int | None] = [*range(nodes), *([None] if nodes % 2 else [])]
    size = len(seats)
    schedule = []
    for _ in range(min(count, size - 1)):
        pairs = [(seats[i], seats[size - 1 - i]) for i in range(size // 2)]
        schedule.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None))
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return schedule
