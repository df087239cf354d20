"""Authorization, in two models by who asks:

- the admin kubeconfig user and whomever it impersonates (``kubectl --as``): everything is allowed but requests in
  a forbidden namespace and what a :class:`Deny` rule names (so tests need no RBAC objects);
- a pod's ServiceAccount (its bound token, :mod:`incluster`): real RBAC, as a cluster's authorizer decides: only
  what a Role granted by a RoleBinding of the request's namespace allows (plus what every authenticated user may:
  the ``system:basic-user`` self reviews), with forbidden namespaces and :class:`Deny` rules still on top.

One decision answers both real requests (403 with the RBAC wording) and access reviews (``kubectl auth can-i``,
SubjectAccessReviews)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from .resources import ResourceType
from .store import now_iso

ALLOWED_REASON = "fakekube allows everything"


class Deny(NamedTuple):
    """A permission taken away; ``*`` in a field matches anything.

    ``resource`` is ``TYPE[/NAME]`` as ``kubectl auth can-i`` spells it, TYPE a plural (``pods``) or
    ``plural.group`` (``statefulsets.apps``, ``securitycontextconstraints.security.openshift.io``);
    ``user`` is who loses it (``system:serviceaccount:ml:ml-dev-env`` for a ServiceAccount).
    """

    verb: str
    resource: str
    namespace: str = "*"
    user: str = "*"


@dataclass(frozen=True)
class Request:
    """What an authorizer decides on: a request's attributes, or an access review's ``resourceAttributes``."""

    user: str
    verb: str
    group: str
    resource: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""

    @classmethod
    def from_review(cls, user: str, attributes: Mapping[str, Any]) -> Request:
        """The request an access review asks about."""
        return cls(user, *(str(attributes.get(k) or "") for k in
                           ("verb", "group", "resource", "namespace", "name", "subresource")))

    def matches(self, rule: Deny) -> bool:
        """Whether ``rule`` takes this request away."""
        kind, _, name = rule.resource.partition("/")
        qualified = f"{self.resource}.{self.group}" if self.group else self.resource
        return (rule.verb in ("*", self.verb) and kind in ("*", self.resource, qualified)
                and name in ("", self.name) and rule.namespace in ("*", self.namespace)
                and rule.user in ("*", self.user))

    def refusal(self) -> str:
        """The RBAC authorizer's words for refusing this request."""
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        scope = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        return f'User "{self.user}" cannot {self.verb} resource "{resource}" in API group "{self.group}" {scope}'


def allowed(request: Request, forbidden_namespaces: Iterable[str], denied: Iterable[Deny | tuple[str, ...]],
            rules: Iterable[Mapping[str, Any]] | None = None) -> bool:
    """Whether ``request`` is allowed (plain tuples count as :class:`Deny` rules); ``rules``: None for the admin
    model, else the RBAC rules granted to the caller (:func:`granted_rules`), one of which must allow it."""
    if request.namespace and request.namespace in forbidden_namespaces:
        return False
    if rules is not None and not any(rule_allows(rule, request) for rule in [*BASIC_USER_RULES, *rules]):
        return False
    return not any(request.matches(Deny(*rule)) for rule in denied)


BASIC_USER_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
     "verbs": ["create"]},
    {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]},
)
"""What the ``system:basic-user`` ClusterRole grants every authenticated user."""


def groups(user: str) -> list[str]:
    """The groups a user is in: a ServiceAccount's ``system:serviceaccounts[:NS]``, and everyone's
    ``system:authenticated``."""
    prefix, _, rest = user.partition("system:serviceaccount:")
    namespace = rest.partition(":")[0] if not prefix and rest else ""
    return [*(["system:serviceaccounts", f"system:serviceaccounts:{namespace}"] if namespace else []),
            "system:authenticated"]


def _subject_is(subject: Mapping[str, Any], user: str, binding_namespace: str) -> bool:
    """Whether a RoleBinding subject names ``user`` (a ServiceAccount subject's namespace defaults to the
    binding's, as in RBAC)."""
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        return user == f"system:serviceaccount:{subject.get('namespace') or binding_namespace}:{name}"
    return (kind == "User" and name == user) or (kind == "Group" and name in groups(user))


def granted_rules(user: str, bindings: Iterable[Mapping[str, Any]],
                  role: Callable[[str], Mapping[str, Any] | None]) -> list[Mapping[str, Any]]:
    """The rules of the Roles (``role(name)``, of the bindings' namespace) that ``bindings`` grant ``user``; a
    binding to a missing Role, or to a ClusterRole (not served), grants nothing."""
    rules: list[Mapping[str, Any]] = []
    for binding in bindings:
        ref, namespace = binding.get("roleRef") or {}, binding["metadata"].get("namespace", "")
        if ref.get("kind") != "Role" or not any(_subject_is(s, user, namespace) for s in binding.get("subjects") or []):
            continue
        found = role(str(ref.get("name")))
        rules += (found or {}).get("rules") or []
    return rules


def rule_allows(rule: Mapping[str, Any], request: Request) -> bool:
    """Whether an RBAC PolicyRule allows ``request``, as RBAC matches one: verbs, apiGroups, resources
    (``pods/log``, ``*/scale``, ``pods/*``), and ``resourceNames``, which only a request naming an object can
    match: never create or deletecollection; a list or watch only with a ``metadata.name=`` field selector."""
    resource = f"{request.resource}/{request.subresource}" if request.subresource else request.resource
    resources = rule.get("resources") or []
    names = rule.get("resourceNames") or []
    return (any(v in ("*", request.verb) for v in rule.get("verbs") or [])
            and any(g in ("*", request.group) for g in rule.get("apiGroups") or [])
            and any(r in ("*", resource) or (request.subresource and r in (f"*/{request.subresource}",
                                                                            f"{request.resource}/*"))
                    for r in resources)
            and (not names or request.name in names))


def review(rt: ResourceType, body: Any, is_allowed: bool) -> dict[str, Any]:
    """A (Self)SubjectAccessReview answer: the request echoed with the decision."""
    answer = copy.deepcopy(body) if isinstance(body, dict) else {}
    answer.update(kind=rt.kind, apiVersion=rt.api_version)
    answer.setdefault("metadata", {})["creationTimestamp"] = now_iso()
    answer["status"] = {"allowed": True, "reason": ALLOWED_REASON} if is_allowed else {"allowed": False}
    return answer


def self_subject_review(user: str) -> dict[str, Any]:
    """A SelfSubjectReview answer: who the caller is."""
    return {
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": now_iso()},
        "status": {"userInfo": {"username": user, "groups": groups(user)}},
    }
