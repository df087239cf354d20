"""Where an excluded node's work goes (core/spares.py), and a Slurm allocation's launch with spare nodes: pure, the
scripts as ``launch --dry-run`` prints them."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from mlenv import state
from mlenv.backends.slurm.backend import SlurmBackend
from mlenv.core.capabilities import LaunchRequest, LaunchSpec
from mlenv.core.clusters import load_plan
from mlenv.core.recorded import RecordedRun, SpareUse
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
    nodes = ",".join([held[-1], *held[1:-1]])  # the spare in node 0's place, with its node rank
    # the runtime that runs the attempts (runtime/supervise/slurmsteps.py) places node N on the N-th of --nodelist
    assert f" --nodelist {nodes} --allocation {','.join(held)} " in launch.text
    assert "--distribution=arbitrary" in launch.text and 'export MLENV_NODE_RANK="$SLURM_PROCID"' in launch.text
    assert " --max-restarts 0 " in launch.text  # attached: mlenv itself restarts, onto spares
    detached = backend.prepare_launch(handle, replace(spec, detach=True, max_restarts=2))
    assert " --max-restarts 2 " in detached.text  # its runtime moves onto the rest
    assert f" --allocation {','.join(held)} --exclude gpu-0,elsewhere " in detached.text
    plain = backend.prepare_launch(handle, replace(spec, exclude=()))
    assert plain.spares == {} and f" --nodelist {','.join(held[:-1])} " in plain.text  # never the spare
    with pytest.raises(OperationError, match=r"has no usable spares for the 1 excluded node \(node-0\)"):
        backend.prepare_launch(handle, replace(spec, exclude=("gpu-0", held[-1])))
    without = replace(handle, data={**handle.data, "allocation": {"id": "4242", "digest": "x"}})  # hosts unknown
    with pytest.raises(OperationError, match="no spare node to take their place"):
        backend.prepare_launch(without, spec)
    assert backend.prepare_launch(without, replace(spec, exclude=())).spares == {}


def test_the_nodes_on_spares_are_said_with_why_and_kept_on_the_run(olivia: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from mlenv.ops.spares import announce
    from mlenv.ops.target import resolve

    backend = SlurmBackend(state.RECORDS)
    handle = backend.prepare(load_plan("olivia")).handle
    state.record(state.Deployment(handle.name, handle.backend, str(olivia / "clusters" / "olivia.yaml"), "tcp", 2,
                                  None, handle))
    state.succeeded(handle.name)
    state.update(handle.name, runs=lambda runs: (*runs, RecordedRun("RUN")))
    target = resolve("olivia")
    spec = LaunchSpec("torchrun", "train.py", run_id="RUN")
    request = LaunchRequest(spec, "", {}, {}, spares={0: ("gpu-0", "gpu-9"), 1: ("gpu-1", "gpu-8")})
    announce(target, request, {"gpu-0": "a node fault"})
    assert capsys.readouterr().err.splitlines() == [
        "WARNING: node-0: gpu-0 excluded (a node fault), using spare gpu-9",
        "WARNING: node-1: gpu-1 excluded (mlenv nodes says why), using spare gpu-8"]
    assert state.load().deployments[handle.name].runs == (RecordedRun("RUN", spares=(
        SpareUse(0, "gpu-0", "gpu-9"), SpareUse(1, "gpu-1", "gpu-8"))),)
    announce(target, replace(request, spec=replace(spec, run_id="OTHER")), {})  # not the latest run: not recorded
    assert state.load().deployments[handle.name].runs[-1].id == "RUN"
    assert len(state.load().deployments[handle.name].runs) == 1
