"""`celery-mcp-tasks call`'s terminal side without a server: forms asked from a schema, answers typed, exit codes."""

from __future__ import annotations

import io
import json
import os
import re
import socket
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from mcp_types import (
    CallToolResult,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    ElicitResult,
    ErrorData,
    ListRootsResult,
    TextContent,
)
from rich.console import Console

from celery_mcp_tasks.cli.call import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CallError,
    CallIo,
    CallOptions,
    _Interrupts,
    _SdkLines,
    exit_code,
    parse_arguments,
    read_arguments,
    run_call,
)
from celery_mcp_tasks.cli.prompts import FdLines, Prompter, parse_form
from celery_mcp_tasks.cli.views import JsonView, LiveView, PlainView, _StatusLine, result_text
from celery_mcp_tasks.client.models import PROGRESS_META_KEY, TaskState

NO_CONTEXT = cast(Any, None)  # the callbacks never read the request context


class Typed:
    """Lines typed at the prompt, then the end of input."""

    echoed = True

    def __init__(self, *lines: str) -> None:
        self.lines = list(lines)

    async def readline(self) -> str | None:
        return self.lines.pop(0) if self.lines else None


def _prompter(*lines: str) -> tuple[Prompter, io.StringIO, Typed]:
    screen = io.StringIO()
    typed = Typed(*lines)
    console = Console(file=screen, width=100, color_system=None, force_terminal=False)
    return Prompter(console, typed), screen, typed


def _form(message: str, properties: dict[str, Any], required: list[str] | None = None) -> ElicitRequestFormParams:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required is not None:
        schema["required"] = required
    return ElicitRequestFormParams(message=message, requested_schema=schema)


def _elicit(params: ElicitRequestFormParams | ElicitRequestURLParams, *lines: str) -> tuple[Any, str, Typed]:
    prompter, screen, typed = _prompter(*lines)
    answer = anyio.run(prompter.elicit, NO_CONTEXT, params)
    return answer, screen.getvalue(), typed


def _state(status: str = "working", message: str | None = None, **extra: Any) -> TaskState:
    return TaskState.model_validate(
        {
            "taskId": "t-1",
            "status": status,
            "statusMessage": message,
            "createdAt": "2026-01-01T00:00:00Z",
            "lastUpdatedAt": "2026-01-01T00:00:01Z",
            **extra,
        }
    )


# -- the schema, field by field ---------------------------------------------------------------


def test_a_schema_becomes_fields_in_order_with_kinds_defaults_and_required_marked() -> None:
    fields = parse_form(
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "title": "Your name", "minLength": 2},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "ratio": {"type": "number", "default": 0.5},
                "ok": {"type": "boolean", "default": True},
                "size": {"type": "string", "enum": ["s", "m", "l"], "enumNames": ["Small", "Medium", "Large"]},
                "tone": {"type": "string", "oneOf": [{"const": "dry", "title": "Dry"}, {"const": "warm"}]},
                "tags": {"type": "array", "items": {"anyOf": [{"const": "a", "title": "A"}, {"const": "b"}]}},
            },
            "required": ["name", "age"],
        }
    )
    assert [(f.name, f.kind, f.required) for f in fields] == [
        ("name", "string", True),
        ("age", "integer", True),
        ("ratio", "number", False),
        ("ok", "boolean", False),
        ("size", "choice", False),
        ("tone", "choice", False),
        ("tags", "choices", False),
    ]
    assert fields[0].label == "Your name (name)"
    assert fields[2].default == 0.5 and fields[3].default is True
    assert fields[4].choices == (("s", "Small"), ("m", "Medium"), ("l", "Large"))
    assert fields[5].choices == (("dry", "Dry"), ("warm", "warm"))
    assert fields[6].choices == (("a", "A"), ("b", "b"))
    assert fields[1].hint() == "integer 0..150"
    assert fields[2].hint() == "number, Enter: 0.5"
    assert fields[3].hint() == "Y/n"


