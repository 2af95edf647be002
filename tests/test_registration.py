"""Registering tools: a mistake is an error at registration that names the tool (and the parameter)."""

from __future__ import annotations

import inspect
import socket
import typing
from pathlib import Path

import pytest
from celery import Celery

from celery_mcp_tasks import McpTasks, TaskContext
from celery_mcp_tasks.app import internals
from celery_mcp_tasks.config import Settings
from celery_mcp_tasks.mcp.toolspec import TOOL_OPTIONS


@pytest.fixture
def tasks(tmp_path: Path) -> McpTasks:
    return McpTasks("registration", celery=Celery("registration"), settings=Settings(data_dir=tmp_path))


def test_a_task_tool_named_like_a_plain_tool_is_refused(tasks: McpTasks) -> None:
    @tasks.server.tool()
    def lookup(query: str) -> str:
        return query

    with pytest.raises(ValueError, match="'lookup'"):

        @tasks.mcp_task(name="lookup")
        def slow_lookup(query: str) -> str:
            return query

    assert "lookup" not in internals(tasks).tools
    assert not [name for name in tasks.celery.tasks if name.endswith("slow_lookup")]


def test_a_plain_tool_named_like_a_task_tool_is_refused(tasks: McpTasks) -> None:
    @tasks.mcp_task
    def report(topic: str) -> str:
        return topic

    with pytest.raises(ValueError, match="'report'"):
        tasks.server.tool(name="report")(lambda topic: topic)
    with pytest.raises(ValueError, match="'report'"):

        @tasks.server.tool()
        def report(topic: str) -> str:
            return topic


def test_the_same_task_tool_twice_is_refused(tasks: McpTasks) -> None:
    @tasks.mcp_task
    def once() -> str:
        return "ok"

    with pytest.raises(ValueError, match="'once'"):
        tasks.mcp_task(name="once")(lambda: "again")


def test_a_parameter_without_a_json_schema_names_the_tool_and_the_parameter(tasks: McpTasks) -> None:
    with pytest.raises(TypeError) as refused:

        @tasks.mcp_task
        def job(count: int, sock: socket.socket, ctx: TaskContext) -> str:
            return "never"

    message = str(refused.value)
    assert message.startswith("task tool 'job': parameter 'sock' ") and "socket.socket" in message
    assert "job" not in internals(tasks).tools and not tasks.server.has_tool("job")


def test_distinct_tools_of_both_kinds_live_side_by_side(tasks: McpTasks) -> None:
    @tasks.server.tool()
    def quick(x: int) -> int:
        return x

    @tasks.mcp_task
    def slow(x: int) -> int:
        return x

    assert tasks.server.has_tool("quick") and tasks.server.has_tool("slow") and list(internals(tasks).tools) == ["slow"]


def test_a_prepare_that_is_not_async_is_refused_naming_the_tool(tasks: McpTasks) -> None:
    """It is awaited in the web process's loop: a plain function would fail every call, not the registration."""

    def ask_first(arguments: dict[str, object], answers: dict[str, object]) -> dict[str, object]:
        return {}

    with pytest.raises(TypeError, match=r"^task tool 'greet': prepare runs in the web process's loop; define it"):

        @tasks.mcp_task(prepare=ask_first)  # type: ignore[arg-type]
        def greet(name: str) -> str:
            return name


@pytest.mark.parametrize("option", ["max_arguments_bytes", "max_answer_bytes", "max_result_bytes"])
@pytest.mark.parametrize("value", [0, -1, "1k", True])
def test_a_payload_limit_that_is_not_a_positive_number_of_bytes_is_refused(
    tasks: McpTasks, option: str, value: object
) -> None:
    with pytest.raises(ValueError, match=rf"^task tool 'upload': {option} must be a number of bytes >= 1, got"):

        @tasks.mcp_task(**{option: value})
        def upload(data: str) -> str:
            return data


def test_a_tools_payload_limits_win_over_the_settings(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, max_arguments_bytes=10, max_answer_bytes=20, max_result_bytes=None)
    tasks = McpTasks("limits", celery=Celery("limits"), settings=settings)

    @tasks.mcp_task(max_result_bytes=300)
    def own(data: str) -> str:
        return data

    @tasks.mcp_task
    def plain(data: str) -> str:
        return data

    limits = internals(tasks).service().limits
    assert limits is not None
    assert (limits("own").arguments, limits("own").answers, limits("own").result) == (10, 20, 300)
    assert (limits("plain").arguments, limits("plain").answers, limits("plain").result) == (10, 20, None)


