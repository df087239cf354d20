"""Where an excluded node's work goes (core/spares.py), and a Slurm allocation's launch with spare nodes: pure, the
scripts as ``launch --dry-run`` prints them."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from mlenv import state
from mlenv.backends.slurm.backend import SlurmBackend
from mlenv.core.capabilities import LaunchSpec
from mlenv.core.clusters import load_plan
from mlenv.core.spares import place
from mlenv.errors import OperationError

ROOT = Path(__file__).resolve().parents[2]


def test_spares_take_the_excluded_nodes_places_in_order() -> None:
    assert place("c", ["a", "b", "c"], ["s1", "s2"], ()) == {}
    assert place("c", ["a", "b", "c"], ["s1", "s2"], ["c", "a", "elsewhere"]) == {0: ("a", "s1"), 2: ("c", "s2")}
    assert place("c", ["a", "b"], ["s1", "s2"], ["b", "s1"]) == {1: ("b", "s2")}  # an excluded spare is skipped
    with pytest.raises(OperationError, match=r"^a must be left out of the run \(mlenv nodes says why\), and c has "
                                             r"no spare node to take their place: stopping\. mlenv nodes"):
        place("c", ["a", "b"], [], ["a"])
    with pytest.raises(OperationError, match=r"^a, b must be left out .* and c has 1 usable spare \(s2\) for the 2 "
                                             r"excluded nodes \(node-0, node-1\): stopping"):
        place("c", ["a", "b"], ["s1", "s2"], ["a", "b", "s1"])


@pytest.fixture
def olivia(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "clusters").mkdir()
    (tmp_path / "manifests").mkdir()
    shutil.copy(ROOT / "clusters" / "olivia.yaml", tmp_path / "clusters")
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_launch_inside_an_allocation_with_spares_names_its_nodes(olivia: Path) -> None:
    backend = SlurmBackend(state.RECORDS)
    plan = load_plan("olivia")
    request = backend.prepare(plan._replace(spares=1))
    assert f"#SBATCH --nodes={plan.nodes + 1}\n" in request.text
    held = [f"gpu-{n}" for n in range(plan.nodes + 1)]
    handle = replace(request.handle, data={**request.handle.data,
                                           "allocation": {"id": "4242", "digest": "x", "hosts": held}})
    spec = LaunchSpec("torchrun", "train.py", run_id="RUN", exclude=("gpu-0", "elsewhere"))
    launch = backend.prepare_launch(handle, spec)
    assert launch == backend.prepare_launch(handle, spec)  # pure
    assert launch.spares == {0: ("gpu-0", held[-1])}
    nodes = ",".join(held[1:])
    assert ' --nodelist="$nodes" ' in launch.text and f"\nnodes={nodes} head=gpu-1\n" in launch.text
    assert 'echo "mlenv: job $SLURM_JOB_ID on $nodes, master $head' in launch.text
    assert "move()" not in launch.text  # attached: mlenv itself restarts, onto spares
    detached = backend.prepare_launch(handle, replace(spec, detach=True, max_restarts=2))
    assert f"\nheld={','.join(held)} left=gpu-0,elsewhere\n" in detached.text  # its script moves onto the rest
    plain = backend.prepare_launch(handle, replace(spec, exclude=()))
    assert plain.spares == {} and f"\nnodes={','.join(held[:-1])} head=gpu-0\n" in plain.text  # never the spare
    with pytest.raises(OperationError, match=r"has no usable spares for the 1 excluded node \(node-0\)"):
        backend.prepare_launch(handle, replace(spec, exclude=("gpu-0", held[-1])))
    without = replace(handle, data={**handle.data, "allocation": {"id": "4242", "digest": "x"}})  # hosts unknown
    with pytest.raises(OperationError, match="no spare node to take their place"):
        backend.prepare_launch(without, spec)
    assert backend.prepare_launch(without, replace(spec, exclude=())).spares == {}
