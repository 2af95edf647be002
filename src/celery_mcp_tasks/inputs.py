"""Builders for the input a task can ask for mid-flight (`input_required`).

Each builder returns the wire form of one `inputRequests` value, checked
against the SDK's own request models, so a typo in a schema is an error in the
job that made it rather than a broken `tasks/get` for the client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp_types import CreateMessageRequest, ElicitRequest, ListRootsRequest
from pydantic import TypeAdapter, ValidationError

__all__ = ["InvalidInputRequest", "elicit", "list_roots", "required_capabilities", "sample", "validate_input_requests"]

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_REQUEST = TypeAdapter(ElicitRequest | CreateMessageRequest | ListRootsRequest)
_CAPABILITY = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling", "roots/list": "roots"}


class InvalidInputRequest(ValueError):
    """An input request that is not a valid elicitation, sampling or roots request."""


def _property(spec: Any) -> dict[str, Any]:
    if isinstance(spec, Mapping):
        return dict(spec)
    if spec in _JSON_TYPES:
        return {"type": _JSON_TYPES[spec]}
    raise InvalidInputRequest(f"unsupported elicitation field type {spec!r}; use str, int, float, bool or a schema")


def elicit(message: str, fields: Mapping[str, Any], *, required: list[str] | None = None) -> dict[str, Any]:
    """A form elicitation. `fields` maps names to `str`/`int`/`float`/`bool` or a flat JSON schema.

    Every field is required unless `required` says otherwise.
    """
    properties = {name: _property(spec) for name, spec in fields.items()}
    schema = {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else list(required),
    }
    return _checked({"method": "elicitation/create", "params": {"message": message, "requestedSchema": schema}})


def sample(prompt: str | list[dict[str, Any]], *, max_tokens: int, **params: Any) -> dict[str, Any]:
    """A sampling request: a text prompt (or full messages) and the token bound the spec requires."""
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": {"type": "text", "text": prompt}}]
    return _checked(
        {"method": "sampling/createMessage", "params": {"messages": messages, "maxTokens": max_tokens, **params}}
    )


def list_roots() -> dict[str, Any]:
    return _checked({"method": "roots/list", "params": {}})


def _checked(request: dict[str, Any]) -> dict[str, Any]:
    try:
        _REQUEST.validate_python(request)
    except ValidationError as exc:
        raise InvalidInputRequest(f"invalid input request: {exc.error_count()} problem(s): {exc.errors()[0]['msg']}") from None
    return request


def validate_input_requests(requests: Mapping[str, Any]) -> dict[str, Any]:
    """Check a whole `inputRequests` map: non-empty, string keys, each value a valid request."""
    if not requests:
        raise InvalidInputRequest("require_input needs at least one input request")
    checked: dict[str, Any] = {}
    for key, request in requests.items():
        if not isinstance(key, str) or not key:
            raise InvalidInputRequest("input request keys must be non-empty strings")
        if not isinstance(request, Mapping):
            raise InvalidInputRequest(f"input request {key!r} must be a mapping; build it with elicit/sample/list_roots")
        checked[key] = _checked(dict(request))
    return checked


def required_capabilities(requests: Mapping[str, Any]) -> set[str]:
    """The client capabilities a set of input requests needs (elicitation, sampling, roots)."""
    return {_CAPABILITY[r["method"]] for r in requests.values() if r.get("method") in _CAPABILITY}
