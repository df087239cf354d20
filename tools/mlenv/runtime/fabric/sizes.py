"""Message sizes of the all-reduce benchmark, as nccl-tests takes them: ``8M:1G`` (a range, doubling), ``8M:1G:4``
(a range, times 4) or ``1M,64M,1G`` (a list). K, M and G are binary (1K = 1024 bytes); every size is a whole
number of float32 values."""

from __future__ import annotations

import re

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MAX_SIZES = 64
MAX_BYTES = 16 << 30
_SIZE = re.compile(r"([0-9]{1,12})([KMG]?)", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``4096``, ``64K``, ``16M``, ``1G`` -> bytes; ValueError naming the text."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size like 4096, 64K, 8M or 1G")
    size = int(match[1]) * UNITS[match[2].upper()]
    if not 4 <= size <= MAX_BYTES or size % 4:
        raise ValueError(f"{text!r}: sizes are multiples of 4 bytes from 4 to 16G")
    return size


def parse_sizes(spec: str) -> list[int]:
    """The sizes of ``MIN:MAX[:FACTOR]`` or ``A,B,C``, ascending and distinct; ValueError saying what is wrong."""
    if "," in spec or ":" not in spec:
        sizes = sorted({parse_size(part) for part in spec.split(",") if part.strip()})
    else:
        parts = spec.split(":")
        if len(parts) > 3:
            raise ValueError(f"{spec!r}: expected MIN:MAX or MIN:MAX:FACTOR")
        low, high = parse_size(parts[0]), parse_size(parts[1])
        factor = parts[2].strip() if len(parts) == 3 else "2"
        if not factor.isdigit() or int(factor) < 2:
            raise ValueError(f"{spec!r}: the factor must be an integer of at least 2")
        if low > high:
            raise ValueError(f"{spec!r}: the first size is larger than the last")
        sizes, size = [], low
        while size <= high and len(sizes) <= MAX_SIZES:
            sizes.append(size)
            size *= int(factor)
    if not sizes:
        raise ValueError(f"{spec!r}: no sizes")
    if len(sizes) > MAX_SIZES:
        raise ValueError(f"{spec!r}: more than {MAX_SIZES} sizes")
    return sizes


def format_size(size: int) -> str:
    """Bytes as the largest unit that keeps them whole: 8388608 -> ``8M``, 1536 -> ``1536``."""
    for unit in ("G", "M", "K"):
        if size >= UNITS[unit] and size % UNITS[unit] == 0:
            return f"{size // UNITS[unit]}{unit}"
    return str(size)