def test_a_questions_text_reaches_the_terminal_without_control_characters_but_its_lines() -> None:
    """A server's question with an escape sequence would paint or clear the user's screen."""
    params = _form(
        "Line one\x1b[41m\nline two\x07",
        {"pick": {"type": "string", "description": "a\x1b[2Jb", "title": "Pick\x1b[1A"}},
        required=["pick"],
    )
    _, screen, _ = _elicit(params, "", "x")
    assert "\x1b" not in screen and "\x07" not in screen
    assert "Line one [41m\nline two" in screen and "a [2Jb" in screen


def test_an_answered_form_is_accepted_with_each_field_typed_and_checked() -> None:
    params = _form(
        "Tell me about you",
        {
            "name": {"type": "string", "description": "as on your passport"},
            "age": {"type": "integer", "minimum": 0},
            "height": {"type": "number"},
            "ok": {"type": "boolean"},
            "size": {"type": "string", "oneOf": [{"const": "s", "title": "Small"}, {"const": "l", "title": "Large"}]},
            "tags": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "maxItems": 2},
        },
        required=["name", "age", "height", "ok", "size", "tags"],
    )
    answer, screen, typed = _elicit(
        params,
        "",  # Enter: accept
        "",  # a required name: asked again
        "Ada",
        "old",  # not a number: asked again
        "-1",  # below the minimum
        "36",
        "1.7",
        "maybe",
        "yes",
        "large",  # by label
        "1, y, 3, z",  # three picks once de-duplicated: too many, asked again
        "1,3",
    )
    assert answer == ElicitResult(
        action="accept",
        content={"name": "Ada", "age": 36, "height": 1.7, "ok": True, "size": "l", "tags": ["x", "z"]},
    )
    assert not typed.lines
    assert "The task asks: Tell me about you" in screen
    assert "as on your passport" in screen
    assert "required: type a value" in screen
    assert "type a whole number" in screen
    assert "type a number >= 0" in screen
    assert "type y or n" in screen
    assert "pick at most 2" in screen
    assert "1) Small" in screen and "2) Large" in screen
    assert "name *:" in screen


def test_enter_takes_the_default_and_skips_an_optional_field() -> None:
    params = _form(
        "Settings",
        {
            "colour": {"type": "string", "enum": ["red", "green"], "default": "green"},
            "retries": {"type": "integer", "default": 3},
            "verbose": {"type": "boolean", "default": False},
            "note": {"type": "string"},
        },
        required=["colour"],
    )
    answer, screen, _ = _elicit(params, "a", "", "", "", "")
    assert answer == ElicitResult(action="accept", content={"colour": "green", "retries": 3, "verbose": False})
    assert "colour * (1-2, Enter: green):" in screen
    assert "verbose (y/N):" in screen


def test_a_choice_answers_the_schemas_own_value_an_integer_stays_an_integer() -> None:
    params = _form(
        "Pick",
        {
            "level": {"type": "integer", "enum": [1, 2, 3]},
            "ratio": {"type": "number", "oneOf": [{"const": 0.5, "title": "Half"}, {"const": 1, "title": "All"}]},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}},
        },
        required=["level", "ratio", "tags"],
    )
    answer, screen, _ = _elicit(params, "a", "2", "half", "2,1")
    assert answer == ElicitResult(action="accept", content={"level": 2, "ratio": 0.5, "tags": ["y", "x"]})
    assert "1) 1" in screen and "1) Half" in screen


@pytest.mark.parametrize(("typed", "action"), [("d", "decline"), ("decline", "decline"), ("c", "cancel")])
def test_a_question_can_be_declined_or_cancelled_before_any_field(typed: str, action: str) -> None:
    answer, _, remaining = _elicit(_form("Delete it?", {"sure": {"type": "boolean"}}), typed, "unused")
    assert isinstance(answer, ElicitResult) and answer.action == action and answer.content is None
    assert remaining.lines == ["unused"]


def test_an_unknown_action_is_asked_again() -> None:
    answer, screen, _ = _elicit(_form("Go?", {}), "maybe", "a")
    assert answer == ElicitResult(action="accept", content={})
    assert "type a, d or c" in screen


def test_the_end_of_input_dismisses_the_question() -> None:
    answer, screen, _ = _elicit(_form("Your name?", {"name": {"type": "string"}}, ["name"]), "a")
    assert answer == ElicitResult(action="cancel")
    assert "no more input" in screen


