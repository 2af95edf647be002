"""Core (non-tasks) fixtures for the official MCP conformance suite, protocol 2026-07-28.

The suite's server scenarios call tools, prompts and resources by fixed names and
check exact texts, keys and shapes (the suite's scenario sources say which).  This module
registers all of them on an existing SDK `MCPServer`, using only the SDK's own
mechanisms: decorators, `Context`, hand-built `InputRequiredResult`s whose plaintext
`requestState` is sealed by the SDK's `RequestStateBoundary`, the subscription bus
behind `ctx.notify_*_changed()`, and `MCPError` for -32021.

Call `register_core_fixtures(mcp)` before registering any other tool: the suite's
header scenarios call the *first* listed tool with `{}` and it must be
`test_simple_text`.  The tasks fixtures live elsewhere.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import wave
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

import anyio
from mcp.server.mcpserver import Context, UserMessage
from mcp.shared.exceptions import MCPError
from mcp_types import (
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    AudioContent,
    CallToolResult,
    ClientCapabilities,
    Completion,
    CompletionArgument,
    CompletionContext,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    EmbeddedResource,
    ImageContent,
    InputRequest,
    InputRequiredResult,
    ListRootsRequest,
    ListRootsResult,
    MissingRequiredClientCapabilityErrorData,
    PromptReference,
    ResourceTemplateReference,
    SamplingMessage,
    TextContent,
    TextResourceContents,
)
from pydantic import Field

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

# A 1x1 PNG and a few milliseconds of silent 8 kHz mono WAV.
PNG_BYTES = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
PNG_B64 = base64.b64encode(PNG_BYTES).decode()


def _silent_wav(frames: int = 80) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(8000)
        wav.writeframes(b"\x00\x00" * frames)
    return buf.getvalue()


WAV_B64 = base64.b64encode(_silent_wav()).decode()

# The canonical JSON Schema 2020-12 input schema the `json-schema-2020-12` scenario checks verbatim.
JSON_SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}

InputCapability = Literal["elicitation", "sampling", "roots"]
"""The client capabilities an InputRequiredResult's requests depend on."""

COMPLETIONS = {
    "arg1": ["test1", "test2", "testValue1", "value1"],
    "arg2": ["test3", "test4", "testValue2", "value2"],
}


# --- helpers for repeated shapes -------------------------------------------------------------


def _image() -> ImageContent:
    return ImageContent(type="image", data=PNG_B64, mime_type="image/png")


def _resource(uri: str, text: str, mime_type: str = "text/plain") -> EmbeddedResource:
    return EmbeddedResource(type="resource", resource=TextResourceContents(uri=uri, mime_type=mime_type, text=text))


def _elicit(message: str, **fields: str) -> ElicitRequest:
    """A form elicitation asking for the given `name=json_type` fields, all required."""
    schema = {"type": "object", "properties": {k: {"type": t} for k, t in fields.items()}, "required": list(fields)}
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


def _sample(prompt: str, max_tokens: int) -> CreateMessageRequest:
    message = SamplingMessage(role="user", content=TextContent(type="text", text=prompt))
    return CreateMessageRequest(params=CreateMessageRequestParams(messages=[message], max_tokens=max_tokens))


def _ask(requests: dict[str, InputRequest], state: str | None = None) -> InputRequiredResult:
    """An MRTR round. `state` is plaintext: the SDK's RequestStateBoundary seals it on the way out
    and verifies/unseals the client's echo (tampering -> -32602) before the handler sees it."""
    return InputRequiredResult(input_requests=requests, request_state=state)


def _response(ctx: Context, key: str) -> Any:
    return (ctx.input_responses or {}).get(key)


def _accepted(ctx: Context, key: str) -> dict[str, Any] | None:
    """The accepted form content answering `key`, or None if unanswered, declined or malformed."""
    answer = _response(ctx, key)
    if isinstance(answer, ElicitResult) and answer.action == "accept" and answer.content is not None:
        return answer.content
    return None


def _sampled_text(ctx: Context, key: str) -> str | None:
    answer = _response(ctx, key)
    if not isinstance(answer, CreateMessageResult | CreateMessageResultWithTools):
        return None
    blocks = answer.content if isinstance(answer.content, list) else [answer.content]
    return " ".join(b.text for b in blocks if isinstance(b, TextContent))


def _roots(ctx: Context, key: str) -> ListRootsResult | None:
    answer = _response(ctx, key)
    return answer if isinstance(answer, ListRootsResult) else None


