"""Tolerant readers for sysfs/procfs files, which vanish or raise EINVAL in normal operation."""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path) -> str | None:
    """Stripped contents of ``path``, or None when it is missing or unreadable."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def read_int(path: Path) -> int | None:
    """Integer contents of ``path``, or None when missing, unreadable or not an integer."""
    text = read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
