"""Bus bandwidth against message size, as a PNG (written with zlib and struct alone) and as a few lines of text for
the terminal; the expected bandwidth, when there is one, is drawn as a dashed line. ``nccl-test --pairs`` draws one
bar per node pair instead. ``mlenv drill`` draws a timeline: one row per rank, its attempts as bars, the fault and the
phases as vertical lines."""

from __future__ import annotations

import itertools
import math
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

from mlenv.runtime.fabric.sizes import format_size

Point = tuple[int, float]
"""(message size in bytes, bus bandwidth in GB/s)."""
Color = tuple[int, int, int]
WHITE, BLACK, GREY, BLUE, RED = (255, 255, 255), (0, 0, 0), (220, 220, 220), (31, 90, 200), (210, 40, 40)
WIDTH, HEIGHT = 640, 400
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 30, 40
SCALE = 2
"""Pixels per font dot."""
FONT = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", "/": "001001010100100",
    "-": "000000111000000", "(": "010100100100010", ")": "010001001001010", " ": "000000000000000",
    "B": "110101110101110", "C": "111100100100111", "D": "110101101101110", "E": "111100110100111",
    "G": "111100101101111", "K": "101101110101101", "M": "101111111101101", "P": "111101111100100",
    "S": "111100111001111", "T": "111010010010010", "U": "101101101101111", "W": "101101111111101",
    "X": "101101010101101", "A": "010101111101101", "F": "111100110100100", "H": "101101111101101",
    "I": "111010010010111", "L": "100100100100111", "N": "110101101101101", "O": "111101101101111",
    "R": "110101110101101",
}
"""A 3x5 dot font: what the labels need (sizes, numbers, BUSBW GB/S, EXPECTED, the drill's phases)."""


class Canvas:
    """An RGB image in memory."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(WHITE * (width * height))

    def dot(self, x: int, y: int, color: Color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            start = (y * self.width + x) * 3
            self.pixels[start:start + 3] = bytes(color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: Color, dash: int = 0) -> None:
        """Bresenham's line; with ``dash``, on and off every ``dash`` pixels."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        error, step = dx + dy, 0
        while True:
            if not dash or (step // dash) % 2 == 0:
                self.dot(x0, y0, color)
            if (x0, y0) == (x1, y1):
                return
            step += 1
            double = 2 * error
            if double >= dy:
                error, x0 = error + dy, x0 + sx
            if double <= dx:
                error, y0 = error + dx, y0 + sy

    def square(self, x: int, y: int, half: int, color: Color) -> None:
        for i in range(-half, half + 1):
            for j in range(-half, half + 1):
                self.dot(x + i, y + j, color)

    def text(self, x: int, y: int, text: str, color: Color = BLACK) -> None:
        """``text`` (upper case) with its top left corner at x, y."""
        for index, char in enumerate(text.upper()):
            bits = FONT.get(char, FONT[" "])
            for dot, bit in enumerate(bits):
                if bit == "1":
                    for i in range(SCALE):
                        for j in range(SCALE):
                            self.dot(x + (index * 4 + dot % 3) * SCALE + i, y + dot // 3 * SCALE + j, color)

    def png(self) -> bytes:
        """The image as a PNG file: 8-bit RGB, no filtering, one zlib stream."""
        stride = self.width * 3
        raw = b"".join(b"\x00" + bytes(self.pixels[row * stride:(row + 1) * stride]) for row in range(self.height))
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 9)) + \
            _chunk(b"IEND", b"")


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def text_width(text: str) -> int:
    """Pixels that ``Canvas.text`` takes for ``text``."""
    return len(text) * 4 * SCALE


def _number(value: float) -> str:
    if not value:
        return "0"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 1 else f"{value:.3f}"


def _top(points: Sequence[Point], expected: float | None) -> float:
    return max([y for _, y in points] + [expected or 0.0]) * 1.1 or 1.0


