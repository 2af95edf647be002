"""The Tasks extension's wire shapes, shared by both adapters (it imports neither the SDK's server or
client nor Celery): how the domain's task state looks on the wire, and the input requests a job can
ask, checked against `mcp_types` (so a typo in a schema fails the job, not the client's `tasks/get`).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from mcp_types import (
    INTERNAL_ERROR,
    CallToolResult,
    CreateMessageRequest,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ElicitRequest,
    ElicitResult,
    ListRootsRequest,
    ListRootsResult,
    TextContent,
)
from pydantic import BaseModel, TypeAdapter, ValidationError

from celery_mcp_tasks.model import TaskRecord, TaskStatus

EXTENSION_ID = "io.modelcontextprotocol/tasks"
TASKS_VERSIONS = frozenset({"2026-07-28"})
"""The protocol versions the extension is defined for: on them a tool may answer with a task."""
IDEMPOTENCY_META_KEY = "io.github.celery-mcp-tasks/idempotencyKey"
"""A `tools/call` request's `_meta` entry: a short string naming this creation, so a retry of the
same call (same caller, tool and key) gets the first call's task back instead of a second job."""
MAX_IDEMPOTENCY_KEY = 255  # characters
QUOTA_EXCEEDED = -32029
"""The JSON-RPC code of a creation refused by the caller's quota or rate limit (a server-defined
error code); its `data` says which limit and, when known, `retryAfterMs`."""
PROGRESS_META_KEY = "io.github.celery-mcp-tasks/progress"
"""A DetailedTask's `_meta` entry for the job's numeric progress: `{"progress": n, "total": m}` (no total: unknown).

The Tasks extension has no progress field; `_meta` is where an implementation may add one."""


# -- rendering -----------------------------------------------------------------------


def format_timestamp(epoch_ms: int) -> str:
    """`YYYY-MM-DDTHH:MM:SS.mmmZ`, always UTC, always milliseconds."""
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def render_error(error: Mapping[str, Any] | None, fallback: str = "Internal error") -> dict[str, Any]:
    """A stored error as a JSON-RPC error object: `code` (-32603 unless it names one), `message`, `data`."""
    error = dict(error or {})
    rendered: dict[str, Any] = {
        "code": int(error.pop("code", INTERNAL_ERROR)),
        "message": str(error.pop("message", None) or fallback),
    }
    rendered.update(error)
    return rendered


def _task_fields(task_id: str, record: TaskRecord) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "taskId": task_id,
        "status": record.status.value,
        "createdAt": format_timestamp(record.created_at),
        "lastUpdatedAt": format_timestamp(record.updated_at),
        # Never 0: a positive lifetime or null (unlimited).
        "ttlMs": record.ttl_ms if record.ttl_ms and record.ttl_ms > 0 else None,
    }
    if record.poll_interval_ms:
        fields["pollIntervalMs"] = record.poll_interval_ms
    if record.status_message is not None:
        fields["statusMessage"] = record.status_message
    return fields


def _number(value: float) -> int | float:
    """A whole number renders as one (`3`, not `3.0`)."""
    return int(value) if value.is_integer() else value


def render_create_result(task_id: str, record: TaskRecord) -> dict[str, Any]:
    """The flat `CreateTaskResult`: task fields and `resultType: "task"`, nothing else."""
    return {"resultType": "task", **_task_fields(task_id, record)}


def render_task(task_id: str, record: TaskRecord) -> dict[str, Any]:
    """The `DetailedTask`: what `tasks/get` returns (plus `resultType`) and `notifications/tasks` carries.

    With numeric progress it holds `_meta` (`PROGRESS_META_KEY`): a caller adding its own `_meta`
    entries merges them into this one.
    """
    fields = _task_fields(task_id, record)
    if record.status is TaskStatus.INPUT_REQUIRED and record.input_requests:
        fields["inputRequests"] = {key: _as_sent(request) for key, request in record.input_requests.items()}
    elif record.status is TaskStatus.COMPLETED and record.result is not None:
        fields["result"] = record.result
    elif record.status is TaskStatus.FAILED:
        fields["error"] = render_error(record.error)
    if record.progress is not None:
        progress: dict[str, Any] = {"progress": _number(record.progress)}
        if record.progress_total is not None:
            progress["total"] = _number(record.progress_total)
        fields["_meta"] = {PROGRESS_META_KEY: progress}
    return fields


