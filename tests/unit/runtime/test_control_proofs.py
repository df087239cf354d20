"""The seal on the control channel's lines (proofs.py): a line opens only at the other end of its own connection, in
its own direction, in its turn and unaltered."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from mlenv.runtime.supervise.proofs import DOWN, UP, Seal, Unsealed, is_nonce, nonce

SECRET = "5" * 32


def pair(server: str, client: str, secret: str = SECRET) -> tuple[Seal, Seal]:
    """Node 0's and a node's seal of one connection."""
    return Seal(secret, server, client, DOWN), Seal(secret, server, client, UP)


def test_lines_open_at_the_other_end_in_turn_both_ways() -> None:
    hub, node = pair(nonce(), nonce())
    for number in range(3):
        assert hub.open(node.seal(b'{"beat": %d}' % number).rstrip(b"\n")) == b'{"beat": %d}' % number
    line = hub.seal(b'{"stop": "x"}')
    assert line.startswith(b"0 ") and line.endswith(b' {"stop": "x"}\n')
    assert node.open(line.rstrip(b"\n")) == b'{"stop": "x"}'


def test_a_replayed_line_is_out_of_sequence() -> None:
    hub, node = pair(nonce(), nonce())
    line = node.seal(b'{"done": true}').rstrip(b"\n")
    hub.open(line)
    with pytest.raises(Unsealed, match=r"out of sequence \(line '0', expected 1\)"):
        hub.open(line)


def test_a_line_out_of_its_turn_is_refused_even_with_its_own_mac() -> None:
    hub, node = pair(nonce(), nonce())
    node.seal(b'{"beat": true}')  # lost on the way
    with pytest.raises(Unsealed, match="out of sequence"):
        hub.open(node.seal(b'{"done": true}').rstrip(b"\n"))
    renumbered = b"0" + node.seal(b'{"done": true}').rstrip(b"\n")[1:]  # line 2 claiming to be line 0
    with pytest.raises(Unsealed, match="bad MAC"):
        hub.open(renumbered)


@pytest.mark.parametrize("alter", [
    lambda line: line.replace(b'"beat": true', b'"stop": "x"'),  # another body under the same MAC
    lambda line: line[:5] + bytes([line[5] ^ 1]) + line[6:],  # the MAC itself
    lambda line: line.split(b" ", 1)[0] + b" " + line.split(b" ", 2)[2],  # no MAC
])
def test_an_altered_line_has_a_bad_mac(alter: Callable[[bytes], bytes]) -> None:
    hub, node = pair(nonce(), nonce())
    line = node.seal(b'{"beat": true}').rstrip(b"\n")
    with pytest.raises(Unsealed):
        hub.open(alter(line))
    assert hub.open(line) == b'{"beat": true}'  # the true line still opens in its turn


def test_a_line_of_another_connection_another_direction_or_another_secret_does_not_open() -> None:
    server, client = nonce(), nonce()
    hub, node = pair(server, client)
    for other in (pair(nonce(), client)[1], pair(server, nonce())[1], pair(server, client, "6" * 32)[1]):
        with pytest.raises(Unsealed, match="bad MAC"):
            hub.open(other.seal(b'{"beat": true}').rstrip(b"\n"))
    reflected = Seal(SECRET, server, client, DOWN).seal(b'{"stop": "x"}').rstrip(b"\n")  # node 0's own line, back
    with pytest.raises(Unsealed, match="bad MAC"):
        hub.open(reflected)
    assert hub.open(node.seal(b"{}").rstrip(b"\n")) == b"{}"


@pytest.mark.parametrize("line", [b"", b"x", b"-1 00 {}", b"\xff\xfe 00 {}", b"0", b"0 "])
def test_garbage_does_not_open(line: bytes) -> None:
    hub, _ = pair(nonce(), nonce())
    with pytest.raises(Unsealed):
        hub.open(line)


def test_nonces_are_fresh_hex_and_nothing_else_passes_for_one() -> None:
    made = {nonce() for _ in range(100)}
    assert len(made) == 100 and all(is_nonce(each) for each in made)
    assert not any(is_nonce(value) for value in ("c0ffee", "G" * 32, 32, None, "a" * 31, "A" * 32))
