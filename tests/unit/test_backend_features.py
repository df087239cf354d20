"""One way to say "this backend cannot do X" (core.capabilities.Feature, declared in core/registry.py): checked once
before acting, one line naming the backend, the feature and why (exit 2), nothing changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import Result
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


def _dry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: str, *options: str) -> Result:
    """``launch --dry-run`` of a job on the cluster file ``cluster`` of the repository, not deployed."""
    (tmp_path / "clusters").mkdir(exist_ok=True)
    shutil.copy(ROOT / "clusters" / f"{cluster}.yaml", tmp_path / "clusters" / f"{cluster}.yaml")
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return invoke("launch", "-c", cluster, "--dry-run", *options, "train.py")


@pytest.mark.parametrize(("cluster", "options", "said"), [
    ("local", ["--max-preemptions", "1"], "the local backend cannot resume a run whose nodes were taken away under "
                                          "it (launch --max-preemptions); its nodes are not taken away"),
    ("olivia", ["--detach", "--max-preemptions", "1"], "the slurm backend cannot resume a run whose nodes were "
                                                        "taken away under it (launch --max-preemptions)"),
])
def test_what_a_backend_cannot_resume_is_refused_before_anything(
    cluster: str, options: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = _dry_run(tmp_path, monkeypatch, cluster, *options)
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.startswith(f"error: {said}") and refused.stderr.count("\n") == 1, refused.stderr
    assert not (tmp_path / "runs").exists()


def test_a_detached_run_on_kubernetes_resumes_within_its_preemptions(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    detached = _dry_run(tmp_path, monkeypatch, "barcelona", "--detach", "--max-preemptions", "2")
    assert detached.exit_code == 0 and "cannot" not in detached.stderr, detached.output
    assert "--detach --max-preemptions 2" in detached.stdout, detached.stdout  # the pods' supervisors keep count
    attached = _dry_run(tmp_path, monkeypatch, "barcelona", "--max-preemptions", "2")
    assert attached.exit_code == 0 and "cannot" not in attached.stderr, attached.output
    assert "--max-preemptions" not in attached.stdout, attached.stdout  # mlenv keeps count


def test_run_ai_cannot_leave_a_node_out_and_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlenv import state

    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    state.exclude("rcp", {1: ("gpu-node-7", "NCCL network error: NET/IB : Got completion from peer")})
    refused = _dry_run(tmp_path, monkeypatch, "rcp")
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.startswith("error: the runai backend cannot leave a faulty node out of a run (launch "
                                     "--max-restarts, the excluded nodes of mlenv nodes); the runai CLI places a "
                                     "workload's pods by node pool (--node-pools) or node label (--node-type) "
                                     "only"), refused.stderr
    assert "kubectl cordon NODE" in refused.stderr and refused.stderr.count("\n") == 1