# -- input requests ------------------------------------------------------------------


def _as_sent(request: Any) -> Any:
    """An input request as a 2026-07-28 task carries it: a URL elicitation without its `elicitationId` (the era
    has no such field; the stored request keeps it for a 2025-11-25 synchronous call's `elicitation/create`)."""
    params = request.get("params") if isinstance(request, dict) else None
    if not isinstance(params, dict) or params.get("mode") != "url" or "elicitationId" not in params:
        return request
    return {**request, "params": {name: value for name, value in params.items() if name != "elicitationId"}}


_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_REQUEST = TypeAdapter(ElicitRequest | CreateMessageRequest | ListRootsRequest)
INPUT_CAPABILITIES = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling", "roots/list": "roots"}
"""The client capability each kind of input request needs."""
URL_ELICITATION = "elicitation.url"
"""What a URL-mode elicitation needs: a client declaring `elicitation` alone (`{}`) takes forms only."""
NEEDS = frozenset({*INPUT_CAPABILITIES.values(), URL_ELICITATION})
"""What a task tool's `needs=` may name."""


def capability_of(request: Mapping[str, Any]) -> str | None:
    """The client capability `request` (a wire shape) needs (`INPUT_CAPABILITIES`, `URL_ELICITATION` for a URL-mode
    elicitation), or None for a method of no input kind."""
    method = request.get("method")
    capability = INPUT_CAPABILITIES.get(method) if isinstance(method, str) else None
    params = request.get("params")
    if capability == "elicitation" and isinstance(params, Mapping) and params.get("mode") == "url":
        return URL_ELICITATION
    return capability


def answer_type(request: Mapping[str, Any]) -> type[BaseModel] | None:
    """The result type that answers `request` (a wire shape): an elicitation's `ElicitResult`, a sampling
    request's `CreateMessageResult` (`...WithTools` when it offers tools), roots' `ListRootsResult`; None
    for a method of none of these."""
    method = request.get("method")
    if method == "elicitation/create":
        return ElicitResult
    if method == "roots/list":
        return ListRootsResult
    if method == "sampling/createMessage":
        params = request.get("params") or {}
        return CreateMessageResultWithTools if "tools" in params or "toolChoice" in params else CreateMessageResult
    return None


def answers(request: Mapping[str, Any], answer: Any) -> bool:
    """Whether `answer` answers `request` (`answer_problem` finds nothing)."""
    return answer_problem(request, answer) is None


def answer_problem(request: Mapping[str, Any], answer: Any) -> str | None:
    """Why `answer` is not a result of the kind `request` asks for (`answer_type`), or why an accepted form
    elicitation's content does not fit its `requestedSchema`; None when it answers. Such an answer is refused
    (-32602) and its question stays outstanding, so the job never reads a value of a type it did not ask for.
    The reason names fields and what they must be, never a value the client sent."""
    kind = answer_type(request)
    if kind is None:
        return None if isinstance(answer, dict) else "an answer is an object"
    try:
        result = kind.model_validate(answer)
    except ValidationError as exc:
        error = exc.errors()[0]
        if len(error["loc"]) > 1:  # deeper down: a key the client chose, a union's branch: not worth naming
            return f"{error['loc'][0]}: holds a value of another type than the result's"
        return f"{''.join(map(str, error['loc'])) or 'the answer'}: {error['msg']}"  # pydantic's msg quotes no input
    if isinstance(result, ElicitResult) and result.action != "accept" and result.content:
        return f"content: only an accepted answer carries content, not a {result.action}"
    params = request.get("params") or {}
    if isinstance(result, ElicitResult) and result.content and params.get("mode") == "url":  # `{}` or null: none
        return "content: the answer to a URL-mode elicitation carries none (the user gave it to the URL's site)"
    schema = params.get("requestedSchema")
    if isinstance(result, ElicitResult) and result.action == "accept" and isinstance(schema, Mapping):
        return _form_problem(schema, result.content or {})
    return None


