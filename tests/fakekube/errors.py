"""API errors, answered as the ``Status`` objects a real kube-apiserver sends (kubectl prints their message)."""

from __future__ import annotations

from typing import Any

from .resources import ResourceType


class ApiError(Exception):
    """A failed API request: HTTP code, Kubernetes reason and message, rendered by :meth:`status`."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        """The ``Status`` object of this error."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(rt: ResourceType, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"kind": rt.plural}
    if name:
        details["name"] = name
    if rt.group:
        details["group"] = rt.group
    return details


def not_found(rt: ResourceType, name: str) -> ApiError:
    """``pods "x" not found``."""
    return ApiError(404, "NotFound", f'{rt.qualified} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    """``pods "x" already exists``."""
    return ApiError(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', _details(rt, name))


def conflict(rt: ResourceType, name: str) -> ApiError:
    """A stale resourceVersion on update."""
    message = (
        f'Operation cannot be fulfilled on {rt.qualified} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    return ApiError(409, "Conflict", message, _details(rt, name))


def forbidden(rt: ResourceType, name: str, why: str) -> ApiError:
    """``pods "x" is forbidden: <why>`` (or ``pods is forbidden: <why>`` without a name)."""
    subject = f'{rt.qualified} "{name}"' if name else rt.qualified
    return ApiError(403, "Forbidden", f"{subject} is forbidden: {why}", _details(rt, name))


def unauthorized() -> ApiError:
    """A missing or wrong bearer token."""
    return ApiError(401, "Unauthorized", "Unauthorized")


def bad_request(message: str) -> ApiError:
    """A request the fake cannot make sense of."""
    return ApiError(400, "BadRequest", message)


def invalid(rt: ResourceType, name: str, why: str, field: str | None = None) -> ApiError:
    """``StatefulSet.apps "x" is invalid: <why>``; with ``field`` (``why`` then says what is wrong with it) also
    the cause kubectl prints: ``The Pod "x" is invalid: <field>: <why>``."""
    kind = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
    if field is None:
        return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {why}', _details(rt, name))
    details = {**_details(rt, name), "kind": rt.kind,
               "causes": [{"reason": f"FieldValue{why.split(':', 1)[0]}", "message": why, "field": field}]}
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {field}: {why}', details)


def method_not_allowed() -> ApiError:
    """A verb the resource does not support."""
    return ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")


def not_acceptable(accept: str) -> ApiError:
    """An Accept header the fake cannot answer (it only speaks JSON)."""
    return ApiError(406, "NotAcceptable", f"only the following media types are accepted: application/json ({accept})")


def unsupported_media_type(content_type: str) -> ApiError:
    """A request body the fake cannot read (protobuf, CBOR)."""
    return ApiError(415, "UnsupportedMediaType", f'the body of the request was in an unknown format: "{content_type}"')


def path_not_found() -> ApiError:
    """A URL no resource is served at (the real server answers this one with a plain 404 page)."""
    return ApiError(404, "NotFound", "the server could not find the requested resource")
