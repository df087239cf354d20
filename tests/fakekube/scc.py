"""OpenShift's SCC admission, the part that decides who a pod runs as.

A namespace gets the ranges OpenShift's cluster-policy-controller gives it (``openshift.io/sa.scc.uid-range``,
``openshift.io/sa.scc.supplemental-groups``, ``openshift.io/sa.scc.mcs``). A new pod is admitted under the SCC its
``openshift.io/required-scc`` annotation names, else ``restricted-v2`` (what every service account may use), and
is changed as that SCC says: ``MustRunAsRange`` gives each container without a user the first UID of the
namespace's range (a user outside it is refused), ``fsGroup: MustRunAs`` the first group of the supplemental
range, ``requiredDropCapabilities`` are added to each container's drops, ``allowPrivilegeEscalation: false`` is
set; the pod is annotated ``openshift.io/scc``. Not modelled: which SCCs a user may use (the required one is
used if it exists) and SELinux (fakekube's nodes have none, so ``seLinuxOptions`` are not set).
"""

from __future__ import annotations

import itertools
from typing import Any

UID_RANGE = "openshift.io/sa.scc.uid-range"
GROUP_RANGE = "openshift.io/sa.scc.supplemental-groups"
MCS = "openshift.io/sa.scc.mcs"
REQUIRED = "openshift.io/required-scc"
ADMITTED_BY = "openshift.io/scc"
DEFAULT_SCC = "restricted-v2"
FIRST_UID, BLOCK = 1_000_000_000, 10_000


class Ranges:
    """Hands each new namespace its own block of UIDs, as OpenShift does."""

    def __init__(self) -> None:
        self._blocks = itertools.count(60)

    def annotate(self, namespace: dict[str, Any]) -> None:
        """Give ``namespace`` its ranges unless it has them."""
        annotations = namespace["metadata"].setdefault("annotations", {})
        if UID_RANGE in annotations:
            return
        block = next(self._blocks)
        start = FIRST_UID + block * BLOCK
        annotations.update({UID_RANGE: f"{start}/{BLOCK}", GROUP_RANGE: f"{start}/{BLOCK}",
                            MCS: f"s0:c{block // 26 + 1},c{block % 26 + 1}"})


def _range(namespace: dict[str, Any], key: str) -> tuple[int, int]:
    """(first, last) of a namespace's ``start/size`` range annotation; ValueError naming it when missing."""
    value = (namespace["metadata"].get("annotations") or {}).get(key)
    if not value:
        raise ValueError(f"unable to find annotation {key}")
    start, size = (int(part) for part in str(value).split("/"))
    return start, start + size - 1


def admit(pod: dict[str, Any], namespace: dict[str, Any], sccs: dict[str, dict[str, Any]]) -> str | None:
    """Change ``pod`` (a new one) as its SCC says; why it is refused, or None. Nothing happens without SCCs."""
    annotations = pod["metadata"].setdefault("annotations", {})
    scc = sccs.get(str(annotations.get(REQUIRED, ""))) or sccs.get(DEFAULT_SCC)
    if scc is None:
        return None
    name = scc["metadata"]["name"]
    spec = pod.setdefault("spec", {})
    pod_context = spec.setdefault("securityContext", {})
    problems = []
    try:
        if (scc.get("runAsUser") or {}).get("type") == "MustRunAsRange":
            low, high = _range(namespace, UID_RANGE)
            for index, container in enumerate(spec.get("containers") or []):
                context = container.setdefault("securityContext", {})
                uid = context.get("runAsUser", pod_context.get("runAsUser"))
                if uid is None:
                    context["runAsUser"] = low
                elif not low <= uid <= high:
                    problems.append(f"spec.containers[{index}].securityContext.runAsUser: Invalid value: {uid}: "
                                    f"must be in the ranges: [{low}, {high}]")
        if (scc.get("fsGroup") or {}).get("type") == "MustRunAs":
            low, high = _range(namespace, GROUP_RANGE)
            group = pod_context.setdefault("fsGroup", low)
            if not low <= group <= high:
                problems.append(f"spec.securityContext.fsGroup: Invalid value: []int64{{{group}}}: {group} is not an "
                                f"allowed group")
    except ValueError as exc:
        return f"unable to validate against any security context constraint: [provider {name!r}: {exc}]"
    for index, container in enumerate(spec.get("containers") or []):
        context = container.setdefault("securityContext", {})
        if not scc.get("allowPrivilegeEscalation", True) and context.setdefault("allowPrivilegeEscalation", False):
                problems.append(f"spec.containers[{index}].securityContext.allowPrivilegeEscalation: Invalid value: "
                                "true: Allowing privilege escalation for containers is not allowed")
        capabilities = context.get("capabilities") or {}
        drops = list(capabilities.get("drop") or [])
        if "ALL" not in drops:
            drops += [c for c in scc.get("requiredDropCapabilities") or [] if c not in drops]
        if drops:
            context["capabilities"] = {**capabilities, "drop": drops}
    if problems:
        return (f"unable to validate against any security context constraint: [provider {name!r}: Forbidden: "
                f"{', '.join(problems)}]").replace("'", '"')
    annotations[ADMITTED_BY] = name
    return None
