"""`TaskTool`: one job's description, shared by the web side and the worker side.

Schema, argument validation and result conversion come from the SDK's own function metadata, so a task
tool takes and returns exactly what the same function would as a plain MCP tool (its context hidden).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from mcp.server.mcpserver.tools import Tool
from pydantic import ValidationError

from celery_mcp_tasks.mcp.wire import json_integer
from celery_mcp_tasks.model import MAX_TOOL_NAME
from celery_mcp_tasks.protocol import NEEDS

TaskMode = Literal["optional", "required", "forbidden"]
_MODES = ("optional", "required", "forbidden")


def _whole(value: Any) -> bool:
    """A whole number >= 1 (`3.6e6` is one too; a bool or a string of digits is not)."""
    return json_integer(value) and value >= 1


Prepare = Callable[[dict[str, Any], Mapping[str, Any]], Awaitable[Any]]
"""Web-side hook run before the task exists: `(arguments, input_responses)` ->
extra arguments (a dict) or an SDK `InputRequiredResult` to ask the client first."""


IdempotencyKey = Callable[[dict[str, Any]], str] | Literal["arguments"]
"""How a tool derives an idempotency key when the client sends none: from its arguments by a
function, or "arguments" (the whole arguments, canonical JSON, hashed)."""


def find_context_parameter(fn: Callable[..., Any], context_type: type | None) -> str | None:
    """The parameter annotated with the job's context class (handed in by the composition root)."""
    if context_type is None:
        return None
    for name, parameter in inspect.signature(fn, eval_str=True).parameters.items():
        if isinstance(parameter.annotation, type) and issubclass(parameter.annotation, context_type):
            return name
    return None


def _public_signature(fn: Callable[..., Any], hidden: str | None, *, bound: bool = False) -> inspect.Signature:
    """The tool's arguments: without the context parameter, and without `self` for a `bind=True` job."""
    signature = inspect.signature(fn, eval_str=True)
    parameters = [p for n, p in signature.parameters.items() if n != hidden]
    return signature.replace(parameters=parameters[1:] if bound else parameters)


