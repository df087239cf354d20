"""``launch.hang_timeout``: the default of ``mlenv launch --hang-timeout``, a positive number of seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.config.files import LOCAL, loaded, problems


def test_hang_timeout_is_read(tmp_path: Path) -> None:
    assert loaded(tmp_path / "c.yaml", LOCAL).hang_timeout is None
    assert loaded(tmp_path / "c.yaml", LOCAL + "launch:\n  hang_timeout: 20\n").hang_timeout == 20


@pytest.mark.parametrize("value", ["0", "-5", "soon", "true"])
def test_hang_timeout_must_be_positive_seconds(tmp_path: Path, value: str) -> None:
    found = problems(tmp_path / "c.yaml", LOCAL + f"launch:\n  hang_timeout: {value}\n")
    assert len(found) == 1 and "launch.hang_timeout" in found[0], found


def test_launch_takes_only_known_keys(tmp_path: Path) -> None:
    found = problems(tmp_path / "c.yaml", LOCAL + "launch:\n  hang_timout: 20\n")
    assert len(found) == 1 and "hang_timout" in found[0], found
