"""Rendered objects are checked against the real schemas: upstream Kubernetes (strict) and the CRDs."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from mlenv.backends.kubeapi.naming import kube_deployment
from mlenv.backends.kubernetes.render import render
from mlenv.backends.kubernetes.schemas import validate_object
from mlenv.core.clusters import load_cluster
from mlenv.errors import OperationError
from mlenv.plan import plan


def _objects() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rendered = render(kube_deployment(plan(load_cluster("clusters/template.yaml"), "rdma"), openshift=True))
    return rendered.objects, rendered.admin_objects


def test_unknown_field_in_a_statefulset_is_rejected() -> None:
    statefulset = copy.deepcopy(_objects()[0][-1])
    statefulset["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(OperationError, match="StatefulSet/ml-dev-env is invalid"):
        validate_object(statefulset, "1.30")


def test_wrong_type_in_a_service_is_rejected() -> None:
    service = copy.deepcopy(_objects()[0][3])
    service["spec"]["ports"][0]["port"] = "twenty"
    with pytest.raises(OperationError, match="Service/ml-dev-env-headless is invalid"):
        validate_object(service, "1.30")


def test_scc_is_checked_against_its_crd() -> None:
    scc = copy.deepcopy(_objects()[1][0])
    validate_object(scc, "1.30")
    scc["allowPrivilegedContainer"] = "no"
    with pytest.raises(OperationError, match="SecurityContextConstraints/mlenv-ipc-lock is invalid"):
        validate_object(scc, "1.30")
    scc["allowPrivilegedContainer"] = False
    scc["allowEverything"] = True
    with pytest.raises(OperationError, match="allowEverything"):
        validate_object(scc, "1.30")


def test_network_attachment_definition_and_route_crds() -> None:
    nad = {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
           "metadata": {"name": "sriov-rdma-net1"}, "spec": {"config": '{"cniVersion": "0.3.1", "type": "sriov"}'}}
    validate_object(nad, "1.30")
    route = {"apiVersion": "route.openshift.io/v1", "kind": "Route", "metadata": {"name": "tb"},
             "spec": {"host": "tb.apps.example.com", "to": {"kind": "Service", "name": "tb"}}}
    validate_object(route, "1.30")
    route["spec"]["port"] = {"targetPort": 8080}  # an int-or-string: its CRD schema once had a null anyOf
    validate_object(route, "1.30")
    route["spec"]["to"]["weight"] = "heavy"
    with pytest.raises(OperationError, match="Route/tb is invalid"):
        validate_object(route, "1.30")


def test_unsupported_kubernetes_version_is_a_clear_error() -> None:
    with pytest.raises(OperationError, match="set kubernetes_version"):
        validate_object(_objects()[0][0], "1.99")