def test_every_keyword_of_the_typed_overload_describes_the_tool_and_no_other_does() -> None:
    """`mcp_task` hands options to `TaskTool` by their names: the overload users see must name exactly those."""
    with_options = typing.get_overloads(McpTasks.mcp_task)[1]
    keywords = {
        name
        for name, parameter in inspect.signature(with_options).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert keywords == TOOL_OPTIONS


def test_a_task_tools_job_is_of_the_apps_task_class_or_the_base_given(tmp_path: Path) -> None:
    from celery import Task

    from celery_mcp_tasks.worker.job import McpJob

    class AppBase(Task):  # type: ignore[misc]  # Celery ships no types
        origin = "the app's"

    class Given(Task):  # type: ignore[misc]
        origin = "given"
        acks_late = False  # the base's attributes win over the package's defaults
        typing = False

    tasks = McpTasks("bases", celery=Celery("bases", task_cls=AppBase), settings=Settings(data_dir=tmp_path))

    @tasks.mcp_task
    def plain() -> str:
        return "x"

    @tasks.mcp_task(base=Given)
    def based() -> str:
        return "x"

    assert isinstance(plain, McpJob) and plain.origin == "the app's"
    assert isinstance(based, McpJob) and isinstance(based, Given) and based.origin == "given"
    assert (based.acks_late, based.typing, based.retry_on_worker_lost) == (False, False, True)
    assert (plain.acks_late, plain.typing) == (True, True)  # the package's defaults where nobody said otherwise
    assert plain() == "x" and based() == "x"  # called directly: the body


def test_a_configuration_the_project_loads_after_the_construction_keeps_the_packages_settings(
    tmp_path: Path,
) -> None:
    """Celery drops what was set on a configured app when it loads a configuration again: a project doing
    `config_from_object` after `McpTasks(celery=app)` kept none of the package's settings."""

    class Config:
        broker_url = "redis://127.0.0.1:6379/0"
        task_default_queue = "default"
        task_acks_late = False  # the project's own settings stay

    app = Celery("late")
    McpTasks("late", celery=app, settings=Settings(data_dir=tmp_path, queue="mcp"))
    app.config_from_object(Config)
    assert app.conf.task_default_queue == "mcp"  # MCP_TASKS_QUEUE, as at construction
    assert app.conf.broker_connection_retry_on_startup is True
    assert app.conf.broker_transport_options["socket_timeout"] == 5.0
    assert app.conf.broker_url == "redis://127.0.0.1:6379/0" and app.conf.task_acks_late is False


def test_values_celery_copied_into_a_bound_task_class_are_not_taken_for_the_users(tmp_path: Path) -> None:
    """Binding a task class copies the app's configuration into it (`task_acks_late=False` included): the
    package's defaults still apply, as for a class nobody bound."""
    app = Celery("bound")
    app.conf.task_acks_late = False
    app.Task.bind(app)
    tasks = McpTasks("bound", celery=app, settings=Settings(data_dir=tmp_path))

    @tasks.mcp_task
    def plain() -> str:
        return "x"

    assert plain.acks_late is True


def test_a_project_that_turns_retry_on_startup_off_keeps_it_off(tmp_path: Path) -> None:
    class Config:
        broker_connection_retry_on_startup = False

    app = Celery("off")
    McpTasks("off", celery=app, settings=Settings(data_dir=tmp_path))
    app.config_from_object(Config)
    assert app.conf.broker_connection_retry_on_startup is False


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"ttl_ms": 0}, "ttl_ms must be a whole number >= 1 (or None), got 0"),
        ({"poll_interval_ms": -5}, "poll_interval_ms must be a whole number >= 1 (or None), got -5"),
        ({"max_active": "2"}, "max_active must be a whole number >= 1 (or None), got '2'"),
        ({"max_sends": 1.5}, "max_sends must be a whole number >= 1 (or None), got 1.5"),
        ({"sync_timeout_s": 0}, "sync_timeout_s must be seconds > 0 (or None), got 0"),
        ({"sync_timeout_s": float("nan")}, "sync_timeout_s must be seconds > 0 (or None), got nan"),
        ({"terminate": "yes"}, "terminate must be True or False, got 'yes'"),
        ({"max_sends": "default"}, "max_sends must be a whole number >= 1 (or None), got 'default'"),
        ({"max_active": "default"}, "max_active must be a whole number >= 1 (or None), got 'default'"),
        ({"ttl_ms": 1.5}, "ttl_ms must be a whole number >= 1 (or None), got 1.5"),
        ({"needs": "elicitation"}, "needs is a tuple of names, e.g. needs=('elicitation',)"),
    ],
)
def test_a_tool_option_out_of_its_range_is_refused_at_import_naming_tool_and_option(
    tasks: McpTasks, options: dict[str, object], said: str
) -> None:
    """Each would break later and elsewhere: a task expired at its first read, a negative poll interval sent to
    clients, a setting silently used instead, a bare TypeError, a capability per letter."""
    with pytest.raises(ValueError, match=r"^task tool 'report': ") as refused:

        @tasks.mcp_task(**options)  # type: ignore[call-overload]
        def report(topic: str) -> str:
            return topic

    assert str(refused.value) == f"task tool 'report': {said}"