def _declares(ctx: Context, capability: InputCapability) -> bool:
    caps = ctx.client_capabilities
    return caps is not None and getattr(caps, capability) is not None


def _require(ctx: Context, capability: InputCapability) -> None:
    """Raise -32021 (HTTP 400) with `requiredCapabilities: {<capability>: {}}` unless declared."""
    if _declares(ctx, capability):
        return
    required = ClientCapabilities.model_validate({capability: {}})
    data = MissingRequiredClientCapabilityErrorData(required_capabilities=required)
    raise MCPError(
        code=MISSING_REQUIRED_CLIENT_CAPABILITY,
        message=f"This tool requires the client capability {capability!r}",
        data=data.model_dump(by_alias=True, mode="json", exclude_none=True),
    )


# --- registration ---------------------------------------------------------------------------


def register_core_fixtures(mcp: MCPServer) -> None:
    """Register every 2026-07-28 core conformance fixture on `mcp` (tools first, in suite order)."""
    _register_content_tools(mcp)
    _register_protocol_tools(mcp)
    _register_input_required_tools(mcp)
    _register_resources(mcp)
    _register_prompts(mcp)


def _tool(mcp: MCPServer, description: str):
    # Unstructured output: these fixtures answer with plain content blocks, no outputSchema.
    return mcp.tool(description=description, structured_output=False)


def _register_content_tools(mcp: MCPServer) -> None:
    @_tool(mcp, "Returns a simple text response")
    def test_simple_text() -> str:
        return "This is a simple text response for testing."

    @_tool(mcp, "Returns a base64-encoded PNG image")
    def test_image_content() -> ImageContent:
        return _image()

    @_tool(mcp, "Returns a base64-encoded WAV audio clip")
    def test_audio_content() -> AudioContent:
        return AudioContent(type="audio", data=WAV_B64, mime_type="audio/wav")

    @_tool(mcp, "Returns an embedded text resource")
    def test_embedded_resource() -> EmbeddedResource:
        return _resource("test://embedded-resource", "This is an embedded resource content.")

    @_tool(mcp, "Returns text, image and embedded resource content together")
    def test_multiple_content_types() -> list[TextContent | ImageContent | EmbeddedResource]:
        data = _resource("test://mixed-content-resource", '{"test":"data","value":123}', "application/json")
        return [TextContent(type="text", text="Multiple content types test:"), _image(), data]

    @_tool(mcp, "Reports progress 0, 50 and 100 (of 100) when the request carries a progressToken")
    async def test_tool_with_progress(ctx: Context) -> str:
        for step in (0, 50, 100):
            await ctx.report_progress(step, 100, f"Step {step // 50 + 1} of 3")
            if step < 100:
                await anyio.sleep(0.05)
        return "Progress test completed"

    @_tool(mcp, "Always returns a tool error result (isError: true)")
    def test_error_handling() -> CallToolResult:
        text = TextContent(type="text", text="This tool intentionally returns an error for testing")
        return CallToolResult(content=[text], is_error=True)

    @_tool(mcp, "Declares a JSON Schema 2020-12 input schema ($defs, $anchor, allOf/anyOf, if/then/else)")
    def json_schema_2020_12_tool(
        name: str | None = None,
        address: dict[str, Any] | None = None,
        contactMethod: str | None = None,
        phone: str | None = None,
        email: str | None = None,
    ) -> str:
        return f"Received: name={name!r}, contactMethod={contactMethod!r}"

    # MCPServer derives inputSchema from the signature (pydantic, no 2020-12 keywords), and the
    # decorator takes no schema override: publish the canonical schema on the registered Tool.
    # Arguments are still validated against the signature's model.
    tool = mcp._tool_manager.get_tool("json_schema_2020_12_tool")  # pyright: ignore[reportPrivateUsage]
    assert tool is not None
    tool.parameters = copy.deepcopy(JSON_SCHEMA_2020_12)


