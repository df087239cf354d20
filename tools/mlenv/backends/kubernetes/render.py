"""KubeDeployment -> Kubernetes objects, through the jinja2 templates in manifests/kubernetes/.

Every ``{{ }}`` in a template is passed through :func:`yaml_value`, so no value from a cluster file can
inject YAML. The rendered text is parsed back and each object validated before anyone sees it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import yaml

import mlenv
from mlenv.backends.kubeapi.naming import (
    DATA_KIND,
    GRANT_KINDS,
    KubeDeployment,
    grant_labels,
    mover_account,
    owned_labels,
    run_secret,
)
from mlenv.backends.kubernetes import podinit
from mlenv.backends.kubernetes.admission import admission
from mlenv.backends.kubernetes.rules import version_of
from mlenv.backends.kubernetes.schemas import kind_and_name, validate_object
from mlenv.config.model import Scheduling
from mlenv.errors import OperationError
from mlenv.render.templates import Templates
from mlenv.render.yamlsafe import yaml_value
from mlenv.runtime.records.jsonvalue import JsonObject
from mlenv.runtime.records.runlayout import (
    CHECKPOINT_SIGNAL_VARIABLE,
    LEFT_OUT,
    LEFT_OUT_ANNOTATION,
    MOVE_DIR,
    MOVES_PODS,
    PREEMPTED_MARK,
    RUN_SECRETS,
)
from mlenv.runtime.supervise import podmover

TEMPLATES = os.path.join(os.path.dirname(mlenv.__file__), "manifests", "kubernetes")
"""In the package: manifests/ links to the checkout's manifests/ and is copied into an installed package."""
MOVER_UID = 65532
"""The mover container's user (scheduling.move_faulty_pods), unless the pods run as it (then the next one)."""
MOVER_REQUESTS = "/mlenv-move"
MOVER_TOKEN = "/var/run/secrets/mlenv-mover"  # noqa: S105 - a directory
"""Where the mover takes node 0's requests (a memory volume the training container mounts too) and its token."""


class Rendered(NamedTuple):
    """The objects to apply, in dependency order, those a cluster admin must apply, and the gang scheduler that
    admits the pods (apply refuses a cluster that lacks it)."""

    objects: list[JsonObject]
    admin_objects: list[JsonObject]
    scheduling: Scheduling


def templates_dir() -> str:
    """The directory of the Kubernetes templates; OperationError in one line when it is missing."""
    if os.path.isdir(TEMPLATES):
        return TEMPLATES
    raise OperationError("the Kubernetes templates (manifests/kubernetes/) are missing from this installation: "
                         "reinstall mlenv (pip install .) or run it from its checkout")


@lru_cache(maxsize=4)
def _templates(directory: str) -> Templates:
    return Templates(directory, yaml_value)


def _render(template: str, **context: Any) -> JsonObject:
    text = _templates(templates_dir()).render(template, **context)
    obj = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader
    if not isinstance(obj, dict):
        raise OperationError(f"{template} did not render a mapping (this is an mlenv bug: please report it)")
    return obj


def _container_resources(d: KubeDeployment) -> dict[str, dict[str, str | int]]:
    extended: dict[str, str | int] = dict(d.rdma_resources)
    if d.plan.gpus_per_node:
        extended = {"nvidia.com/gpu": d.plan.gpus_per_node, **extended}
    return {
        "requests": {**d.cluster.requests, **extended},
        "limits": {**d.cluster.limits, **extended},
    }