def _form_problem(schema: Mapping[str, Any], content: Mapping[str, Any]) -> str | None:
    """Why an accepted form's `content` does not fit its `requestedSchema`, naming only the schema's own fields."""
    from jsonschema.exceptions import best_match  # the SDK's own dependency; loaded on an answer only
    from jsonschema.validators import validator_for

    # An optional field left empty may come as null (the SDK's own client sends it so): as if omitted.
    required = schema.get("required") or ()
    content = {key: value for key, value in content.items() if value is not None or key in required}
    try:
        validator = validator_for(schema)
        validator.check_schema(schema)
        error = best_match(validator(schema).iter_errors(content))
    except Exception:  # noqa: BLE001 - a schema jsonschema cannot read (or resolve) decides nothing
        return None
    if error is None:
        return None
    if error.validator == "required":  # "'name' is a required property": the schema's name, no value
        return f"content: {error.message}"
    field = error.path[0] if error.path else None
    where = f"content.{field}" if field in (schema.get("properties") or {}) else "content"
    if error.validator is None:  # a `false` schema: nothing is allowed there
        return f"{where}: not allowed"
    return f"{where}: must satisfy {error.validator} {json.dumps(error.validator_value, default=str)[:120]}"


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


def elicit_url(message: str, url: str, *, elicitation_id: str | None = None) -> dict[str, Any]:
    """A URL-mode elicitation: the user opens `url` (http or https) to do what the client must not see (a sign-in,
    a payment), then answers accept, decline or cancel, without content; the job learns the outcome from the site
    itself. `elicitation_id`: a fresh random one unless given. A tool asking one declares
    `needs=("elicitation.url",)`, so a client that takes forms only is refused at its call."""
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed IPv6 bracket, ...
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc or not url.isprintable():
        raise InvalidInputRequest("a URL-mode elicitation needs an absolute http or https URL")
    if elicitation_id == "":
        raise InvalidInputRequest("a URL-mode elicitation's id must not be empty")
    eid = elicitation_id if elicitation_id is not None else secrets.token_urlsafe(16)
    params = {"mode": "url", "message": message, "url": url, "elicitationId": eid}
    return _checked({"method": "elicitation/create", "params": params})


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
        raise InvalidInputRequest(
            f"invalid input request: {exc.error_count()} problem(s): {exc.errors()[0]['msg']}"
        ) from None
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
            raise InvalidInputRequest(
                f"input request {key!r} must be a mapping; build it with elicit/sample/list_roots"
            )
        checked[key] = _checked(dict(request))
    return checked


def tool_result(result: Mapping[str, Any] | str) -> dict[str, Any]:
    """`result` as the wire JSON of a CallToolResult, as a job's return value is stored (`resultType` too): a str
    becomes one text block; a mapping is checked against `mcp_types`. ValueError names the fields, never a value."""
    if isinstance(result, str):
        model = CallToolResult(content=[TextContent(type="text", text=result)])
    elif result.get("resultType", "complete") != "complete":
        raise ValueError("not a CallToolResult: check resultType (a result is complete)")
    else:
        try:
            model = CallToolResult.model_validate(result)
        except ValidationError as exc:
            where = sorted({".".join(map(str, error["loc"])) or "the result" for error in exc.errors()})
            raise ValueError(f"not a CallToolResult: check {', '.join(where)}") from None
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)
