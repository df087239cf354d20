"""Authorization: everything is allowed but requests in a forbidden namespace and what a :class:`Deny` rule
names. One decision answers both real requests (403 with the RBAC wording) and access reviews
(``kubectl auth can-i``, SubjectAccessReviews)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
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


def allowed(request: Request, forbidden_namespaces: Iterable[str], denied: Iterable[Deny | tuple[str, ...]]) -> bool:
    """Whether ``request`` is allowed (plain tuples count as :class:`Deny` rules)."""
    if request.namespace and request.namespace in forbidden_namespaces:
        return False
    return not any(request.matches(Deny(*rule)) for rule in denied)


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
        "status": {"userInfo": {"username": user, "groups": ["system:authenticated"]}},
    }
