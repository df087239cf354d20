"""The busbw plot: a valid PNG (signature, chunk CRCs, IHDR size, pixel data) written with the standard library, and
the terminal plot."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from mlenv.ops.plot import BLUE, RED, WHITE, terminal_plot, write_png

POINTS = [(1 << 20, 20.0), (4 << 20, 80.5), (16 << 20, 150.2), (64 << 20, 178.0), (256 << 20, 185.3),
          (1 << 30, 188.9)]


def chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """(type, payload) of every chunk, checking each CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    found, offset = [], 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset:offset + 4])
        kind, payload = data[offset + 4:offset + 8], data[offset + 8:offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length:offset + 12 + length])
        assert crc == zlib.crc32(kind + payload) & 0xFFFFFFFF, kind
        found.append((kind, payload))
        offset += 12 + length
    return found


def pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and the RGB rows of a PNG this module wrote (filter type 0 on every row)."""
    found = chunks(path.read_bytes())
    assert [kind for kind, _ in found] == [b"IHDR", b"IDAT", b"IEND"]
    width, height, depth, color, compression, filtering, interlace = struct.unpack(">IIBBBBB", found[0][1])
    assert (depth, color, compression, filtering, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(found[1][1])
    stride = 1 + width * 3
    assert len(raw) == height * stride
    rows = [raw[i * stride:(i + 1) * stride] for i in range(height)]
    assert all(row[0] == 0 for row in rows)
    return width, height, [row[1:] for row in rows]


def colors(rows: list[bytes]) -> set[tuple[int, ...]]:
    return {tuple(row[i:i + 3]) for row in rows for i in range(0, len(row), 3)}


def test_png_is_valid_with_the_expected_size_and_both_lines(tmp_path: Path) -> None:
    path = write_png(tmp_path / "busbw.png", POINTS, 180.0)
    width, height, rows = pixels(path)
    assert (width, height) == (640, 400)
    assert {BLUE, RED, WHITE} <= colors(rows)


def test_png_size_is_what_was_asked_and_no_expected_line_without_expectation(tmp_path: Path) -> None:
    width, height, rows = pixels(write_png(tmp_path / "small.png", POINTS[:1], None, width=320, height=200))
    assert (width, height) == (320, 200)
    assert BLUE in colors(rows) and RED not in colors(rows)


def test_png_of_no_result_is_still_an_image(tmp_path: Path) -> None:
    width, height, _ = pixels(write_png(tmp_path / "empty.png", [], 50.0))
    assert (width, height) == (640, 400)


def test_terminal_plot_marks_every_size_and_the_expected_line() -> None:
    text = terminal_plot(POINTS, 180.0, width=30, height=8)
    lines = text.splitlines()
    assert lines[0] == "busbw GB/s"
    assert sum(line.count("*") for line in lines) == len(POINTS)
    expected = next(line for line in lines if "180 exp" in line)
    assert expected.count("-") + expected.count("*") == 30
    assert lines[-1].split() == ["1M", "1G"]


def test_terminal_plot_without_points_is_empty() -> None:
    assert terminal_plot([], None) == ""
