"""The tiers: each test is marked by what it and its fixtures reach (tests/tiers.py), as pytest collects it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import ROOT
from tests.tiers import TIERS

FILES = ("tests/integration/test_slurm_harness.py", "tests/integration/test_ssh_spares.py",
         "tests/integration/test_conformance.py", "tests/integration/test_local_namespaces.py",
         "tests/integration/test_local_processes.py", "tests/integration/test_packaging.py")
SHOW = """\
import sys, pytest
class Show:
    def pytest_collection_finish(self, session):
        for item in session.items:
            print(item.nodeid, " ".join(marker.name for marker in item.iter_markers()), sep="\\t")
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[Show()]))
"""


def test_a_test_is_marked_by_its_fixtures_its_helpers_and_the_prerequisites_it_names() -> None:
    done = subprocess.run([sys.executable, "-c", SHOW, *FILES], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines() if "\t" in line]
    marked = {test: set(names.split()) & TIERS for test, names in rows}
    by_file = {test: names for test, names in marked.items() if "test_slurm_harness.py::" in test}
    assert by_file and all(names == {"slurm"} for names in by_file.values())  # the slurm_cluster fixture
    conformance = "tests/integration/test_conformance.py::test_conformance"
    assert marked[f"{conformance}[slurm]"] == {"slurm", "torch"}  # request.getfixturevalue, require("torch")
    assert marked[f"{conformance}[ssh]"] == {"sshd", "torch"}
    assert marked[f"{conformance}[local]"] == {"torch"}  # a local cluster of processes
    assert marked[f"{conformance}[runai]"] == {"fakekube", "torch"}  # its pods run as processes
    assert marked["tests/integration/test_ssh_spares.py::test_an_excluded_host_is_replaced_by_a_spare"] == {"sshd"}
    assert marked["tests/integration/test_ssh_spares.py::test_bad_spares_are_bad_input"] == set()  # validate only
    netns = {test for test, names in marked.items() if "netns" in names}
    assert netns and all("test_local_namespaces.py::" in test for test in netns)  # isolation: namespaces
    assert marked["tests/integration/test_local_processes.py::test_processes_mode_end_to_end"] == {"torch"}
    assert marked["tests/integration/test_packaging.py::test_pip_install_dot_renders_outside_the_checkout"] == {
        "release"}  # a fresh virtualenv



def test_a_module_s_tests_run_on_one_worker() -> None:
    """What scripts/test.sh asks of xdist holds: each module's tests run on one worker, named by its group."""
    files = ("tests/unit/test_spares.py", "tests/unit/test_ui_table.py")
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder",
                           "-v", "-p", "no:cacheprovider", *files], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    workers: dict[str, set[str]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("[gw") and " PASSED " in line:
            test = line.split(" PASSED ")[1].strip()
            assert test.endswith(f"@{test.split('::')[0]}"), test  # named by its module's group
            workers.setdefault(test.split("::")[0], set()).add(line.split()[0])
    assert set(workers) == set(files) and all(len(ran_on) == 1 for ran_on in workers.values()), workers


def test_each_phase_of_a_run_with_workers_keeps_only_its_own_tests() -> None:
    """scripts/test.sh's two phases: the timing tests (marked by hand) only in the second, every other test only in
    the first, and all of them without a phase."""
    module = "tests/integration/test_ssh_drill.py"

    def collected(phase: str | None) -> set[str]:
        env = {k: v for k, v in os.environ.items() if k != "TEST_PHASE"}
        if phase is not None:
            env["TEST_PHASE"] = phase
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               module], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        return {line.split("::")[1] for line in done.stdout.splitlines() if "::" in line}

    every, parallel, timing = collected(None), collected("parallel"), collected("timing")
    assert timing == {"test_a_rank_three_times_slower_is_named_a_straggler", "test_equal_ranks_name_no_straggler"}
    assert parallel == every - timing and parallel