def _register_protocol_tools(mcp: MCPServer) -> None:
    @_tool(mcp, "Requires the sampling client capability; without it the call fails with -32021")
    def test_missing_capability(ctx: Context) -> str:
        _require(ctx, "sampling")
        return "Success"

    @_tool(mcp, "Requires elicitation; asks one question via InputRequiredResult, never a server request")
    def test_streaming_elicitation(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "elicitation")
        answer = _response(ctx, "confirmation")
        if not isinstance(answer, ElicitResult):
            return _ask({"confirmation": _elicit("Please confirm to continue", confirmed="boolean")})
        return f"Elicitation completed: action={answer.action}"

    @_tool(mcp, "Emits log notifications, only when the request set a logLevel")
    async def test_logging_tool(ctx: Context) -> str:
        # Logging is deprecated at 2026-07-28 (SEP-2577) but the suite still exercises it (the SDK
        # warns once per process). The SDK drops these unless the request's _meta set a logLevel.
        for text in ("Tool execution started", "Tool processing data"):
            await ctx.info(text, logger_name="conformance")  # pyright: ignore[reportDeprecated]
        return "Logging test completed"

    @_tool(mcp, "Publishes notifications/tools/list_changed to listen streams (the list itself is unchanged)")
    async def test_trigger_tool_change(ctx: Context) -> str:
        await ctx.notify_tools_changed()
        return "Tool list change notification sent"

    @_tool(mcp, "Publishes notifications/prompts/list_changed to listen streams (the list itself is unchanged)")
    async def test_trigger_prompt_change(ctx: Context) -> str:
        await ctx.notify_prompts_changed()
        return "Prompt list change notification sent"

    @_tool(mcp, "Echoes its arguments; each is mirrored in an Mcp-Param-* header (x-mcp-header)")
    def test_custom_headers(
        region: Annotated[str, Field(description="Target region", json_schema_extra={"x-mcp-header": "Region"})],
        priority: Annotated[int, Field(description="Priority", json_schema_extra={"x-mcp-header": "Priority"})] = 0,
        verbose: Annotated[bool, Field(description="Verbose", json_schema_extra={"x-mcp-header": "Verbose"})] = False,
    ) -> str:
        return f"region={region}, priority={priority}, verbose={str(verbose).lower()}"


def _register_input_required_tools(mcp: MCPServer) -> None:
    user_name = _elicit("What is your name?", name="string")

    @_tool(mcp, "Asks for the user's name via elicitation (InputRequiredResult key user_name)")
    def test_input_required_result_elicitation(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "elicitation")
        answer = _response(ctx, "user_name")
        if isinstance(answer, ElicitResult) and answer.action != "accept":
            return f"The user chose to {answer.action} the elicitation"
        content = _accepted(ctx, "user_name") or {}
        if not isinstance(content.get("name"), str):
            return _ask({"user_name": user_name})
        return f"Hello, {content['name']}!"

    @_tool(mcp, "Asks the client to sample an LLM (InputRequiredResult key capital_question)")
    def test_input_required_result_sampling(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "sampling")
        if (text := _sampled_text(ctx, "capital_question")) is None:
            return _ask({"capital_question": _sample("What is the capital of France?", 100)})
        return f"The model answered: {text}"

    @_tool(mcp, "Asks the client for its roots (InputRequiredResult key client_roots)")
    def test_input_required_result_list_roots(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "roots")
        if (roots := _roots(ctx, "client_roots")) is None:
            return _ask({"client_roots": ListRootsRequest()})
        return f"Found {len(roots.roots)} root(s)"

    @_tool(mcp, "Asks for confirmation and carries a sealed requestState across the retry")
    def test_input_required_result_request_state(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "elicitation")
        answer = _accepted(ctx, "confirm")
        if ctx.request_state != "request-state:confirm" or answer is None:
            return _ask({"confirm": _elicit("Please confirm", ok="boolean")}, "request-state:confirm")
        return f"state-ok: confirmed={answer.get('ok')}"

    @_tool(mcp, "Asks for elicitation, sampling and roots in one round, with a requestState")
    def test_input_required_result_multiple_inputs(ctx: Context) -> str | InputRequiredResult:
        for capability in get_args(InputCapability):
            _require(ctx, capability)
        name, greeting, roots = _accepted(ctx, "user_name"), _sampled_text(ctx, "greeting"), _roots(ctx, "client_roots")
        if ctx.request_state != "multiple-inputs" or name is None or greeting is None or roots is None:
            requests = {"user_name": user_name, "greeting": _sample("Generate a greeting", 50)}
            return _ask({**requests, "client_roots": ListRootsRequest()}, "multiple-inputs")
        return f"Got name={name.get('name')!r}, greeting={greeting!r}, {len(roots.roots)} root(s)"

    @_tool(mcp, "Two elicitation rounds (step1 name, step2 color), each with a different requestState")
    def test_input_required_result_multi_round(ctx: Context) -> str | InputRequiredResult:
        _require(ctx, "elicitation")
        state = json.loads(ctx.request_state) if ctx.request_state else {}
        if state.get("round") == 2 and (step2 := _accepted(ctx, "step2")) is not None:
            return f"Completed: name={state['name']!r}, color={step2.get('color')!r}"
        if state.get("round") == 1 and (step1 := _accepted(ctx, "step1")) is not None:
            next_state = json.dumps({"round": 2, "name": step1.get("name")})
            return _ask({"step2": _elicit("What is your favourite color?", color="string")}, next_state)
        return _ask({"step1": _elicit("What is your name?", name="string")}, json.dumps({"round": 1}))

    @_tool(mcp, "Asks for confirmation with a sealed requestState; a tampered state is a -32602 error")
    def test_input_required_result_tampered_state(ctx: Context) -> str | InputRequiredResult:
        # Tampering never reaches this body: the SDK's RequestStateBoundary rejects it with -32602.
        _require(ctx, "elicitation")
        if ctx.request_state != "tamper-check" or (answer := _accepted(ctx, "confirm")) is None:
            return _ask({"confirm": _elicit("Please confirm", ok="boolean")}, "tamper-check")
        return f"Confirmed with intact state: ok={answer.get('ok')}"

    @_tool(mcp, "Asks only for the input kinds the client declared (elicitation, sampling, roots)")
    def test_input_required_result_capabilities(ctx: Context) -> str | InputRequiredResult:
        if ctx.input_responses:
            return f"Received {len(ctx.input_responses)} input response(s)"
        requests: dict[str, InputRequest] = {}
        if _declares(ctx, "elicitation"):
            requests["user_name"] = user_name
        if _declares(ctx, "sampling"):
            requests["greeting"] = _sample("Generate a greeting", 50)
        if _declares(ctx, "roots"):
            requests["client_roots"] = ListRootsRequest()
        return _ask(requests) if requests else "No input capabilities declared; nothing to ask"