def write_png(path: Path, points: Sequence[Point], expected: float | None, width: int = WIDTH,
              height: int = HEIGHT) -> Path:
    """Plot ``points`` (log2 of the size across, busbw up) and ``expected`` to ``path``."""
    canvas = Canvas(width, height)
    right, bottom = width - RIGHT, height - BOTTOM
    sizes = [math.log2(size) for size, _ in points] or [0.0]
    low, high = min(sizes), max(sizes)
    span, top = (high - low) or 1.0, _top(points, expected)

    def at(size: int, value: float) -> tuple[int, int]:
        x = LEFT + (math.log2(size) - low) / span * (right - LEFT) if high > low else (LEFT + right) / 2
        return round(x), round(bottom - value / top * (bottom - TOP))

    for tick in range(5):
        value = top * tick / 4
        y = round(bottom - tick / 4 * (bottom - TOP))
        canvas.line(LEFT, y, right, y, GREY)
        label = _number(value)
        canvas.text(LEFT - 6 - text_width(label), y - 5, label)
    canvas.line(LEFT, TOP, LEFT, bottom, BLACK)
    canvas.line(LEFT, bottom, right, bottom, BLACK)
    every = max(1, math.ceil(len(points) * 40 / (right - LEFT)))
    for index, (size, _) in enumerate(points):
        x, _ = at(size, 0)
        canvas.line(x, bottom, x, bottom + 4, BLACK)
        if index % every == 0:
            label = format_size(size)
            canvas.text(x - text_width(label) // 2, bottom + 8, label)
    canvas.text(LEFT, 8, "BUSBW GB/S")
    if expected is not None:
        y = at(points[0][0] if points else 1, expected)[1]
        canvas.line(LEFT, y, right, y, RED, dash=6)
        label = f"EXPECTED {_number(expected)}"
        canvas.text(right - text_width(label), y - 14, label, RED)
    corners = [at(size, value) for size, value in points]
    for (x0, y0), (x1, y1) in itertools.pairwise(corners):
        canvas.line(x0, y0, x1, y1, BLUE)
    for x, y in corners:
        canvas.square(x, y, 2, BLUE)
    path.write_bytes(canvas.png())
    return path


Bar = tuple[str, float, bool]
"""(label, bus bandwidth in GB/s, whether it is slow)."""


def write_bars(path: Path, bars: Sequence[Bar], threshold: float | None, width: int = WIDTH,
               height: int = HEIGHT) -> Path:
    """One bar per pair (slow ones red), the slow-below threshold dashed, to ``path``."""
    canvas = Canvas(width, height)
    right, bottom = width - RIGHT, height - BOTTOM
    top = max([value for _, value, _ in bars] + [threshold or 0.0]) * 1.1 or 1.0

    def y_of(value: float) -> int:
        return round(bottom - value / top * (bottom - TOP))

    for tick in range(5):
        value = top * tick / 4
        canvas.line(LEFT, y_of(value), right, y_of(value), GREY)
        label = _number(value)
        canvas.text(LEFT - 6 - text_width(label), y_of(value) - 5, label)
    canvas.line(LEFT, TOP, LEFT, bottom, BLACK)
    canvas.line(LEFT, bottom, right, bottom, BLACK)
    slot = (right - LEFT) / max(len(bars), 1)
    for index, (label, value, slow) in enumerate(bars):
        x0, x1 = round(LEFT + index * slot + slot * 0.15), round(LEFT + (index + 1) * slot - slot * 0.15)
        for y in range(y_of(value), bottom):
            canvas.line(x0, y, x1, y, RED if slow else BLUE)
        canvas.text((x0 + x1) // 2 - text_width(label) // 2, bottom + 8, label)
    canvas.text(LEFT, 8, "BUSBW GB/S")
    if threshold is not None:
        canvas.line(LEFT, y_of(threshold), right, y_of(threshold), RED, dash=6)
        label = _number(threshold)
        canvas.text(right - text_width(label), y_of(threshold) - 14, label, RED)
    path.write_bytes(canvas.png())
    return path


Span = tuple[float, float, int]
"""(start, end in seconds from the fault, attempt): one attempt of one rank."""
Mark = tuple[str, float]
"""(label, seconds from the fault): the fault or a phase."""
ATTEMPT_COLORS = (BLUE, (40, 150, 70), (150, 90, 200))


def write_timeline(path: Path, rows: Sequence[tuple[int, Sequence[Span]]], marks: Sequence[Mark],
                   width: int = WIDTH) -> Path:
    """One row per rank (labelled by its number) with each attempt a bar in its colour, seconds across, the fault
    (red) and each phase (dashed, labelled) as vertical lines, to ``path``."""
    height = TOP + BOTTOM + 10 + 22 * max(1, len(rows)) + 12 * len(marks)
    canvas = Canvas(width, height)
    right, bottom = width - RIGHT, height - BOTTOM - 12 * len(marks)
    times = [t for _, spans in rows for start, end, _ in spans for t in (start, end)] + [t for _, t in marks]
    low, high = min([0.0, *times]), max([1.0, *times])

    def x(seconds: float) -> int:
        return round(LEFT + (seconds - low) / (high - low) * (right - LEFT))

    for index, (rank, spans) in enumerate(rows):
        y = TOP + 10 + 22 * index
        canvas.text(LEFT - 6 - text_width(str(rank)), y - 4, str(rank))
        for start, end, attempt in spans:
            for row in range(-6, 7):
                canvas.line(x(start), y + row, max(x(start), x(end)), y + row,
                            ATTEMPT_COLORS[attempt % len(ATTEMPT_COLORS)])
    canvas.line(LEFT, bottom, right, bottom, BLACK)
    for tick in range(6):
        seconds = low + (high - low) * tick / 5
        canvas.line(x(seconds), bottom, x(seconds), bottom + 4, BLACK)
        canvas.text(x(seconds) - text_width(_number(seconds)) // 2, bottom + 8, _number(seconds))
    canvas.text(LEFT, 8, "SECONDS")
    for index, (label, seconds) in enumerate(marks):
        color = RED if index == 0 else BLACK
        canvas.line(x(seconds), TOP, x(seconds), bottom, color, dash=0 if index == 0 else 4)
        canvas.text(LEFT, bottom + 24 + 12 * index, f"{index} {label}", color)
        canvas.text(x(seconds) + 3, TOP - 12 + (index % 2) * 6, str(index), color)
    path.write_bytes(canvas.png())
    return path


def terminal_plot(points: Sequence[Point], expected: float | None, width: int = 48, height: int = 10) -> str:
    """A small text plot: ``*`` per size, evenly spaced (sizes grow geometrically), ``-`` the expected line."""
    if not points:
        return ""
    top = _top(points, expected)

    def row(value: float) -> int:
        return height - 1 - round(value / top * (height - 1))

    grid = [[" "] * width for _ in range(height)]
    if expected is not None:
        grid[row(expected)] = ["-"] * width
    columns = [round(i * (width - 1) / max(len(points) - 1, 1)) for i in range(len(points))]
    for column, (_, value) in zip(columns, points, strict=True):
        grid[row(value)][column] = "*"
    labels = {0: _number(top), height - 1: "0"}
    if expected is not None:
        labels[row(expected)] = f"{_number(expected)} exp"
    pad = max(len(label) for label in labels.values())
    lines = ["busbw GB/s"] + [f"{labels.get(r, ''):>{pad}} |{''.join(cells).rstrip()}" for r, cells in
                              enumerate(grid)]
    first, last = format_size(points[0][0]), format_size(points[-1][0]) if len(points) > 1 else ""
    lines.append(f"{'':>{pad}} +{'-' * width}")
    lines.append(f"{'':>{pad}}  {first}{last:>{max(width - len(first), len(last) + 1)}}".rstrip())
    return "\n".join(lines) + "\n"
