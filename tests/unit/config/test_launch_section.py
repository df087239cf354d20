"""``launch.hang_timeout`` (the default of ``mlenv launch --hang-timeout``, a positive number of seconds) and the
idle-GPU watch's ``launch.idle_minutes`` (a duration) and ``launch.idle_util`` (percent), and the control channel's
``launch.node_silence`` (seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.config.files import LOCAL, loaded, position, problems


def test_hang_timeout_is_read(tmp_path: Path) -> None:
    assert loaded(tmp_path / "c.yaml", LOCAL).hang_timeout is None
    assert loaded(tmp_path / "c.yaml", LOCAL + "launch:\n  hang_timeout: 20\n").hang_timeout == 20


@pytest.mark.parametrize("value", ["0", "-5", "soon", "true"])
def test_hang_timeout_must_be_positive_seconds(tmp_path: Path, value: str) -> None:
    found = problems(tmp_path / "c.yaml", LOCAL + f"launch:\n  hang_timeout: {value}\n")
    assert len(found) == 1 and "launch.hang_timeout" in found[0], found


def test_node_silence_is_read(tmp_path: Path) -> None:
    assert loaded(tmp_path / "c.yaml", LOCAL).node_silence is None
    assert loaded(tmp_path / "c.yaml", LOCAL + "launch:\n  node_silence: 8.5\n").node_silence == 8.5


def test_launch_takes_only_known_keys(tmp_path: Path) -> None:
    found = problems(tmp_path / "c.yaml", LOCAL + "launch:\n  hang_timout: 20\n")
    assert len(found) == 1 and "hang_timout" in found[0], found


def test_idle_watch_is_off_without_idle_minutes(tmp_path: Path) -> None:
    cluster = loaded(tmp_path / "c.yaml", LOCAL)
    assert (cluster.idle_seconds, cluster.idle_util) == (None, None)


@pytest.mark.parametrize(("written", "seconds"), [("90", 90), ("'90s'", 90), ("30m", 1800), ("1h", 3600),
                                                  ("3s", 3)])
def test_idle_minutes_is_a_duration_in_seconds_or_with_a_unit(tmp_path: Path, written: str, seconds: int) -> None:
    cluster = loaded(tmp_path / "c.yaml", LOCAL + f"launch:\n  idle_minutes: {written}\n  idle_util: 12.5\n")
    assert (cluster.idle_seconds, cluster.idle_util) == (seconds, 12.5)


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("idle_minutes", "0", "a duration longer than 0: seconds (90) or 90s, 30m, 1h"),
    ("idle_minutes", "0m", "a duration longer than 0"),
    ("idle_minutes", "-5", "a duration longer than 0"),
    ("idle_minutes", "30 minutes", "a duration longer than 0"),
    ("idle_minutes", "1.5m", "a duration longer than 0"),
    ("idle_minutes", "true", "a duration longer than 0"),
    ("idle_util", "101", "a percentage from 0 to 100"),
    ("idle_util", "-1", "a percentage from 0 to 100"),
    ("idle_util", "5%", "a percentage from 0 to 100"),
    ("node_silence", "0", "a positive number of seconds"),
    ("node_silence", "20s", "a positive number of seconds"),
])
def test_bad_idle_settings_are_one_line_with_their_place(tmp_path: Path, key: str, value: str,
                                                         expected: str) -> None:
    text = LOCAL + f"launch:\n  {key}: {value}\n"
    found = problems(tmp_path / "c.yaml", text)
    assert len(found) == 1 and f"launch.{key}" in found[0] and expected in found[0], found
    assert f"c.yaml:{position(text, f'{key}: {value}').split(':')[0]}:" in found[0], found
