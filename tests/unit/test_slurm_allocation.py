"""The Slurm allocation as a deployment's handle records it (backends/slurm/allocation.py): the one typed view every
verb reads, and the keys it writes back, as earlier mlenv versions wrote them."""

from __future__ import annotations

from mlenv.backends.slurm.allocation import Allocation
from mlenv.core.capabilities import Handle

HANDLE = Handle("slurm", "olivia", 2, "tcp", True, {}, {"job": {}, "allocation": None})


def test_a_handle_before_deploy_submitted_has_an_empty_allocation() -> None:
    assert Allocation.of(HANDLE) == Allocation() and Allocation.of(HANDLE).held == ()


def test_what_deploy_records_reads_back_with_the_keys_it_always_had() -> None:
    submitted = Allocation("4242", "ab12").on(HANDLE)
    assert submitted.data["allocation"] == {"id": "4242", "digest": "ab12"}
    running = Allocation("4242", "ab12", "10.0.0.1", ("10.0.0.1", None), ("gpu-0", "gpu-1")).on(submitted)
    assert running.data == {"job": {}, "allocation": {
        "id": "4242", "digest": "ab12", "master_addr": "10.0.0.1", "addresses": ["10.0.0.1", None],
        "hosts": ["gpu-0", "gpu-1"]}}
    assert Allocation.of(running).held == ("gpu-0", "gpu-1") and Allocation.of(running).master_addr == "10.0.0.1"


def test_an_allocation_id_that_is_no_job_id_is_none() -> None:
    assert Allocation.of(Handle("slurm", "olivia", 2, "tcp", True, {}, {"allocation": {"id": "x"}})).id is None