def test_the_options_in_range_are_taken(tasks: McpTasks) -> None:
    @tasks.mcp_task(ttl_ms=None, poll_interval_ms=1, sync_timeout_s=0.5, max_active=1, max_sends=2, terminate=True)
    def report(topic: str) -> str:
        return topic

    @tasks.mcp_task(ttl_ms=3.6e6, poll_interval_ms="default", max_sends=2.0, max_arguments_bytes=1024.0, terminate=None)
    def summary(topic: str) -> str:  # whole floats (an hour as 3.6e6 ms) and None, as before: ints, and False
        return topic

    first, second = internals(tasks).tools["report"], internals(tasks).tools["summary"]
    assert [first.ttl_ms, first.poll_interval_ms, first.sync_timeout_s, first.max_active, first.max_sends] == [
        None,
        1,
        0.5,
        1,
        2,
    ]
    assert first.terminate is True and second.terminate is False
    assert [second.ttl_ms, second.poll_interval_ms, second.max_sends, second.max_arguments_bytes] == [
        3_600_000,
        "default",
        2,
        1024,
    ]
    assert {type(second.ttl_ms), type(second.max_sends), type(second.max_arguments_bytes)} == {int}


def test_a_tool_name_longer_than_a_task_keeps_is_refused_at_import(tasks: McpTasks) -> None:
    """Every call of it would fail in the store's INSERT (PostgreSQL's column holds 128 characters), and the
    console's tool filter refuses it."""

    @tasks.mcp_task(name="t" * 128)
    def longest() -> str:
        return "ok"

    with pytest.raises(ValueError, match=r"^task tool 'u{40}…': its name must have 1 to 128 characters, it has 129$"):

        @tasks.mcp_task(name="u" * 129)
        def too_long() -> str:
            return "ok"


def test_a_second_mcp_tasks_on_one_celery_app_is_refused_before_it_changes_the_app(tmp_path: Path) -> None:
    """Both would share one janitor name and one job name per tool: the second's tasks were swept by nobody, and
    a tool on both ran in the first one's store."""
    app = Celery("shared")
    McpTasks("first", celery=app, settings=Settings(data_dir=tmp_path / "first"))
    before = dict(app.conf)
    with pytest.raises(ValueError, match="this Celery app has an McpTasks already"):
        McpTasks("second", celery=app, settings=Settings(data_dir=tmp_path / "second", queue="other"))
    assert dict(app.conf) == before


def test_a_job_whose_celery_name_another_task_has_is_refused(tasks: McpTasks) -> None:
    """Celery keeps the first task of a name: the job, made at once, silently replaced one declared before it
    (its `.delay()` ran the tool's body), or was replaced by one made before it."""

    @tasks.celery.task(name=f"{__name__}.convert")  # declared, not made: the app is not finalized
    def convert_legacy(path: str) -> str:
        return f"legacy {path}"

    with pytest.raises(ValueError, match=rf"task tool 'convert': the Celery app has a task named '{__name__}.convert'"):

        @tasks.mcp_task
        def convert(path: str) -> str:
            return f"mcp {path}"

    assert "convert" not in internals(tasks).tools
    assert tasks.celery.tasks[f"{__name__}.convert"](path="a") == "legacy a"

    @tasks.mcp_task(name="first")
    def same() -> str:
        return "first"

    with pytest.raises(ValueError, match="task tool 'second': the Celery app has a task named"):

        @tasks.mcp_task(name="second")  # another tool name, the same module and function: the same job name
        def same() -> str:  # type: ignore[no-redef]
            return "second"


def test_a_celery_task_is_not_taken_for_a_tools_function(tasks: McpTasks) -> None:
    @tasks.celery.task
    def already(x: int) -> int:
        return x

    with pytest.raises(ValueError, match=r"@mcp_task\(already\): decorate the plain function, not a Celery task"):
        tasks.mcp_task(already)
