"""Gang admission on Kubernetes through the real kubectl against fakekube: the test plays Kueue (its pod webhook,
its Workload's conditions, the lifted gate; tests/fakekube/kueue.py) and Volcano (its scheduler, which the fake's
default scheduler leaves its pods to), from their documented behaviour. ``doctor`` names what the cluster lacks
(``deploy`` refuses it in the same words), ``deploy`` and ``status`` quote why the pods wait, ``clean`` deletes the
PodGroup mlenv made."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from mlenv import state

from tests.fakekube.fixtures import FakeCluster, fake_kube_factory  # noqa: F401 - the fixture, re-exported
from tests.fakekube.kueue import NO_QUOTA, KueuePlayer, local_queue
from tests.helpers import invoke as mlenv
from tests.integration.test_openshift_backend import (  # noqa: F401 - fixtures, re-exported
    NAMESPACE,
    cluster_file,
    fast_polling,
    names,
)


@pytest.fixture
def make(fake_kube_factory: Callable[..., FakeCluster], monkeypatch: pytest.MonkeyPatch  # noqa: F811
         ) -> Callable[..., FakeCluster]:
    """A fake cluster with these add-ons served, whose kubeconfig the CLI uses."""
    def started(*addons: str) -> FakeCluster:
        cluster = fake_kube_factory(nodes=["gpu-0", "gpu-1"], namespaces=[NAMESPACE], addons=addons)
        cluster.use_in(monkeypatch)
        return cluster
    return started


def admitted_by(home: Path, fake: FakeCluster, **scheduling: str) -> str:
    """The test cluster file with this ``scheduling:`` section."""
    path = cluster_file(home, fake)
    document = yaml.safe_load(Path(path).read_text())
    document["scheduling"] = scheduling
    Path(path).write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def details(path: str) -> list[str]:
    """The DETAIL of each pod, as ``status --json`` gives it."""
    status = mlenv("status", "--cluster", path, "--json")
    assert status.exit_code == 0, status.output
    return [pod["detail"] for pod in json.loads(status.stdout)["pods"]]


def volcano_queue(name: str) -> dict[str, object]:
    """A Volcano Queue (cluster-scoped, what a cluster admin creates)."""
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"weight": 1}}


def doctor_line(result_output: str, name: str) -> str:
    [line] = [line for line in result_output.splitlines() if name in line]
    return line


def test_doctor_names_what_kueue_admission_lacks(make: Callable[..., FakeCluster], home: Path) -> None:
    bare = make()
    path = admitted_by(home, bare, admission="kueue", queue="team-a")
    result = mlenv("doctor", "--cluster", path)
    line = doctor_line(result.output, "Kueue LocalQueue team-a")
    assert "FAIL" in line and "Kueue (kueue.x-k8s.io) is not installed on this cluster" in line, result.output
    assert result.exit_code != 0

    kueue = make("kueue")
    path = admitted_by(home, kueue, admission="kueue", queue="team-a")
    kueue.server.add(local_queue(NAMESPACE, "other", "cq-other"))
    result = mlenv("doctor", "--cluster", path)
    line = doctor_line(result.output, "Kueue LocalQueue team-a")
    assert "FAIL" in line and "team-a does not exist in namespace ml (there: other)" in line, result.output
    assert "a cluster admin creates LocalQueue team-a in namespace ml" in result.output

    kueue.server.add(local_queue(NAMESPACE, "team-a", "gpu-cq"))
    line = doctor_line(mlenv("doctor", "--cluster", path).output, "Kueue LocalQueue team-a")
    assert "PASS" in line and "admitting into ClusterQueue gpu-cq" in line, line


def refused_in_doctors_words(home: Path, path: str, fake: FakeCluster, check: str) -> None:
    """``deploy`` refuses ``path`` (exit 2) in the words of doctor's ``check``, one line, before changing anything:
    no object of the app in the namespace, nothing recorded; ``--dry-run`` still prints what deploy would send."""
    doctor = mlenv("doctor", "--cluster", path, "--json")
    [said] = [f"{c['evidence']}: {c['fix']}" for c in json.loads(doctor.stdout)["checks"] if c["name"] == check]
    before = len(fake.server.requests.api_calls())
    refused = mlenv("deploy", path)
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.strip().splitlines()[-1] == f"error: {said}", refused.stderr
    asked = fake.server.requests.api_calls()[before:]
    assert [r for r in asked if r.method != "GET" and not r.resource.endswith("reviews")] == []  # whoami, can-i
    assert fake.kubectl("get", "all,pvc,serviceaccounts", "-n", NAMESPACE, "-l",
                        "app.kubernetes.io/instance=ml-dev-env", "-o", "name").stdout == ""
    assert not (home / ".mlenv" / "state.json").exists() or "fake" not in state.load().deployments
    dry = mlenv("deploy", path, "--dry-run")
    assert dry.exit_code == 0 and "kind: StatefulSet" in dry.stdout, dry.output


def test_deploy_refuses_a_cluster_without_the_gang_scheduler_or_its_queue(make: Callable[..., FakeCluster],
                                                                          home: Path) -> None:
    bare = make()
    refused_in_doctors_words(home, admitted_by(home, bare, admission="kueue", queue="team-a"), bare,
                             "Kueue LocalQueue team-a")
    refused_in_doctors_words(home, admitted_by(home, bare, admission="volcano"), bare, "Volcano queue default")

    kueue = make("kueue")
    path = admitted_by(home, kueue, admission="kueue", queue="team-a")
    kueue.server.add(local_queue(NAMESPACE, "other", "cq-other"))
    refused_in_doctors_words(home, path, kueue, "Kueue LocalQueue team-a")

    kueue.server.add(local_queue(NAMESPACE, "team-a", "gpu-cq"))
    deployed = mlenv("deploy", path, "--timeout", "60")
    assert deployed.exit_code == 0, deployed.output  # nothing plays Kueue here: its pods are not held
    assert names(kueue, "statefulsets") == ["ml-dev-env"]


def test_pods_held_by_kueue_say_why_then_run_once_admitted(make: Callable[..., FakeCluster], home: Path) -> None:
    fake = make()
    player = KueuePlayer(fake.server)
    fake.forget_discovery()
    fake.server.add(local_queue(NAMESPACE, "team-a", "gpu-cq"))
    path = admitted_by(home, fake, admission="kueue", queue="team-a")
    held = mlenv("deploy", path, "--timeout", "2")
    assert held.exit_code == 1
    [workload] = player.workloads(NAMESPACE)
    name = workload["metadata"]["name"]
    assert workload["spec"]["queueName"] == "team-a"  # from the StatefulSet's label, as Kueue reads it
    said = f"waiting for Kueue to admit Workload {name} (LocalQueue team-a): {NO_QUOTA}"
    assert "not ready after 2s (0/2 pods ready)" in held.stderr and said in held.stderr, held.stderr
    assert all(pod["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
               and "nodeName" not in pod["spec"] for pod in fake.server.objects("pods", NAMESPACE))
    assert details(path) == [said, said]

    player.evict(NAMESPACE, "PodsReadyTimeout", f"Exceeded the PodsReady timeout {NAMESPACE}/{name}")
    fake.server.reconcile()
    evicted = (f"evicted by Kueue (PodsReadyTimeout: Exceeded the PodsReady timeout {NAMESPACE}/{name}); Workload "
               f"{name} waits in LocalQueue team-a to be admitted again")
    assert details(path) == [evicted, evicted]

    player.admit(NAMESPACE, "gpu-cq")
    deployed = mlenv("deploy", path)
    assert deployed.exit_code == 0, deployed.output
    assert sorted(pod["spec"]["nodeName"] for pod in fake.server.objects("pods", NAMESPACE)) == ["gpu-0", "gpu-1"]


def test_volcano_starts_the_pod_group_and_clean_deletes_it(make: Callable[..., FakeCluster], home: Path) -> None:
    fake = make("volcano")
    fake.server.add(volcano_queue("default"))  # what installing Volcano creates
    path = admitted_by(home, fake, admission="volcano")
    waiting = mlenv("deploy", path, "--timeout", "2")
    assert waiting.exit_code == 1
    [group] = fake.server.objects("podgroups", NAMESPACE)
    assert group["spec"] == {"minMember": 2, "queue": "default"}
    assert ("waiting for Volcano to start all 2 pods of PodGroup ml-dev-env together (queue default, phase "
            "Pending)") in waiting.stderr, waiting.stderr
    assert all("nodeName" not in pod["spec"] for pod in fake.server.objects("pods", NAMESPACE))  # not the default's

    fake.server.schedulers.add("volcano")  # the test plays Volcano's scheduler: room for both, it places both
    fake.server.reconcile()
    deployed = mlenv("deploy", path)
    assert deployed.exit_code == 0, deployed.output
    assert mlenv("clean", "--yes").exit_code == 0
    assert names(fake, "podgroups") == [] and names(fake, "statefulsets") == []
