"""The kubeconfig as kubectl merges it, read without starting kubectl: checked against ``kubectl config view``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from mlenv.backends.kubeapi.kubeconfig import KubeconfigError, merged

from tests.fakekube.fixtures import find_kubectl


def _write(path: Path, current: str | None, clusters: dict[str, str], contexts: dict[str, str]) -> Path:
    config = {"apiVersion": "v1", "kind": "Config",
              "clusters": [{"name": n, "cluster": {"server": s}} for n, s in clusters.items()],
              "contexts": [{"name": n, "context": {"cluster": c, "user": "u"}} for n, c in contexts.items()],
              "users": [{"name": "u", "user": {"token": "t"}}]}
    if current is not None:
        config["current-context"] = current
    path.write_text(yaml.safe_dump(config))
    return path


def _view(kubectl: str, environ: dict[str, str]) -> dict[str, object]:
    out = subprocess.run([kubectl, "config", "view", "-o", "json"], capture_output=True, text=True, check=True,
                         env=environ).stdout
    return json.loads(out)


def test_merge_rules_agree_with_kubectl(tmp_path: Path) -> None:
    first = _write(tmp_path / "a", None, {"c1": "https://one:6443"}, {"ctx-a": "c1"})
    second = _write(tmp_path / "b", "ctx-b", {"c1": "https://shadowed:1", "c2": "https://two:6443"},
                    {"ctx-a": "c2", "ctx-b": "c2"})
    third = _write(tmp_path / "c", "ctx-a", {}, {})
    environ = {"KUBECONFIG": os.pathsep.join([str(first), "", str(tmp_path / "missing"), str(second), str(third)]),
               "HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    found = merged(environ)
    assert found["current-context"] == "ctx-b"
    assert [(c["name"], c["cluster"]["server"]) for c in found["clusters"]] == [("c1", "https://one:6443"),
                                                                                 ("c2", "https://two:6443")]
    assert [(c["name"], c["context"]["cluster"]) for c in found["contexts"]] == [("ctx-a", "c1"), ("ctx-b", "c2")]
    kubectl = find_kubectl()
    if kubectl is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("kubectl is missing: make install-system", pytrace=False)
        pytest.skip("kubectl is missing")
    view = _view(kubectl, environ)
    assert view["current-context"] == found["current-context"]
    assert sorted((c["name"], c["cluster"]["server"]) for c in view["clusters"]) == \
        sorted((c["name"], c["cluster"]["server"]) for c in found["clusters"])  # type: ignore[index]
    assert sorted((c["name"], c["context"]["cluster"]) for c in view["contexts"]) == \
        sorted((c["name"], c["context"]["cluster"]) for c in found["contexts"])  # type: ignore[index]


def test_the_default_file_and_a_broken_one(tmp_path: Path) -> None:
    assert merged({"HOME": str(tmp_path)}) == {"current-context": "", "contexts": [], "clusters": []}
    (tmp_path / ".kube").mkdir()
    _write(tmp_path / ".kube" / "config", "ctx", {"c": "https://h:6443"}, {"ctx": "c"})
    assert merged({"HOME": str(tmp_path)})["current-context"] == "ctx"
    (tmp_path / "bad").write_text("- a list\n")
    with pytest.raises(KubeconfigError, match="not a kubeconfig"):
        merged({"KUBECONFIG": str(tmp_path / "bad")})
