"""`celery_mcp_tasks.testing`: the pytest plugin a user tests their task tools with.

Used the way a user would: a tiny project run by pytester (the app named in its
pytest configuration, the plugin found through its entry point), and directly
here, against tests.apps.runtime_app (questions answered by the script, a
running job cancelled on the real worker).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import pytest
from mcp import Client

from celery_mcp_tasks import testing
from celery_mcp_tasks.client import TasksClient
from celery_mcp_tasks.testing import ScriptedAnswers
from tests.conftest import needs_pg_redis
from tests.support import POSTGRES_URL, REDIS_URL, ROOT, fresh_postgres_database, wait_until

pytestmark = pytest.mark.integration
pytest_plugins = ["pytester"]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def mcp_tasks_app() -> str:
    return "tests.apps.runtime_app"


USER_TESTS = """
import pytest


@pytest.mark.anyio
async def test_the_report_is_written(mcp_tasks_client) -> None:
    result = await mcp_tasks_client.call_tool("write_report", {"topic": "tides", "sections": 1})
    assert result.content[0].text == "A 1-section report on tides."


@pytest.mark.anyio
async def test_its_progress_is_seen(mcp_tasks_client, mcp_tasks_extension) -> None:
    handle = await mcp_tasks_extension.start(mcp_tasks_client, "write_report", {"topic": "tides", "sections": 2})
    messages = [state.status_message async for state in handle.updates()]
    assert handle.status == "completed"
    assert "Writing section 2 of 2" in messages
"""


def test_a_user_project_tests_the_quickstart_in_a_few_lines(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # where the user's app (examples.quickstart.app) imports from, and the package as this run imports it
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("MCP_TASKS_DATABASE_URL", raising=False)
    pytester.makeini("[pytest]\nmcp_tasks_app = examples.quickstart.app\n")
    pytester.makepyfile(test_quickstart=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=240)
    result.assert_outcomes(passed=2)


@needs_pg_redis
def test_the_database_and_broker_mcp_tasks_env_names_are_the_ones_served(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A team whose tests run on their PostgreSQL and Redis names them in `mcp_tasks_env`; the deployment serves
    on them (its worker found on that broker), and leaves the test process's current Celery app as it was."""
    import psycopg

    assert POSTGRES_URL and REDIS_URL
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    queue = f"plugin-{uuid.uuid4().hex[:10]}"
    with fresh_postgres_database(POSTGRES_URL) as url:
        served = {"MCP_TASKS_DATABASE_URL": url, "CELERY_BROKER_URL": REDIS_URL, "MCP_TASKS_QUEUE": queue}
        pytester.makeini("[pytest]\nmcp_tasks_app = examples.quickstart.app\n")
        pytester.makeconftest(
            f"import pytest\n\n\n@pytest.fixture(scope='module')\ndef mcp_tasks_env():\n    return {served!r}\n"
        )
        pytester.makepyfile(
            test_quickstart=USER_TESTS
            + """

def test_the_current_celery_app_is_still_the_default():
    import celery

    assert not celery.current_app.main.startswith("mcp-tasks-ping")
"""
        )
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=240)
        result.assert_outcomes(passed=3)
        with psycopg.connect(url) as conn:
            (completed,) = conn.execute("SELECT count(*) FROM mcp_tasks_task WHERE status = 'completed'").fetchone()
        assert completed == 2


USER_APP = """
from celery_mcp_tasks import McpTasks

tasks = McpTasks("shouting")
celery = tasks.celery


@tasks.mcp_task
def shout(text: str) -> str:
    \"\"\"Say it louder.\"\"\"
    return text.upper()
"""


FAILING_TOOL = """

@tasks.mcp_task
def whisper(text: str) -> str:
    \"\"\"Loses it.\"\"\"
    raise RuntimeError("the whisper was lost")
"""