def render_objects(d: KubeDeployment) -> Rendered:
    """Unvalidated objects: ServiceAccount, PVCs, Service, NetworkPolicy, Volcano's PodGroup, the Role that lets a
    detached run move its pods (scheduling.move_faulty_pods), StatefulSet; SCC+RBAC for admins."""
    objects = [_render("serviceaccount.yaml.j2", d=d)]
    if d.storage.shared:
        claims = ((d.storage.workspace_claim, d.storage.workspace_size),
                  (d.storage.datasets_claim, d.storage.datasets_size))
        objects += [_render("persistentvolumeclaim.yaml.j2", d=d, claim_name=name, claim_size=size)
                    for name, size in claims]
    objects.append(_render("service.yaml.j2", d=d))
    if d.network_policy:
        objects.append(_render("networkpolicy.yaml.j2", d=d))
    gang = admission(d.cluster.scheduling, d.app)
    if gang.pod_group_queue is not None:
        objects.append(_render("podgroup.yaml.j2", d=d, admission=gang))
    moves = d.cluster.scheduling.move_faulty_pods
    if moves:
        grant = {key: value for key, value in grant_labels(d.app).items() if key not in owned_labels(d.app)}
        objects += [_render(name, d=d, role=mover_account(d.app), grant=grant,
                            pod_names=[f"{d.app}-{n}" for n in range(d.nodes)])
                    for name in ("movepods-role.yaml.j2", "movepods-rolebinding.yaml.j2")]
    objects.append(_render("statefulset.yaml.j2", d=d, resources=_container_resources(d), admission=gang,
                           command=podinit.command(d.cluster.scheduling.grace_period), run_secret=run_secret(d.app),
                           run_secret_dir=podinit.RUN_SECRET_DIR,
                           taken_away={PREEMPTED_MARK: podinit.MARK, CHECKPOINT_SIGNAL_VARIABLE: podinit.SIGNAL,
                                       RUN_SECRETS: podinit.RUN_SECRET_DIR,
                                       **({MOVES_PODS: d.app} if moves else {})},
                           left_out=(LEFT_OUT, f"metadata.annotations['{LEFT_OUT_ANNOTATION}']") if moves else None,
                           mover=_mover(d) if moves else None))
    admin = []
    if d.ipc_lock_scc:
        admin = [_render(name, d=d) for name in
                 ("securitycontextconstraints.yaml.j2", "role.yaml.j2", "rolebinding.yaml.j2")]
    return Rendered(objects, admin, d.cluster.scheduling)


@dataclass(frozen=True)
class Mover:
    """The pod's mover container (scheduling.move_faulty_pods), as the StatefulSet's template reads it: the variable
    that tells the training container where to ask, where it takes requests and mounts its token, its command, and
    its user: another than the training container's (OpenShift assigns one from the namespace's range to every
    container: None)."""

    variable: str
    requests: str
    token: str
    uid: int | None
    command: list[str]


def _mover(d: KubeDeployment) -> Mover:
    """The mover of ``d``'s pods."""
    uid = None if d.openshift else (MOVER_UID + 1 if d.run_as_user == MOVER_UID else MOVER_UID)
    return Mover(MOVE_DIR, MOVER_REQUESTS, MOVER_TOKEN, uid, podmover.command(MOVER_REQUESTS, d.app, MOVER_TOKEN))


def render(d: KubeDeployment) -> Rendered:
    """Render and validate every object; an invalid object is an mlenv bug (OperationError)."""
    rendered = render_objects(d)
    for obj in (*rendered.objects, *rendered.admin_objects):
        validate_object(obj, version_of(d.cluster))
    return rendered


def owned_kinds(objects: list[JsonObject]) -> list[str]:
    """The kinds ``clean`` deletes by mlenv's labels, dependants first (PVCs are data: only with --delete-data; the
    Role of scheduling.move_faulty_pods by its own labels: naming.GRANT_KINDS)."""
    return list(dict.fromkeys(kind for kind in (kind_and_name(obj)[0].lower() for obj in reversed(objects))
                              if kind != DATA_KIND.lower() and kind not in GRANT_KINDS))


def file_name(index: int, obj: JsonObject) -> str:
    """``01-serviceaccount-ml-dev-sa.yaml``: ordered, one object per file."""
    kind, name = kind_and_name(obj)
    return f"{index:02d}-{kind.lower()}-{name}.yaml"


def files(rendered: Rendered, documents: list[str], admin_documents: list[str]) -> dict[str, str]:
    """``render -o DIR``: one file per object (its ``document``) plus kustomization.yaml; admin objects under
    ``admin/``."""
    written: dict[str, str] = {}
    for prefix, objects, texts in (("", rendered.objects, documents),
                                   ("admin/", rendered.admin_objects, admin_documents)):
        if not objects:
            continue
        names = [file_name(index, obj) for index, obj in enumerate(objects, start=1)]
        written.update({prefix + name: text for name, text in zip(names, texts, strict=True)})
        written[prefix + "kustomization.yaml"] = _kustomization(names)
    return written


def _kustomization(names: list[str]) -> str:
    body = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": names}
    return yaml.safe_dump(body, sort_keys=False)