def test_string_formats_and_lengths_are_checked() -> None:
    params = _form(
        "Contact",
        {
            "mail": {"type": "string", "format": "email"},
            "site": {"type": "string", "format": "uri"},
            "born": {"type": "string", "format": "date"},
            "code": {"type": "string", "maxLength": 3},
        },
    )
    answer, screen, _ = _elicit(params, "", "ada", "ada@example.org", "example", "https://ex.org", "May", "1815-12-10")
    assert screen.count("type ") >= 3
    assert isinstance(answer, ElicitResult) and answer.action == "cancel"  # input ended at `code`
    answer, _, _ = _elicit(params, "", "a@b.c", "https://x", "2000-01-01", "abcd", "abc")
    assert answer == ElicitResult(
        action="accept", content={"mail": "a@b.c", "site": "https://x", "born": "2000-01-01", "code": "abc"}
    )


def test_a_url_elicitation_asks_consent_to_open_the_url_and_answers_without_content() -> None:
    """URL mode: accepting is agreeing to go there (the spec), not saying it is done; nothing typed comes back."""
    params = ElicitRequestURLParams(message="Sign in", url="https://example.org/login", elicitation_id="e1")
    answer, screen, _ = _elicit(params, "a")
    assert answer == ElicitResult(action="accept")
    assert "https://example.org/login" in screen and "Open it?" in screen and "open it in your browser" in screen
    answer, screen, _ = _elicit(params, "d")
    assert answer == ElicitResult(action="decline") and "open it in your browser" not in screen


# -- sampling and roots -------------------------------------------------------------------------


def _sampling() -> CreateMessageRequestParams:
    return CreateMessageRequestParams.model_validate(
        {
            "messages": [{"role": "user", "content": {"type": "text", "text": "Summarize the plan"}}],
            "systemPrompt": "Be brief",
            "maxTokens": 50,
        }
    )


def test_a_sampling_request_is_answered_by_the_person_as_the_model() -> None:
    prompter, screen, _ = _prompter("It is a good plan.")
    answer = anyio.run(prompter.sample, NO_CONTEXT, _sampling())
    assert answer == CreateMessageResult(
        role="assistant",
        content=TextContent(type="text", text="It is a good plan."),
        model="human",
        stop_reason="endTurn",
    )
    shown = screen.getvalue()
    assert "user: Summarize the plan" in shown and "system: Be brief" in shown and "50 tokens" in shown


@pytest.mark.parametrize("lines", [("",), ()])
def test_an_empty_answer_or_no_input_declines_the_sampling_request(lines: tuple[str, ...]) -> None:
    prompter, _, _ = _prompter(*lines)
    answer = anyio.run(prompter.sample, NO_CONTEXT, _sampling())
    assert isinstance(answer, ErrorData) and answer.code == -1


def test_roots_are_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    prompter, _, _ = _prompter()
    answer = anyio.run(prompter.roots, NO_CONTEXT)
    assert isinstance(answer, ListRootsResult)
    assert [str(root.uri) for root in answer.roots] == [tmp_path.as_uri()]


def test_questions_asked_together_are_asked_one_after_the_other() -> None:
    prompter, screen, _ = _prompter("a", "first", "a", "second")

    async def both() -> list[Any]:
        answers: list[Any] = []

        async def ask(message: str) -> None:
            answers.append(await prompter.elicit(NO_CONTEXT, _form(message, {"v": {"type": "string"}}, ["v"])))

        async with anyio.create_task_group() as group:
            group.start_soon(ask, "One?")
            group.start_soon(ask, "Two?")
        return answers

    answers = anyio.run(both)
    assert sorted(a.content["v"] for a in answers) == ["first", "second"]
    shown = screen.getvalue()
    assert shown.index("v *:", shown.index("One?")) < shown.index("Two?")  # not interleaved


# -- lines from a file descriptor ---------------------------------------------------------------


def test_lines_are_read_from_a_pipe_until_its_end() -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"first\r\nsecond\nlast")
    os.close(write_end)

    async def read_all() -> list[str | None]:
        lines = FdLines(read_end)
        return [await lines.readline() for _ in range(4)]

    try:
        assert anyio.run(read_all) == ["first", "second", "last", None]
    finally:
        os.close(read_end)