def _register_resources(mcp: MCPServer) -> None:
    @mcp.resource("test://static-text", name="static-text", description="A static text", mime_type="text/plain")
    def static_text() -> str:
        return "This is the content of the static text resource."

    @mcp.resource("test://static-binary", name="static-binary", description="A static PNG", mime_type="image/png")
    def static_binary() -> bytes:
        return PNG_BYTES

    @mcp.resource(
        "test://template/{id}/data", name="template", description="A templated resource", mime_type="application/json"
    )
    def template(id: str) -> str:
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


def _register_prompts(mcp: MCPServer) -> None:
    @mcp.prompt(description="A simple prompt without arguments")
    def test_simple_prompt() -> str:
        return "This is a simple prompt for testing."

    @mcp.prompt(description="A prompt with two required arguments")
    def test_prompt_with_arguments(
        arg1: Annotated[str, Field(description="First test argument")],
        arg2: Annotated[str, Field(description="Second test argument")],
    ) -> str:
        return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"

    @mcp.prompt(description="A prompt that embeds a resource")
    def test_prompt_with_embedded_resource(
        resourceUri: Annotated[str, Field(description="URI of the resource to embed")],
    ) -> list[UserMessage]:
        embedded = _resource(resourceUri, "Embedded resource content for testing.")
        return [UserMessage(embedded), UserMessage("Please process the embedded resource above.")]

    @mcp.prompt(description="A prompt that includes an image")
    def test_prompt_with_image() -> list[UserMessage]:
        return [UserMessage(_image()), UserMessage("Please analyze the image above.")]

    @mcp.prompt(description="Asks for context via InputRequiredResult before rendering")
    def test_input_required_result_prompt(ctx: Context) -> str | InputRequiredResult:
        answer = _accepted(ctx, "user_context")
        if answer is None or not isinstance(answer.get("context"), str):
            return _ask({"user_context": _elicit("What context should the prompt use?", context="string")})
        return f"Prompt rendered with the provided context: {answer['context']}"

    @mcp.completion()
    async def complete(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion | None:
        if not (isinstance(ref, PromptReference) and ref.name == "test_prompt_with_arguments"):
            return None
        values = [v for v in COMPLETIONS.get(argument.name, []) if v.startswith(argument.value)]
        return Completion(values=values, total=len(values), has_more=False)