def test_the_app_imports_from_pytests_pythonpath_option_and_a_failed_test_shows_its_jobs_traceback(
    pytester: pytest.Pytester,
) -> None:
    """A src/ layout named only by `pythonpath = src`: the served processes import the app from there too. A test
    failing on a failed job shows what the served processes logged during it, the job's traceback included."""
    pytester.makeini("[pytest]\npythonpath = src\nmcp_tasks_app = shouting_app\n")
    (pytester.path / "src").mkdir()
    (pytester.path / "src" / "shouting_app.py").write_text(USER_APP + FAILING_TOOL)
    pytester.makepyfile(
        test_shout="""
        import pytest

        @pytest.mark.anyio
        async def test_shout(mcp_tasks_client) -> None:
            result = await mcp_tasks_client.call_tool("shout", {"text": "tides"})
            assert result.content[0].text == "TIDES"

        @pytest.mark.anyio
        async def test_whisper(mcp_tasks_client) -> None:
            await mcp_tasks_client.call_tool("whisper", {"text": "tides"})
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=240)
    result.assert_outcomes(passed=1, failed=1)
    shown = result.stdout.str()
    section = shown[shown.index("celery-mcp-tasks dev log during the test") :]
    assert "Traceback" in section and 'raise RuntimeError("the whisper was lost")' in section, shown[-3000:]
    assert shown.count("celery-mcp-tasks dev log during the test") == 1  # the failed test's only


def test_without_an_app_named_the_fixtures_say_how_to_name_one(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_nothing="""
        def test_server(mcp_tasks_server):
            pass

        def test_unrelated():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*name the app to serve: `mcp_tasks_app = myapp.tasks` in the pytest configuration*"])


def test_pytest_asyncio_in_auto_mode_is_refused_in_one_line_before_anything_starts(pytester: pytest.Pytester) -> None:
    """With pytest-asyncio's auto mode the client fixture ran on its event loop and every call hung (until a
    timeout killed pytest): the fixture says so instead. Its default, strict mode, is left alone."""
    pytester.makeini("[pytest]\nmcp_tasks_app = tests.apps.runtime_app\nasyncio_mode = auto\n")
    pytester.makepyfile(
        test_hangs="""
        import pytest

        @pytest.mark.anyio
        async def test_call(mcp_tasks_client):
            await mcp_tasks_client.call_tool("slow_echo", {"text": "x"})
        """
    )
    result = pytester.runpytest_subprocess(timeout=120)  # pytest-asyncio loads as an installed plugin does
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*pytest-asyncio's asyncio_mode=auto takes it over*asyncio_mode = strict*"])
    assert not list(pytester.path.rglob("dev.log"))  # no deployment was started for it


def test_a_server_of_the_users_own_gets_no_deployment_started_for_its_log(pytester: pytest.Pytester) -> None:
    """`mcp_tasks_server` overridden (a server the user runs): the client's log mark starts nothing and marks nothing."""
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture(scope="module")
        def mcp_tasks_server():
            return "http://127.0.0.1:9/mcp"
        """
    )
    pytester.makepyfile(
        test_own="""
        from celery_mcp_tasks.testing import _LOG_MARK

        def test_mark(_mcp_tasks_log_mark, request):
            assert _LOG_MARK not in request.node.stash
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=1)  # no app named anywhere: a deployment started would have failed the test


def test_the_plugin_imports_nothing_heavy() -> None:
    code = (
        "import sys, celery_mcp_tasks.testing\n"
        "heavy = [m for m in ('mcp', 'mcp_types', 'celery', 'kombu', 'sqlalchemy', 'anyio') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert run.stdout.strip() == "[]"


STUBBORN_DEV = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"]
child = subprocess.Popen([*worker, sys.argv[1] + "/beat-schedule"], start_new_session=True)
open(sys.argv[1] + "/worker.pid", "w").write(str(child.pid))
time.sleep(120)
"""


def test_a_dev_that_ignores_sigterm_is_killed_with_its_worker_in_its_own_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dev` and a worker as `dev` starts it (a session of its own, the data dir on its command line)."""
    monkeypatch.setattr(testing, "_STOP_TIMEOUT_S", 0.5)
    data = tmp_path / "data"
    data.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN_DEV, str(data)], start_new_session=True)
    try:
        worker_pid = int(
            wait_until(lambda: (data / "worker.pid").exists() and (data / "worker.pid").read_text(), 30, "the worker")
        )
        testing.Deployment("app", "http://unused", data, proc, data / "dev.log").stop()
        assert proc.returncode == -signal.SIGKILL
        wait_until(lambda: not _alive(worker_pid), 10, "the worker's group to be killed too")
    finally:
        for pgid in testing._groups_mentioning(data) | ({proc.pid} if proc.poll() is None else set()):
            testing._killpg(pgid)


