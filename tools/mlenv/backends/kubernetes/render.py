"""Deployment -> Kubernetes objects, through the jinja2 templates in manifests/kubernetes/.

Every ``{{ }}`` in a template is passed through :func:`yaml_value`, so no value from a cluster file can
inject YAML. The rendered text is parsed back and each object validated before anyone sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from mlenv.plan import Deployment
from mlenv.render.yamlsafe import yaml_value


@dataclass(frozen=True)
class Rendered:
    """The objects to apply, in dependency order, and those a cluster admin must apply."""

    objects: list[dict[str, Any]]
    admin_objects: list[dict[str, Any]]


def templates_dir() -> Path:
    """manifests/kubernetes/ of the mlenv checkout."""
    from mlenv.config.discover import project_root

    return project_root() / "manifests" / "kubernetes"


@lru_cache(maxsize=4)
def _environment(directory: str) -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,
        finalize=yaml_value,
        autoescape=False,  # noqa: S701 - the output is YAML, escaped by finalize, not HTML
        keep_trailing_newline=True,
    )


def _render(template: str, **context: Any) -> dict[str, Any]:
    text = _environment(str(templates_dir())).get_template(template).render(**context)
    obj = yaml.safe_load(text)
    if not isinstance(obj, dict):
        raise ValueError(f"{template} did not render a mapping")
    return obj


def _container_resources(d: Deployment) -> dict[str, dict[str, Any]]:
    extended: dict[str, Any] = dict(d.rdma_resources)
    if d.cluster.gpus.per_node:
        extended = {"nvidia.com/gpu": d.cluster.gpus.per_node, **extended}
    return {
        "requests": {**d.cluster.requests, **extended},
        "limits": {**d.cluster.limits, **extended},
    }


def render_objects(d: Deployment) -> Rendered:
    """Render (unvalidated) objects for ``d``: ServiceAccount, PVCs, Service, StatefulSet; SCC+RBAC for admins."""
    objects = [_render("serviceaccount.yaml.j2", d=d)]
    if d.storage.shared:
        claims = ((d.storage.workspace_claim, d.storage.workspace_size),
                  (d.storage.datasets_claim, d.storage.datasets_size))
        objects += [_render("persistentvolumeclaim.yaml.j2", d=d, claim_name=name, claim_size=size)
                    for name, size in claims]
    objects.append(_render("service.yaml.j2", d=d))
    objects.append(_render("statefulset.yaml.j2", d=d, resources=_container_resources(d)))
    admin = []
    if d.ipc_lock_scc:
        admin = [_render(name, d=d) for name in
                 ("securitycontextconstraints.yaml.j2", "role.yaml.j2", "rolebinding.yaml.j2")]
    return Rendered(objects, admin)


def render(d: Deployment) -> Rendered:
    """Render and validate every object; an invalid object is an mlenv bug (OperationError)."""
    from mlenv.backends.kubernetes.schemas import validate_object

    rendered = render_objects(d)
    for obj in (*rendered.objects, *rendered.admin_objects):
        validate_object(obj, d.cluster.kubernetes_version)
    return rendered


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """Objects as one multi-document YAML stream, deterministic byte for byte."""
    return "".join("---\n" + yaml.safe_dump(obj, sort_keys=False, allow_unicode=False, width=4096)
                   for obj in objects)


def file_name(index: int, obj: dict[str, Any]) -> str:
    """``01-serviceaccount-ml-dev-sa.yaml``: ordered, one object per file."""
    return f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