@dataclass
class TaskTool:
    fn: Callable[..., Any]
    name: str
    description: str
    mode: TaskMode = "optional"
    needs: frozenset[str] = frozenset()
    ttl_ms: int | Literal["default"] | None = "default"
    poll_interval_ms: int | Literal["default"] | None = "default"
    sync_timeout_s: float | None = None
    prepare: Prepare | None = None
    celery_name: str = field(default="", init=False)  # the job's, once Celery named it
    bound: bool = False  # `bind=True`: Celery passes the job (`self`) first, e.g. for `self.retry()`
    terminate: bool = False  # tasks/cancel also terminates a running job (prefork pools; best effort)
    max_sends: int | None = None  # sends of one run before a lost job fails; None: the setting
    # Payload limits in bytes of compact JSON; None: the setting (MCP_TASKS_MAX_ARGUMENTS_BYTES, ...).
    max_arguments_bytes: int | None = None
    max_answer_bytes: int | None = None
    max_result_bytes: int | None = None
    context_type: type | None = None  # the job's context class; its parameter is hidden from the schema
    context_param: str | None = field(default=None, init=False)
    max_active: int | None = None  # unfinished tasks of this tool per principal; None: the setting
    idempotency_key: IdempotencyKey | None = None
    sdk_tool: Tool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < len(self.name) <= MAX_TOOL_NAME:  # every call of it would fail in the store's INSERT
            shown = self.name if len(self.name) <= 40 else self.name[:40] + "\u2026"
            raise ValueError(
                f"task tool {shown!r}: its name must have 1 to {MAX_TOOL_NAME} characters, it has {len(self.name)}"
            )
        if self.mode not in _MODES:
            raise ValueError(f"task tool {self.name!r}: mode must be one of {_MODES}, got {self.mode!r}")
        unknown = set(self.needs) - NEEDS
        if unknown:
            raise ValueError(f"task tool {self.name!r}: unknown client capabilities in needs: {sorted(unknown)}")
        if inspect.iscoroutinefunction(self.fn):
            raise TypeError(f"task tool {self.name!r}: Celery jobs are synchronous; define it with `def`")
        prepare = self.prepare
        if prepare is not None and not (
            inspect.iscoroutinefunction(prepare) or inspect.iscoroutinefunction(type(prepare).__call__)
        ):
            raise TypeError(f"task tool {self.name!r}: prepare runs in the web process's loop; define it `async def`")
        for option in ("max_sends", "max_active", "ttl_ms", "poll_interval_ms"):
            value = getattr(self, option)
            if value is None or (value == "default" and option in ("ttl_ms", "poll_interval_ms")):
                continue
            if not _whole(value):
                raise ValueError(
                    f"task tool {self.name!r}: {option} must be a whole number >= 1 (or None), got {value!r}"
                )
            setattr(self, option, int(value))  # 3.6e6 is an hour's milliseconds too
        timeout = self.sync_timeout_s
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < math.inf
        ):
            raise ValueError(f"task tool {self.name!r}: sync_timeout_s must be seconds > 0 (or None), got {timeout!r}")
        if self.terminate is None:
            self.terminate = False
        if not isinstance(self.terminate, bool):
            raise ValueError(f"task tool {self.name!r}: terminate must be True or False, got {self.terminate!r}")
        key = self.idempotency_key
        if key is not None and key != "arguments" and not callable(key):
            raise ValueError(
                f"task tool {self.name!r}: idempotency_key must be a function of the arguments or 'arguments'"
            )
        for option in ("max_arguments_bytes", "max_answer_bytes", "max_result_bytes"):
            limit = getattr(self, option)
            if limit is None:
                continue
            if not _whole(limit):
                raise ValueError(f"task tool {self.name!r}: {option} must be a number of bytes >= 1, got {limit!r}")
            setattr(self, option, int(limit))
        self.context_param = find_context_parameter(self.fn, self.context_type)
        try:
            self.sdk_tool = Tool.from_function(self.schema_function(), name=self.name, description=self.description)
        except Exception as exc:
            raise self._schema_error(exc) from exc

    def _schema_error(self, exc: Exception) -> Exception:
        """The SDK's error names neither the tool nor the parameter: find the parameter by trying each alone."""
        signature = _public_signature(self.fn, self.context_param, bound=self.bound)
        for name, parameter in signature.parameters.items():
            probe = self.schema_function()
            probe.__signature__ = signature.replace(parameters=[parameter])  # type: ignore[attr-defined]
            try:
                Tool.from_function(probe, name=self.name, description=self.description)
            except Exception:  # noqa: BLE001 - any SDK failure on this parameter alone names it
                shown = getattr(parameter.annotation, "__qualname__", None) or repr(parameter.annotation)
                module = getattr(parameter.annotation, "__module__", "builtins")
                shown = shown if module == "builtins" else f"{module}.{shown}"
                return TypeError(
                    f"task tool {self.name!r}: parameter {name!r} has a type the MCP SDK cannot make a JSON schema "
                    f"for ({shown}); use JSON-friendly types (str, int, float, bool, lists, dicts, pydantic models)"
                )
        return TypeError(f"task tool {self.name!r}: the MCP SDK cannot make a tool of it: {exc}")

    def schema_function(self) -> Callable[..., Any]:
        """A stand-in with the job's public signature, for the SDK to derive the tool from."""
        spec_name = self.name

        def stand_in(**_: Any) -> Any:
            raise RuntimeError(f"task tool {spec_name!r} runs as a Celery job, not in the web process")

        stand_in.__name__ = self.fn.__name__
        stand_in.__qualname__ = self.fn.__qualname__
        stand_in.__module__ = self.fn.__module__
        stand_in.__doc__ = self.fn.__doc__
        stand_in.__signature__ = _public_signature(self.fn, self.context_param, bound=self.bound)  # type: ignore[attr-defined]
        return stand_in

    @property
    def input_schema(self) -> dict[str, Any]:
        return self.sdk_tool.parameters

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments for the job. Raises `pydantic.ValidationError`."""
        return self.sdk_tool.fn_metadata.validate_arguments(dict(arguments))

    def invalid_fields(self, exc: ValidationError) -> list[str]:
        return sorted({".".join(str(part) for part in err["loc"]) or "(arguments)" for err in exc.errors()})

    def to_result(self, value: Any) -> dict[str, Any]:
        """The CallToolResult the same function would return synchronously, as wire JSON."""
        result = self.sdk_tool.fn_metadata.convert_result(value)
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)

    def derived_idempotency_key(self, arguments: Mapping[str, Any]) -> str | None:
        """The key this tool derives from `arguments` (None: it derives none). TypeError for a bad one."""
        if self.idempotency_key is None:
            return None
        if self.idempotency_key == "arguments":
            canonical = json.dumps(dict(arguments), sort_keys=True, separators=(",", ":"), default=str)
            return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
        key = self.idempotency_key(dict(arguments))
        if not isinstance(key, str) or not key:
            raise TypeError(f"task tool {self.name!r}: idempotency_key returned {type(key).__name__}, not a string")
        return key

    def job_signature(self) -> inspect.Signature:
        """What Celery checks `.delay()` against: the function without its context parameter."""
        return _public_signature(self.fn, self.context_param)


TOOL_OPTIONS = frozenset(f.name for f in fields(TaskTool) if f.init) - {"fn", "bound", "context_type"}
"""The `@mcp_task` keywords that describe the tool (its typed overload names them); the others go to Celery."""
