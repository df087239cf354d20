"""``mlenv sync``'s report on a shared workspace (copied once, to the first node): what the copy deleted is said once,
and a node that shares a failed copy is not blamed for it again, however the METHOD cell words the sharing."""

from __future__ import annotations

from dataclasses import replace

import pytest
from mlenv.ops import sync
from mlenv.ops.sync import PodSync, SyncReport


@pytest.mark.parametrize("words", [sync.SHARED_WITH, "same disk as"])
def test_a_shared_copy_is_reported_once(capsys: pytest.CaptureFixture[str], words: str) -> None:
    copied = PodSync("app-0", 0, "rsync", False, error="rsync: connection closed", deleted=("old.py",))
    sharing = replace(copied, pod="app-1", node=1, method=f"{words} app-0", files=None, bytes=None)
    sync._print(SyncReport("/src", True, [copied, sharing]), as_json=False)
    said = capsys.readouterr().err
    assert said.count("deleted on node-") == 1 and "deleted on node-0 (app-0): old.py" in said, said
    assert said.count("error: sync to") == 1 and "error: sync to app-0: FAILED" in said, said
    unshared = SyncReport("/src", False, [copied, replace(copied, pod="app-1", node=1)])
    sync._print(unshared, as_json=False)  # two copies: each said
    said = capsys.readouterr().err
    assert (said.count("deleted on node-"), said.count("error: sync to")) == (2, 2), said
