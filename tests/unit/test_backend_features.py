"""One way to say "this backend cannot do X" (core.capabilities.Feature, declared in core/registry.py): checked once
before acting, one line naming the backend, the feature and why (exit 2), nothing changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mlenv.core.capabilities import Feature
from mlenv.core.registry import BACKENDS
from mlenv.errors import UsageError

from tests.helpers import ROOT, invoke


@pytest.mark.parametrize("name", list(BACKENDS))
def test_each_declared_reason_is_one_line_and_discover_has_its_code(name: str) -> None:
    info = BACKENDS[name]
    assert all(why and "\n" not in why for why in info.unsupported.values()), info.unsupported
    assert info.supports(Feature.DISCOVER) == (info.discover is not None)


def test_spares_where_the_backend_holds_none_is_one_line_before_anything(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "clusters").mkdir()
    shutil.copy(ROOT / "clusters" / "lab.yaml", tmp_path / "clusters" / "lab.yaml")
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    refused = invoke("deploy", "lab", "--spares", "1")
    assert refused.exit_code == 2, refused.output
    assert refused.stderr == ("error: the ssh backend cannot hold spare nodes in its deployment (deploy --spares); "
                              "list spare hosts in the cluster file's ssh.spares instead\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["clusters"]


def test_several_lacking_features_are_named_in_one_line() -> None:
    with pytest.raises(UsageError, match=r"^the local backend cannot hold spare nodes .*; it also cannot discover ") \
            as refused:
        BACKENDS["local"].require(Feature.DEPLOY, Feature.SPARE_NODES, Feature.DISCOVER)
    assert "\n" not in str(refused.value)