KILLED_RUN = """
import sys, time
from pathlib import Path
from celery_mcp_tasks import testing
deployment = testing.start_deployment("tests.apps.runtime_app", Path(sys.argv[1]), cwd=Path(sys.argv[2]))
print(deployment.proc.pid, flush=True)
time.sleep(120)
"""


def test_a_test_run_killed_outright_takes_its_deployment_with_it(tmp_path: Path) -> None:
    """A CI job's timeout SIGKILLs pytest: `dev` gets SIGTERM and stops its worker; nothing is left running."""
    data = tmp_path / "data"
    run = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(data), str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        assert run.stdout is not None
        dev_pid = int(run.stdout.readline())
        assert testing._groups_mentioning(data), "the deployment runs"
        run.kill()
        run.wait(10)
        wait_until(lambda: not _alive(dev_pid), 30, "dev to stop once the test run was killed")
        wait_until(lambda: not testing._groups_mentioning(data), 30, "the worker to stop with dev")
    finally:
        run.kill()
        for pgid in testing._groups_mentioning(data):
            testing._killpg(pgid)


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


# -- direct use, as in this project's own tests -----------------------------------------------


@pytest.mark.anyio
async def test_questions_are_answered_from_the_script(
    mcp_tasks_client: Client, mcp_tasks_answers: ScriptedAnswers
) -> None:
    mcp_tasks_answers.when("name", {"name": "Ada"}).when("colour", {"colour": "teal"})
    result = await mcp_tasks_client.call_tool("two_rounds", {})
    assert "".join(getattr(item, "text", "") for item in result.content).startswith("Ada likes teal")
    assert mcp_tasks_answers.asked == ["Your name?", "Favourite colour?"]


@pytest.mark.anyio
async def test_a_running_job_is_cancelled_on_the_real_worker(
    mcp_tasks_client: Client, mcp_tasks_extension: TasksClient, tmp_path: Path
) -> None:
    marker = tmp_path / "work"
    handle = await mcp_tasks_extension.start(mcp_tasks_client, "work", {"seconds": 120, "marker": str(marker)})
    with anyio.fail_after(60):
        async for state in handle.updates():
            if (state.status_message or "").endswith(": working"):
                break
        await handle.cancel()
        assert handle.status == "cancelled"
        while not await anyio.Path(f"{marker}.stopped").exists():  # the job itself saw the cancel and stopped
            await anyio.sleep(0.05)


@pytest.mark.anyio
async def test_an_unanswered_question_is_declined(mcp_tasks_client: Client, mcp_tasks_answers: ScriptedAnswers) -> None:
    result = await mcp_tasks_client.call_tool("wait_or_give_up", {"timeout": 30})
    assert mcp_tasks_answers.asked == ["Proceed?"]
    assert "".join(getattr(item, "text", "") for item in result.content) == "answered"  # a decline is an answer


class _ClosesIntoTheRace:
    """A stand-in for the SDK's `Client` whose close raises what its transport raises in the race."""

    def __init__(self, *_: object, **__: object) -> None:
        self.leaving: BaseException = BaseExceptionGroup("transport", [anyio.BrokenResourceError()])

    async def __aenter__(self) -> _ClosesIntoTheRace:
        return self

    async def __aexit__(self, *_: object) -> None:
        raise self.leaving


@pytest.mark.anyio
async def test_the_client_fixture_tolerates_the_sdks_teardown_race_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import mcp

    monkeypatch.setattr(mcp, "Client", _ClosesIntoTheRace)
    async with testing._connected("http://unused/mcp", TasksClient(), ScriptedAnswers()) as client:
        assert isinstance(client, _ClosesIntoTheRace)  # closing raised the race's group: ignored

    with pytest.raises(BaseExceptionGroup) as raised:
        async with testing._connected("http://unused/mcp", TasksClient(), ScriptedAnswers()) as client:
            client.leaving = BaseExceptionGroup("transport", [anyio.BrokenResourceError(), OSError("real")])
    assert raised.group_contains(OSError)
