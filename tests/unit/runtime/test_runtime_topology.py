"""Topology in each world: mlenv contract, StatefulSet, Run:ai/PyTorchJob, Slurm, torchrun, single."""

from __future__ import annotations

import json
import re
import socket

import pytest
from mlenv.runtime.node.nodelist import expand_nodelist
from mlenv.runtime.node.topology import Topology, TopologyError, detect_topology, host_name
from runtime_support import Runner

WORLDS = {
    "mlenv contract": (
        {"MLENV_NODE_RANK": "1", "MLENV_NUM_NODES": "2", "MLENV_PROCS_PER_NODE": "4",
         "MASTER_ADDR": "ml-dev-env-0.ml-dev-env-headless", "MASTER_PORT": "29500"},
        "ml-dev-env-1",
        Topology(1, 2, 4, "ml-dev-env-0.ml-dev-env-headless", 29500, "mlenv"),
    ),
    "statefulset pod": (
        {"MLENV_NUM_NODES": "3"},
        "ml-dev-env-2",
        Topology(2, 3, None, "ml-dev-env-0.ml-dev-env-headless", 29500, "statefulset"),
    ),
    "statefulset pod, own app name, FQDN hostname": (
        {"MLENV_APP_NAME": "llama-ft", "MLENV_NUM_NODES": "4", "MLENV_PROCS_PER_NODE": "8"},
        "llama-ft-3.llama-ft-headless.team-a.svc.cluster.local",
        Topology(3, 4, 8, "llama-ft-0.llama-ft-headless", 29500, "statefulset"),
    ),
    "run:ai submit-dist pytorch": (
        {"PET_NNODES": "2", "RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "RUNAI_NUM_OF_GPUS": "4",
         "MASTER_ADDR": "distributed-job-master-0", "MASTER_PORT": "23456"},
        "distributed-job-worker-0",
        Topology(1, 2, 4, "distributed-job-master-0", 23456, "pytorchjob"),
    ),
    "kubeflow trainer": (
        {"PET_NNODES": "3", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "8", "PET_MASTER_ADDR": "job-node-0-0.job",
         "PET_MASTER_PORT": "29400"},
        "job-node-0-2",
        Topology(2, 3, 8, "job-node-0-0.job", 29400, "pytorchjob"),
    ),
    "pytorchjob, elastic node range, nproc auto": (
        {"PET_NNODES": "1:4", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "auto", "MASTER_ADDR": "10.0.0.9"},
        "job-worker-0",
        Topology(0, 4, None, "10.0.0.9", 29500, "pytorchjob"),
    ),
    "slurm": (
        {"SLURM_JOB_ID": "4242", "SLURM_NODEID": "2", "SLURM_NNODES": "5", "SLURM_GPUS_ON_NODE": "4",
         "SLURM_JOB_NODELIST": "gpu[01-03,07],login1", "SLURM_PROCID": "2"},
        "gpu03",
        Topology(2, 5, 4, "gpu01", 29500, "slurm"),
    ),
    "slurm, node count from the node list, MASTER_ADDR set by the batch script": (
        {"SLURM_JOB_ID": "77", "SLURM_NODEID": "1", "SLURM_NODELIST": "node[04-05]", "MASTER_ADDR": "10.1.0.4"},
        "node05",
        Topology(1, 2, None, "10.1.0.4", 29500, "slurm"),
    ),
    "slurm with the mlenv contract on top": (
        {"SLURM_JOB_ID": "77", "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]",
         "MLENV_NODE_RANK": "1", "MLENV_NUM_NODES": "2", "MLENV_PROCS_PER_NODE": "2"},
        "n2",
        Topology(1, 2, 2, "n1", 29500, "mlenv"),
    ),
    "inside a torchrun worker (PET_* of the pod still set)": (
        {"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "3", "WORLD_SIZE": "4",
         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29611", "PET_NNODES": "2", "PET_NODE_RANK": "1"},
        "vm",
        Topology(1, 2, 2, "127.0.0.1", 29611, "torchrun"),
    ),
    "nothing at all: a single machine": ({}, "laptop", Topology(0, 1, None, "127.0.0.1", 29500, "single")),
}


@pytest.mark.parametrize(("environ", "hostname", "expected"), WORLDS.values(), ids=WORLDS.keys())
def test_each_world(environ: dict[str, str], hostname: str, expected: Topology) -> None:
    assert detect_topology(environ, hostname) == expected


def test_json_shape() -> None:
    found = detect_topology({"MLENV_NODE_RANK": "0", "MLENV_NUM_NODES": "1"}, "h").to_dict()
    assert found == {"node_rank": 0, "num_nodes": 1, "procs_per_node": None, "master_addr": "127.0.0.1",
                     "master_port": 29500, "source": "mlenv"}


BAD = {
    "rank not a number": ({"MLENV_NODE_RANK": "one", "MLENV_NUM_NODES": "2"}, "MLENV_NODE_RANK='one'"),
    "rank outside the node count": ({"MLENV_NODE_RANK": "2", "MLENV_NUM_NODES": "2", "MASTER_ADDR": "m"},
                                    "outside 0..1"),
    "node count without a rank": ({"MLENV_NUM_NODES": "2"}, "cannot tell the node rank"),
    "several nodes, no master": ({"MLENV_NODE_RANK": "1", "MLENV_NUM_NODES": "2"}, "set MASTER_ADDR"),
    "statefulset pod without a node count": ({"MLENV_APP_NAME": "app"}, "set MLENV_NODE_RANK and MLENV_NUM_NODES"),
    "port out of range": ({"MASTER_PORT": "70000"}, "not a TCP port"),
    "broken slurm node list": ({"SLURM_JOB_ID": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "gpu[01-"},
                               "unbalanced brackets"),
    "zero processes per node": ({"MLENV_PROCS_PER_NODE": "0"}, "at least 1"),
}


@pytest.mark.parametrize(("environ", "message"), BAD.values(), ids=BAD.keys())
def test_contradictions_are_errors(environ: dict[str, str], message: str) -> None:
    with pytest.raises(TopologyError, match=re.escape(message)):
        detect_topology(environ, "app-1")


NODELISTS = {
    "gpu[01-03,07],login1": ["gpu01", "gpu02", "gpu03", "gpu07", "login1"],
    "node1": ["node1"],
    "a[8-11]": ["a8", "a9", "a10", "a11"],
    "rack[1-2]-n[01-02]": ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"],
    "gpu[001-002],cpu[1,3],gpu-x": ["gpu001", "gpu002", "cpu1", "cpu3", "gpu-x"],
}


@pytest.mark.parametrize(("nodelist", "hosts"), NODELISTS.items())
def test_slurm_nodelist_expansion(nodelist: str, hosts: list[str]) -> None:
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["", "gpu[01-", "gpu01]", "gpu[a-b]", "gpu[3-1]", "gpu[[1]]"])
def test_bad_slurm_nodelists(nodelist: str) -> None:
    with pytest.raises(ValueError, match="Slurm node list"):
        expand_nodelist(nodelist)