def test_a_piped_answer_ends_its_prompts_line_as_a_typed_one_does() -> None:
    """A terminal echoes a typed answer and its newline; a piped one is not shown, so the prompt's line is
    ended for it: the next question or status line does not run on after the prompt."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"a\n")
    os.close(write_end)
    screen = io.StringIO()
    prompter = Prompter(Console(file=screen, width=100, color_system=None, force_terminal=False), FdLines(read_end))
    try:
        assert not FdLines(read_end).echoed
        result = anyio.run(prompter.elicit, NO_CONTEXT, _form("Ship it?", {}))
    finally:
        os.close(read_end)
    assert isinstance(result, ElicitResult) and result.action == "accept"
    assert screen.getvalue().endswith("\n") and "Ship it?" in screen.getvalue()


def test_lines_are_read_from_a_regular_file(tmp_path: Path) -> None:
    answers = tmp_path / "answers.txt"
    answers.write_text("Ada\nblue\n")
    with answers.open("rb") as handle:

        async def read_all() -> list[str | None]:
            lines = FdLines(handle.fileno())
            return [await lines.readline() for _ in range(3)]

        assert anyio.run(read_all) == ["Ada", "blue", None]


# -- what is printed, and the exit status -------------------------------------------------------


def test_exit_codes_follow_the_final_status() -> None:
    assert exit_code("completed") == EXIT_OK == 0
    assert exit_code("completed", is_error=True) == EXIT_FAILED == 1
    assert exit_code("failed") == 1
    assert exit_code("cancelled") == EXIT_CANCELLED == 130
    assert exit_code(None) == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "ARGS is not JSON"),
        ("[1, 2]", "ARGS must be a JSON object"),
        ('"tides"', "ARGS must be a JSON object"),
        # Python's json reads these; sent on, they reached the tool as null
        ('{"seconds": NaN}', "ARGS is not JSON: NaN is not JSON"),
        ('{"seconds": -Infinity}', "ARGS is not JSON: -Infinity is not JSON"),
        ('{"seconds": 1e400}', "ARGS is not JSON: 1e400 is out of range"),
        # JSON's escapes allow half a pair; UTF-8, which the request is sent in, has no such text
        ('{"text": "a\\ud800b"}', "ARGS holds a lone surrogate"),
    ],
)
def test_args_must_be_a_json_object(text: str, message: str) -> None:
    with pytest.raises(CallError, match=message) as raised:
        parse_arguments(text)
    assert raised.value.code == EXIT_USAGE


def test_no_args_is_an_empty_object() -> None:
    assert parse_arguments(None) == {} == parse_arguments("  ")
    assert parse_arguments('{"topic": "tides"}') == {"topic": "tides"}


def test_a_status_message_reaches_the_terminal_without_its_control_characters() -> None:
    """A job's message holding an escape sequence would move the cursor or clear the caller's screen."""
    out, err = io.StringIO(), io.StringIO()
    PlainView(out, err).update(_state(message="step 1\x1b[2J\rstep 2\nforged"))
    assert out.getvalue() == "status=working  (step 1 [2J step 2 forged)\n"


def test_plain_lines_are_one_per_change_then_the_result() -> None:
    out, err = io.StringIO(), io.StringIO()
    view = PlainView(out, err)
    view.created(_state(message="Queued"), attached=False, task_id="t-1")
    for state in (
        _state(message="Queued"),
        _state(message="Queued"),
        _state(message="Writing section 1 of 2"),
        _state(message="Writing section 1 of 2", _meta={PROGRESS_META_KEY: {"progress": 1}}),
        _state(message="Writing section 2 of 2"),
        _state("completed"),
    ):
        view.update(state)
    view.result(CallToolResult(content=[TextContent(type="text", text="A 2-section report.")]))
    assert out.getvalue().splitlines() == [
        "created task: status=working",
        "status=working  (Queued)",
        "status=working  (Writing section 1 of 2)",
        "status=working  (Writing section 2 of 2)",
        "status=completed",
        "A 2-section report.",
    ]
    assert "t-1" not in out.getvalue() and not err.getvalue()
    view.failed(ErrorData(code=-32603, message="Job failed: boom"))
    assert out.getvalue().splitlines()[-1] == "error -32603: Job failed: boom"
    view.failed(ErrorData(code=-32603, message="Job failed: a\x00b \u202eevil\x1b[2J"))  # the job's own text
    assert out.getvalue().splitlines()[-1] == "error -32603: Job failed: a b  evil [2J"


def test_a_terminal_says_a_failures_message_once() -> None:
    """The failed task's status message is its error's message: the final line and the error line repeated it."""
    screen = io.StringIO()
    console = Console(file=screen, width=120, color_system=None)  # not a terminal: no live frames, the final lines
    view = LiveView(console, Console(file=io.StringIO()))
    view.created(_state(message="Working"), attached=False, task_id="t-1")
    view.update(_state("failed", message="Job failed: boom"))
    view.failed(ErrorData(code=-32603, message="Job failed: boom"))
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    assert shown.count("boom") == 1 and "error -32603: Job failed: boom" in shown and "✘ failed" in shown


def test_a_terminal_shows_a_results_text_without_its_escape_sequences() -> None:
    """A job's result cleared the screen and retitled the window: it is shown as its status lines are, each
    control character a space, its lines and tabs kept. Piped output (`PlainView`) is the result as it is."""
    screen = io.StringIO()
    console = Console(file=screen, width=120, force_terminal=True, color_system=None)
    view = LiveView(console, Console(file=io.StringIO()))
    hostile = "done\x1b]0;TITLE\x07 \x1b[2Jcleared\n\tnext line \u202eevil"
    view.result(CallToolResult(content=[TextContent(type="text", text=hostile)]))
    assert (
        "\x1b]0;" not in screen.getvalue() and "\x1b[2J" not in screen.getvalue() and "\u202e" not in screen.getvalue()
    )
    assert screen.getvalue().splitlines() == ["done ]0;TITLE   [2Jcleared", "        next line  evil"]
    out = io.StringIO()
    PlainView(out, io.StringIO()).result(CallToolResult(content=[TextContent(type="text", text=hostile)]))
    assert out.getvalue() == hostile + "\n"


def test_json_prints_only_the_result() -> None:
    out, err = io.StringIO(), io.StringIO()
    view = JsonView(out, err)
    view.created(_state(), attached=False, task_id="t-1")
    view.update(_state(message="Busy"))
    view.result(CallToolResult(content=[TextContent(type="text", text="done")], structured_content={"n": 1}))
    assert json.loads(out.getvalue()) == {
        "content": [{"type": "text", "text": "done"}],
        "structuredContent": {"n": 1},
        "isError": False,
    }


def test_a_result_without_text_is_shown_as_json() -> None:
    result = CallToolResult(content=[], structured_content={"n": 1})
    assert json.loads(result_text(result)) == {"content": [], "structuredContent": {"n": 1}, "isError": False}


def _render(line: _StatusLine) -> str:
    console = Console(file=io.StringIO(), width=120, color_system=None, force_terminal=True)
    console.print(line)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", cast(io.StringIO, console.file).getvalue())


def test_the_status_line_shows_a_bar_only_when_the_job_reports_numbers() -> None:
    line = _StatusLine()
    line.set(_state(message="Writing section 1 of 3"))
    plain = _render(line)
    assert "working" in plain and "Writing section 1 of 3" in plain
    assert "━" not in plain and re.search(r"\d+:\d\d", plain)
    line.set(_state(message="Writing", _meta={PROGRESS_META_KEY: {"progress": 2, "total": 8}}))
    with_bar = _render(line)
    assert "━" in with_bar and "2/8" in with_bar
    line.set(_state(message="Counting", _meta={PROGRESS_META_KEY: {"progress": 5}}))
    assert "━" not in _render(line) and " 5 " in _render(line)
    line.set(_state("input_required", message="Waiting for a name"))
    assert "input_required" in _render(line)


# -- runs that end before any server answers ------------------------------------------------------


def _io() -> tuple[CallIo, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    prompter, _, _ = _prompter()
    return CallIo(view=PlainView(out, err), prompter=prompter, out=out, err=err), out, err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (CallOptions(url="http://x/mcp", tool="t", arguments="{"), "ARGS is not JSON"),
        (CallOptions(url="http://x/mcp"), "give a TOOL to call, or --resume=TASK_ID"),
        (CallOptions(url="http://x/mcp", tool="t", resume="abc"), "give a TOOL to call, or --resume=TASK_ID"),
        (CallOptions(url="http://x/mcp", resume="abc", no_wait=True), "--resume follows an existing task"),
        (CallOptions(url="http://x/mcp", tool="t", timeout=0), "--timeout must be a positive"),
        (CallOptions(url="http://x/mcp", tool="t", timeout=float("nan")), "--timeout must be a positive"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(options: CallOptions, message: str) -> None:
    run_io, out, err = _io()
    assert run_call(options, io=run_io) == EXIT_USAGE
    assert err.getvalue().startswith(f"celery-mcp-tasks call: {message}")
    assert len(err.getvalue().splitlines()) == 1 and not out.getvalue()


def test_an_unreachable_server_is_one_line_and_exit_1() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/mcp"
    run_io, out, err = _io()
    assert run_call(CallOptions(url=url, tool="t", token="s3cret-token"), io=run_io) == EXIT_FAILED
    assert err.getvalue() == f"celery-mcp-tasks call: cannot reach {url}: Connection refused (ConnectError)\n"
    assert "s3cret" not in out.getvalue() + err.getvalue()


def test_a_call_leaves_the_sdk_clients_logger_as_it_found_it() -> None:
    """`run_call` routes the SDK client's records to its own lines only while it runs (`dev --call`, and a
    test suite, call it in a process that goes on)."""
    import logging

    sdk = logging.getLogger("mcp.client")
    before = (list(sdk.handlers), sdk.propagate)
    for _ in range(2):
        run_io, _, _ = _io()
        assert run_call(CallOptions(url=f"http://127.0.0.1:{_closed_port()}/mcp", tool="t"), io=run_io) == EXIT_FAILED
        assert (list(sdk.handlers), sdk.propagate) == before


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again on the way out: nothing listens there


def test_a_url_without_its_scheme_is_a_usage_error_saying_what_it_needs() -> None:
    run_io, out, err = _io()
    assert run_call(CallOptions(url="localhost:8000/mcp", tool="t"), io=run_io) == EXIT_USAGE
    assert err.getvalue() == (
        "celery-mcp-tasks call: URL must start with http:// or https:// (e.g. http://127.0.0.1:8000/mcp), "
        "not 'localhost:8000/mcp'\n"
    )
    assert not out.getvalue()


def test_one_interrupt_ends_the_current_step_and_a_second_one_everything() -> None:
    async def scenario() -> tuple[bool, bool, int | None]:
        with anyio.CancelScope() as outer:
            interrupts = _Interrupts(outer)
            with interrupts.stage() as step:
                interrupts.interrupt()
                await anyio.sleep(1)
            assert not outer.cancel_called
            interrupts.interrupt()  # no step running (the cancel is on its way): leave
            await anyio.sleep(1)
        return step.cancelled_caught, outer.cancelled_caught, interrupts.forced

    assert anyio.run(scenario) == (True, True, EXIT_CANCELLED)


def test_a_second_interrupt_once_the_task_exists_says_how_to_follow_it_again() -> None:
    async def scenario(resume: str | None) -> str | None:
        with anyio.CancelScope() as outer:
            interrupts = _Interrupts(outer)
            interrupts.resume = resume
            with interrupts.stage():
                interrupts.interrupt()  # following: the first one cancels the task
                await anyio.sleep(1)
            interrupts.interrupt()  # while the cancel is on its way
            await anyio.sleep(1)
        return interrupts.message

    command = "celery-mcp-tasks call http://127.0.0.1:8000/mcp --resume=abc"
    assert anyio.run(scenario, command) == f"interrupted again: leaving now; the task may still be running: {command}"
    assert anyio.run(scenario, None) == "interrupted again: leaving now (the task may still be running)"


def test_args_are_read_from_a_file_after_at_or_from_stdin_for_a_dash(tmp_path: Path) -> None:
    args = tmp_path / "args.json"
    args.write_text('{"topic": "tides"}', encoding="utf-8")
    assert read_arguments(f"@{args}", None) == '{"topic": "tides"}'
    assert read_arguments("-", io.StringIO('{"topic": "piped"}')) == '{"topic": "piped"}'
    assert read_arguments('{"topic": "typed"}', None) == '{"topic": "typed"}'
    assert read_arguments(None, None) is None
    with pytest.raises(CallError, match=r"cannot read ARGS from .*nope\.json.*: No such file") as missing:
        read_arguments(f"@{tmp_path / 'nope.json'}", None)
    assert missing.value.code == EXIT_USAGE
    with pytest.raises(CallError, match="no stdin"):
        read_arguments("-", None)


def _raised_from(cause: BaseException) -> BaseException:
    import httpx2

    try:
        try:
            raise cause
        except BaseException as inner:
            raise httpx2.ConnectError("All connection attempts failed") from inner
    except httpx2.ConnectError as exc:
        return exc


def test_an_unreachable_servers_reason_is_the_systems_and_a_tls_failure_is_not_read_as_one() -> None:
    import errno
    import ssl

    from celery_mcp_tasks.cli.call import _reason

    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed ('127.0.0.1', 9)")
    assert _reason(_raised_from(refused)) == "Connection refused (ConnectError)"
    tls = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    tls.reason = "WRONG_VERSION_NUMBER"  # as the ssl module sets it
    assert _reason(_raised_from(tls)) == "TLS handshake failed, WRONG_VERSION_NUMBER (ConnectError)"  # not EPERM
    assert _reason(ValueError()) == "ValueError"


def test_the_sdk_clients_errors_are_one_line_each_and_its_warnings_none(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    logger = logging.getLogger("tests.cli.sdk_lines")  # as `run` attaches it to the SDK client's logger
    logger.addHandler(handler := _SdkLines())
    logger.propagate = False
    try:
        logger.warning("Session termination failed: 404")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("Error in post_writer\nmore")
    finally:
        logger.removeHandler(handler)
    assert capsys.readouterr().err == "celery-mcp-tasks call: the MCP client: Error in post_writer\n"


def test_the_tools_a_server_lists_after_an_unknown_name_are_shown_without_control_characters() -> None:
    """A server's tool names are its own text, as a job's messages are: no escape sequence reaches the terminal."""
    from types import SimpleNamespace

    from celery_mcp_tasks.cli.call import _other_tools

    class Server:
        async def list_tools(self, cursor: str | None = None) -> Any:
            return SimpleNamespace(
                tools=[SimpleNamespace(name="report\x1b[2J"), SimpleNamespace(name="ok")], next_cursor=None
            )

    hint = anyio.run(_other_tools, Server(), "reprot")
    assert hint == " (this server's tools: ok, report [2J)"


async def _closed_output_cases() -> None:
    from celery_mcp_tasks.cli.call import EXIT_CANCELLED, EXIT_FAILED, _Interrupts, _OutputClosed

    resume = "celery-mcp-tasks call http://h/mcp --resume=ID"
    interrupts = _Interrupts(anyio.CancelScope())
    interrupts.count = 1  # a Ctrl-C arrived, its cancel not yet answered
    early = _OutputClosed(resume, interrupts)
    assert (early.code, str(early)) == (
        EXIT_FAILED,
        f"the output was closed (its reader left); the task may still be running: {resume}",
    )
    interrupts.cancelled = True
    assert _OutputClosed(resume, interrupts).code == EXIT_CANCELLED
    assert str(_OutputClosed(None, _Interrupts(anyio.CancelScope()))) == "the output was closed (its reader left)"


def test_a_closed_output_exits_130_only_once_a_cancel_was_answered_and_else_says_how_to_resume() -> None:
    """A Ctrl-C ends `| cat` as well: the command exits 130 only when its cancel went through; a reader gone
    before that (or without any Ctrl-C) leaves the task running, and stderr says how to follow it."""
    anyio.run(_closed_output_cases)
