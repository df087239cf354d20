"""On a machine with kubectl and no oc, kubectl stands in for oc; the note saying so comes where a deployment is
made (deploy, discover), not on every command."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mlenv.backends.kubeapi.client import PATH_VARIABLE, resolve_binary


def test_the_stand_in_note_only_where_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    kubectl = tmp_path / "kubectl"
    kubectl.write_text("#!/bin/sh\n")
    kubectl.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(PATH_VARIABLE, raising=False)
    assert [resolve_binary("oc") for _ in range(3)] == [str(kubectl)] * 3  # status, exec, logs ...
    assert capsys.readouterr().err == ""
    assert resolve_binary("oc", say_stand_in=True) == str(kubectl)  # deploy
    assert capsys.readouterr().err.startswith("note: oc is not installed: using kubectl")
    assert resolve_binary("kubectl", say_stand_in=True) == str(kubectl)  # asked for kubectl: nothing to say
    (tmp_path / "oc").symlink_to(kubectl)
    assert resolve_binary("oc", say_stand_in=True) == os.path.join(tmp_path, "oc")
    assert capsys.readouterr().err == ""