def test_pod_name_from_the_hostname_variable() -> None:
    """Containers set HOSTNAME to the pod name; an explicit host name still wins."""
    environ = {"MLENV_NUM_NODES": "3", "HOSTNAME": "ml-dev-env-2"}
    assert detect_topology(environ) == Topology(2, 3, None, "ml-dev-env-0.ml-dev-env-headless", 29500, "statefulset")
    assert detect_topology(environ, "ml-dev-env-1").node_rank == 1
    assert host_name(environ) == "ml-dev-env-2"


def test_pod_name_from_the_system_without_hostname() -> None:
    assert host_name({}) == host_name({"HOSTNAME": " "}) == socket.gethostname()


def test_a_slurm_node_is_named_by_the_scheduler_never_by_the_batch_shell_s_hostname() -> None:
    """srun copies the batch shell's HOSTNAME to every node: n1's on n2."""
    assert host_name({"SLURMD_NODENAME": "n2", "HOSTNAME": "n1", "SLURM_JOB_ID": "7"}) == "n2"
    assert host_name({"HOSTNAME": "n1", "SLURM_JOB_ID": "7"}) == socket.gethostname()


def test_topology_command_reads_hostname(run_runtime: Runner) -> None:
    env = {"HOSTNAME": "llm-1", "MLENV_APP_NAME": "llm", "MLENV_NUM_NODES": "2"}
    found = json.loads(run_runtime("topology", "--json", env=env).stdout)
    assert (found["node_rank"], found["master_addr"], found["source"]) == (1, "llm-0.llm-headless", "statefulset")
