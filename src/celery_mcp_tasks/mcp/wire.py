"""Wire helpers for the tasks methods: errors with the right codes, strict checks of what the SDK parses
leniently, and the `Mcp-Name` routing-header rule the SDK does not know for `tasks/*`."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    RelatedTaskMetadata,
    RequestParams,
)
from pydantic import BaseModel, Field, ValidationError

from celery_mcp_tasks.protocol import (
    EXTENSION_ID,
    IDEMPOTENCY_META_KEY,
    MAX_IDEMPOTENCY_KEY,
    QUOTA_EXCEEDED,
    TASKS_VERSIONS,
)
from celery_mcp_tasks.sdk_internals import decode_routing_name
from celery_mcp_tasks.store.base import QuotaExceeded, StoreUnavailable

logger = logging.getLogger("celery_mcp_tasks.mcp")

MAX_MS = 2**53 - 1  # the longest duration a `task` field may name: an exact integer in every JSON parser
RELATED_TASK_META_KEY = "io.modelcontextprotocol/related-task"


class TaskIdParams(RequestParams):
    # Any JSON here: a taskId missing or not a string is answered with our -32602 naming it (`task_id_of`).
    task_id: Any = Field(default=None, alias="taskId")


class UpdateParams(TaskIdParams):
    # Any JSON here: a non-object must be answered with our -32602, not a generic one.
    input_responses: Any = Field(default=None, alias="inputResponses")


def declared_extension(ctx: ServerRequestContext[Any, Any]) -> bool:
    """The request may be answered with a task: a 2026-07-28 request that declared the extension.

    An earlier era can name the extension in `initialize`, but its `tools/call` result has no task shape
    (the SDK rejects a `CreateTaskResult` there): the era decides.
    """
    if ctx.protocol_version not in TASKS_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    extensions = capabilities.extensions if capabilities else None
    return extensions is not None and EXTENSION_ID in extensions


def declared_capability(ctx: ServerRequestContext[Any, Any], name: str) -> bool:
    """Whether the client declared capability `name`; a dotted one (`elicitation.url`) within its parent. Plain
    `elicitation` is forms: declared as `{}` (forms only, the spec's reading of an empty object) or with `form`,
    not by a client declaring `url` alone."""
    found: Any = ctx.session.client_capabilities
    for part in name.split("."):
        found = getattr(found, part, None)
    if name == "elicitation" and found is not None:
        return getattr(found, "form", None) is not None or getattr(found, "url", None) is None
    return found is not None


def required_capabilities(names: Iterable[str]) -> dict[str, Any]:
    """`data.requiredCapabilities` naming `names` (`elicitation.url` as `{"elicitation": {"url": {}}}`)."""
    required: dict[str, Any] = {}
    for name in names:
        parent, _, child = name.partition(".")
        required.setdefault(parent, {})
        if child:
            required[parent][child] = {}
    return required


def plain_responses(responses: Mapping[str, Any] | None) -> dict[str, Any]:
    """`inputResponses` as the store keeps them: each answer as plain JSON (the SDK parses them into models)."""
    return {
        key: value.model_dump(by_alias=True, mode="json", exclude_none=True) if isinstance(value, BaseModel) else value
        for key, value in (responses or {}).items()
    }


def json_integer(value: Any) -> bool:
    """A JSON integer: an int (not a bool), or a number with no fraction (`1000.0` is an integer to JSON Schema)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def check_task_fields(params: Mapping[str, Any] | None, *, legacy_task: bool) -> None:
    """-32602 for a task tool's `tools/call` whose task fields are malformed, as the client sent them.

    The SDK parses `task` and `_meta` leniently (`"5"` and `true` pass as integers, a negative or
    80-digit `ttl` passes, `true` passes as a progress token, `related-task` is kept as it is): a
    malformed field is the client's mistake and is answered as one, before anything is asked or
    created. `legacy_task`: whether `task` means anything (on 2026-07-28 it MUST be ignored).
    """
    if not params:
        return
    task = params.get("task") if legacy_task else None
    if task is not None:
        if not isinstance(task, Mapping):
            raise invalid_params("Invalid task: expected an object")
        ttl = task.get("ttl")
        if ttl is not None and not (json_integer(ttl) and 0 <= ttl <= MAX_MS):
            raise invalid_params(f"Invalid task: ttl must be an integer from 0 to {MAX_MS} (milliseconds)")
    meta = params.get("_meta")
    if not isinstance(meta, Mapping):
        return  # absent, or not an object: the SDK's own -32602
    token = meta.get("progressToken")
    if token is not None and not (isinstance(token, str) or json_integer(token)):
        raise invalid_params("Invalid _meta: progressToken must be a string or an integer")
    related = meta.get(RELATED_TASK_META_KEY)
    if related is not None:
        try:
            RelatedTaskMetadata.model_validate(related, strict=True)
        except ValidationError:
            raise invalid_params(
                f"Invalid _meta: {RELATED_TASK_META_KEY} must be an object with a taskId string"
            ) from None


def idempotency_key_of(params: Mapping[str, Any] | None) -> str | None:
    """The `_meta` idempotency key the client sent (None: none), or -32602 naming the field."""
    meta = params.get("_meta") if params else None
    if not isinstance(meta, Mapping) or IDEMPOTENCY_META_KEY not in meta:
        return None
    key = meta[IDEMPOTENCY_META_KEY]
    if not isinstance(key, str) or not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
        raise invalid_params(
            f"Invalid _meta: {IDEMPOTENCY_META_KEY} must be a string of 1 to {MAX_IDEMPOTENCY_KEY} characters"
        )
    return key


def quota_exceeded(exc: QuotaExceeded, tool: str) -> MCPError:
    """The caller's refusal: which limit, and when a retry can succeed. It never names the caller."""
    data: dict[str, Any] = {"limit": exc.limit, "allowed": exc.allowed, "retryAfterMs": exc.retry_after_ms}
    if exc.limit == "creations":
        data["windowMs"] = exc.window_ms
        seconds = f"{exc.window_ms / 1000:g}"
        assert exc.retry_after_ms is not None
        message = (
            f"Rate limit reached: at most {exc.allowed} new tasks per {seconds} s per caller;"
            f" retry in {exc.retry_after_ms / 1000:.1f} s"
        )
    else:
        what = f"unfinished tasks of tool {tool}" if exc.limit == "active_tool" else "unfinished tasks"
        message = f"Quota reached: at most {exc.allowed} {what} per caller; retry once one of them has finished"
    return MCPError(code=QUOTA_EXCEEDED, message=message, data=data)


def row_cap_reached(allowed: int | None) -> MCPError:
    """The store holds as many tasks as the server allows (`MCP_TASKS_MAX_ROWS`): a server's condition, not the
    caller's mistake (-32603), said with the setting and the limit's data a quota refusal carries."""
    held = (
        "the server's task store is full"
        if allowed is None
        else f"the server stores at most {allowed} task{'s' * (allowed != 1)}"
    )
    return MCPError(
        code=INTERNAL_ERROR,
        message=f"Task limit reached: {held} (MCP_TASKS_MAX_ROWS); retry once older tasks expire",
        data={"limit": "max_rows", "allowed": allowed, "retryAfterMs": None},
    )


def streams_quota_reached(allowed: int) -> MCPError:
    """A listen stream refused by the caller's stream quota (`MCP_TASKS_QUOTA_STREAMS`): never names the caller."""
    return MCPError(
        code=QUOTA_EXCEEDED,
        message=f"Quota reached: at most {allowed} open listen streams per caller; retry once one of them has closed",
        data={"limit": "streams", "allowed": allowed, "retryAfterMs": None},
    )


def missing_capability(required: dict[str, Any], what: str) -> MCPError:
    return MCPError(
        code=MISSING_REQUIRED_CLIENT_CAPABILITY,
        message=f"Missing required client capability: {what}",
        data={"requiredCapabilities": required},
    )


def missing_extension(what: str = EXTENSION_ID) -> MCPError:
    return missing_capability({"extensions": {EXTENSION_ID: {}}}, what)


def task_id_of(params: TaskIdParams) -> str:
    """`params.taskId`, or -32602 naming it when it is missing or not a string (before the routing name's check,
    which compares a string)."""
    if not isinstance(params.task_id, str):
        raise invalid_params("Invalid params: taskId must be a string")
    return params.task_id


def require_routing_name(ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
    """`Mcp-Name` must be present and equal `params.taskId` on HTTP (-32020 otherwise)."""
    request = ctx.request
    headers = getattr(request, "headers", None)
    if headers is None:
        return  # not HTTP (in-process or stdio): there are no routing headers to check
    raw = headers.get("mcp-name")
    if raw is None:
        raise MCPError(code=HEADER_MISMATCH, message="Missing Mcp-Name header; it must equal params.taskId")
    if decode_routing_name(raw) != task_id:
        raise MCPError(code=HEADER_MISMATCH, message="Mcp-Name header does not match params.taskId")


def invalid_params(message: str) -> MCPError:
    return MCPError(code=INVALID_PARAMS, message=message)


def internal(message: str) -> MCPError:
    return MCPError(code=INTERNAL_ERROR, message=message)


def store_unavailable(method: str, exc: StoreUnavailable, *, logged: bool = True) -> MCPError:
    """-32603 with a fixed message (never the database's text, which quotes SQL, as the SDK's fallback would
    send on earlier eras: `str(exc)`), and (when `logged`) one log line naming the method, the store operation
    and the failure's `reason`."""
    if logged:
        logger.error(
            "%s: the task store is unavailable (%s failed: %s; MCP_TASKS_DATABASE_URL)",
            method,
            exc.operation or "store",
            exc.reason or "unknown",
        )
    return MCPError(code=INTERNAL_ERROR, message=StoreUnavailable.MESSAGE)
