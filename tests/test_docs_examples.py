"""The docs site's examples run, and its reference pages say what the code does.

Every Python example on the site is a file under `examples/guide/` that a page includes with
`--8<--` (pymdownx.snippets); this module imports each one and runs it (directly, or served
by the pytest plugin as a user would), so a renamed API fails here, not in a reader's hands.
The reference pages are checked against the code: every setting in `config.py` is on the
settings page, the CLI help shown is the CLI's own, and the getting-started page shows
the README's first command and output.

Regenerate the CLI help the reference shows (after changing an option):

    python -m tests.test_docs_examples
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from celery_mcp_tasks.app import internals
from celery_mcp_tasks.cli.shared import supervised_queues, tool_queues
from examples.guide import client as client_examples
from examples.guide.test_tools import (
    test_crunch_reports_its_result,
    test_crunch_shows_its_progress,
    test_deploy_asks_first,
    test_deploy_declined,
    test_fetch_fails_once_its_retries_are_spent,
    test_forecast_without_a_city_is_a_tool_error,
    test_scan_can_be_cancelled,
)
from tests.support import ROOT

DOCS = ROOT / "docs"
CLI_HELP = DOCS / "reference" / "cli"
COMMANDS = ("serve", "dev", "stdio", "db", "call", "doctor", "console", "tasks")
SNIPPET = re.compile(r'^\s*--8<-- "([^"]+)"\s*$', re.MULTILINE)


# -- the pages include what exists ---------------------------------------------------------


def _snippets() -> list[tuple[Path, str]]:
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        found += [(page, ref) for ref in SNIPPET.findall(page.read_text())]
    return found


def test_every_snippet_names_a_file_and_a_section_that_exist() -> None:
    snippets = _snippets()
    assert len(snippets) > 20
    for page, ref in snippets:
        path, _, section = ref.partition(":")
        source = ROOT / path
        assert source.is_file(), f"{page.relative_to(ROOT)} includes {path}, which does not exist"
        if section and not section.isdigit():
            text = source.read_text()
            for edge in ("start", "end"):
                assert f"--8<-- [{edge}:{section}]" in text, f"{page.relative_to(ROOT)}: {ref} has no {edge} marker"


def test_every_guide_example_is_included_by_a_page() -> None:
    included = {ref.partition(":")[0] for _, ref in _snippets()}
    examples = {str(p.relative_to(ROOT)) for p in (ROOT / "examples" / "guide").glob("*.py") if p.name != "__init__.py"}
    assert examples - included == set(), "an example no page shows: include it or delete it"


# -- the examples build and run ------------------------------------------------------------


def test_the_guide_apps_declare_the_tools_the_pages_describe() -> None:
    from examples.guide import first_tool, tools

    assert set(internals(first_tool.tasks).tools) == {"count_words"}
    assert set(internals(tools.tasks).tools) == {"crunch", "deploy", "scan", "render", "fetch", "forecast"}
    assert tools.celery is tools.tasks.celery


def test_the_existing_celery_app_example_keeps_the_app_and_its_configuration() -> None:
    from examples.guide import existing_app

    app = existing_app.app
    assert existing_app.tasks.celery is app
    assert set(internals(existing_app.tasks).tools) == {"double"}
    assert {existing_app.double.name, existing_app.plain.name} <= set(app.tasks)
    assert tool_queues(existing_app.tasks) == {"mcp": ["double"]}  # routed by the app's own task_routes
    assert supervised_queues(existing_app.tasks) == ["celery", "mcp"]  # what dev's worker consumes
    assert existing_app.double(x=21) == 42  # called directly: a detached context, the job's body


@pytest.mark.integration
def test_dev_runs_a_tool_routed_to_a_queue_of_its_own(tmp_path: Path) -> None:
    """dev's worker consumes every task tool's queue, not only the default one (the job was lost before)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "CELERY_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery_mcp_tasks.cli",
            "dev",
            "examples.guide.existing_app",
            "--port",
            str(_closed_port()),
            "--data-dir",
            str(tmp_path / "data"),
            "--call",
            "double",
            '{"x": 21}',
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "42"


def test_the_payloads_page_example_sets_its_tools_limits() -> None:
    from examples.guide import payloads

    spec = internals(payloads.tasks).tools["summarize"]
    assert (spec.max_arguments_bytes, spec.max_answer_bytes, spec.max_result_bytes) == (65536, None, 262144)
    assert payloads.summarize(text="x" * 300) == "x" * 200  # called directly: the job's body


def test_the_plugins_and_mounting_examples_build() -> None:
    from starlette.routing import Route

    from examples.guide import mounted, plugins

    ops_paths = {route.path for route in plugins.ops_app.routes if isinstance(route, Route)}
    assert {"/metrics", "/healthz", "/readyz"} <= ops_paths
    assert any(getattr(route, "path", None) == "/hello" for route in mounted.app.routes)


def test_a_task_tool_called_directly_runs_with_a_detached_context() -> None:
    # --8<-- [start:direct-call]
    from examples.guide.first_tool import count_words

    assert count_words("to be or not\nto be") == {"to": 2, "be": 2, "or": 1, "not": 1}
    # --8<-- [end:direct-call]


# Served by the pytest plugin: the Testing page's tests, as printed, and the Clients page's code.


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


# --8<-- [start:app-fixture]
@pytest.fixture(scope="module")
def mcp_tasks_app() -> str:
    return "examples.guide.tools"


# --8<-- [end:app-fixture]

for _test in (
    test_crunch_reports_its_result,
    test_crunch_shows_its_progress,
    test_deploy_asks_first,
    test_deploy_declined,
    test_fetch_fails_once_its_retries_are_spent,
    test_forecast_without_a_city_is_a_tool_error,
    test_scan_can_be_cancelled,
):
    pytest.mark.integration(_test)


@pytest.mark.integration
@pytest.mark.anyio
async def test_the_clients_page_examples_run_against_the_guide_app(mcp_tasks_server: str) -> None:
    assert await client_examples.call(mcp_tasks_server) == "Crunched 3 steps."
    assert await client_examples.deploy(mcp_tasks_server) == "web: deployed"
    seen = await client_examples.start_then_follow(mcp_tasks_server)
    assert seen[-1] == "Crunched 3 steps." and "working: Step 3 of 3" in seen
    followed = await client_examples.follow_and_answer(mcp_tasks_server)
    assert "input_required" in followed and followed[-1] == "completed"
    assert await client_examples.cancel(mcp_tasks_server) == "cancelled"
    assert await client_examples.call_with_token(mcp_tasks_server, "unchecked here") == "Crunched 2 steps."


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.integration
@pytest.mark.anyio
async def test_the_writing_page_results_retries_and_terminate_examples(mcp_tasks_client, mcp_tasks_extension) -> None:
    structured = await mcp_tasks_client.call_tool("forecast", {"city": "Oslo"})
    assert structured.structured_content == {"city": "Oslo", "high_c": 21.5, "low_c": 12.0}
    refused = await mcp_tasks_client.call_tool("forecast", {"city": " "})
    assert refused.is_error and refused.content[0].text == "Error executing tool forecast: Name a city."

    handle = await mcp_tasks_extension.start(mcp_tasks_client, "fetch", {"url": f"http://127.0.0.1:{_closed_port()}/"})
    messages = [state.status_message async for state in handle.updates()]
    assert handle.status == "failed"
    assert "Retrying (attempt 3) after URLError" in messages  # two retries, then the failure

    handle = await mcp_tasks_extension.start(mcp_tasks_client, "render", {"frames": 2})
    await handle.cancel()
    assert handle.status == "cancelled"


def _block_after(text: str, marker: str) -> list[str]:
    """The lines of the fenced block after `marker` (the next fence after it)."""
    rest = text[text.index(marker) + len(marker) :].lstrip("\n")
    assert rest.startswith("```"), f"no fenced block after {marker}"
    body = rest.split("\n", 1)[1]
    return body[: body.index("```")].rstrip("\n").splitlines()


@pytest.mark.integration
def test_getting_started_first_tool_prints_what_the_page_shows(tmp_path: Path) -> None:
    """The reader's way: the page's code saved as words.py in an empty directory, the page's command run there."""
    page = (DOCS / "getting-started.md").read_text()
    expected = _block_after(page, "<!-- test:first-tool-output -->")
    command = next(line for line in page.splitlines() if line.startswith("celery-mcp-tasks dev words "))
    args = command.split(" ", 2)[2]  # after "celery-mcp-tasks dev"
    app, _, call = args.partition(" --call ")
    tool, _, raw = call.partition(" ")
    source = (ROOT / "examples" / "guide" / "first_tool.py").read_text()
    start, end = source.index("# --8<-- [start:tool]\n"), source.index("# --8<-- [end:tool]")
    (tmp_path / f"{app}.py").write_text(source[start:end].split("\n", 1)[1])
    port = _closed_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "CELERY_"))}
    env["PYTHONPATH"] = str(ROOT / "src")  # not the checkout: `words` comes from the directory dev runs in
    arguments = raw.strip("'")  # the shell passes the JSON as written: its \n is JSON's escape
    done = subprocess.run(
        [sys.executable, "-m", "celery_mcp_tasks.cli", "dev", app, "--port", str(port), "--call", tool, arguments],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = iter(done.stdout.splitlines())
    for line in expected:  # in order; other lines (e.g. "Started") may come between
        assert any(out == line for out in printed), f"not printed (in order): {line!r}\n{done.stdout}"


def test_the_readme_example_is_the_file_the_docs_include_and_it_declares_its_tool() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```python\n") + len("```python\n")
    shown = readme[start : readme.index("```", start)]
    source = (ROOT / "examples" / "guide" / "readme.py").read_text()
    section = source[source.index("# --8<-- [start:readme]\n") + 24 : source.index("# --8<-- [end:readme]")]
    assert shown.rstrip() == section.rstrip(), "README.md's example and examples/guide/readme.py differ: change both"

    from examples.guide import readme as example

    assert set(internals(example.tasks).tools) == {"write_report"}
    assert example.tasks.server.has_tool("write_report")


@pytest.mark.integration
@pytest.mark.anyio
async def test_the_readme_example_asks_then_writes(tmp_path: Path) -> None:
    from mcp import Client

    from celery_mcp_tasks.client import TasksClient
    from celery_mcp_tasks.testing import ScriptedAnswers, start_deployment

    deployment = start_deployment("examples.guide.readme", tmp_path / "data", cwd=ROOT)
    try:
        answers = ScriptedAnswers().when("tides", {"ok": True}).when("otters", {"ok": False})  # else: decline
        async with Client(deployment.url, extensions=[TasksClient()], elicitation_callback=answers) as client:
            result = await client.call_tool("write_report", {"topic": "tides", "sections": 1})
            assert result.content[0].text == "A 1-section report on tides."
            for topic in ("otters", "beavers"):  # "no", then a decline: nothing written
                result = await client.call_tool("write_report", {"topic": topic, "sections": 1})
                assert result.content[0].text == f"No report on {topic}."
        assert answers.asked == [f"Write 1 sections on {topic}?" for topic in ("tides", "otters", "beavers")]
    finally:
        deployment.stop()


# -- the reference says what the code does ---------------------------------------------------


def test_the_getting_started_page_shows_the_readmes_first_command_and_output() -> None:
    readme = (ROOT / "README.md").read_text()
    page = (DOCS / "getting-started.md").read_text()
    command = _block_after(readme, "<!-- ci:first-command -->")
    output = _block_after(readme, "<!-- ci:first-command-output -->")
    assert "\n".join(command) in page
    assert "\n".join(output) in page


def _settings_read_by_the_code() -> set[str]:
    """Every name config.py reads, plus any MCP_TASKS_* another module reads from the environment itself."""
    package = ROOT / "src" / "celery_mcp_tasks"
    names = set(re.findall(r'"((?:MCP_TASKS|CELERY)_[A-Z0-9_]+)"', (package / "config.py").read_text()))
    for module in package.rglob("*.py"):
        names |= set(re.findall(r'environ\.get\("(MCP_TASKS_[A-Z0-9_]+)"', module.read_text()))
    retired = {"MCP_TASKS_LISTEN_ENTRY"}  # config.RETIRED_SETTINGS: ignored when set
    prefixes = {name for name in names if name.endswith("_")}  # config.NOT_SETTINGS: the tests' own names
    return names - retired - prefixes


def test_every_public_name_is_on_a_reference_page() -> None:
    """What `celery_mcp_tasks`, `.client` and `.ops` export has a `::: ...` entry (a new name cannot go unlisted)."""
    import celery_mcp_tasks
    import celery_mcp_tasks.client
    import celery_mcp_tasks.ops

    pages = "".join((DOCS / "reference" / name).read_text() for name in ("api.md", "client.md"))
    documented = {path.rsplit(".", 1)[-1] for path in re.findall(r"^::: ([\w.]+)$", pages, re.MULTILINE)}
    exported = {*celery_mcp_tasks.__all__, *celery_mcp_tasks.client.__all__, *celery_mcp_tasks.ops.__all__}
    assert exported - documented == set(), "add a `::: name` entry to docs/reference/api.md or client.md"


def test_every_setting_in_config_is_on_the_settings_page() -> None:
    names = _settings_read_by_the_code()
    assert {"MCP_TASKS_DATABASE_URL", "CELERY_BROKER_URL", "MCP_TASKS_METRICS"} <= names
    page = (DOCS / "reference" / "settings.md").read_text()
    missing = sorted(name for name in names if f"`{name}`" not in page)
    assert missing == [], f"settings missing from docs/reference/settings.md: {missing}"


def _help(command: str) -> str:
    from celery_mcp_tasks.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([command, "--help"] if command else ["--help"])
    return out.getvalue()


def _words(text: str) -> list[str]:
    return text.split()  # the help's words in order: wrapping (argparse's, per Python version) aside


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_the_cli_reference_shows_the_help_of(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every word of the help, not only the options: a reworded or new help text shows on the page."""
    monkeypatch.setenv("COLUMNS", "100")
    shown = (CLI_HELP / f"{command or 'celery-mcp-tasks'}.txt").read_text()
    assert _words(shown) == _words(_help(command)), "run `python -m tests.test_docs_examples` to regenerate"


def test_the_cli_reference_lists_every_command() -> None:
    page = (DOCS / "reference" / "cli.md").read_text()
    listed = set(re.findall(r'--8<-- "docs/reference/cli/(\w+)\.txt"', page))
    usage = " ".join(_help("").split("\n\n", 1)[0].split())  # the usage block (it wraps)
    assert listed == set(COMMANDS) == set(re.search(r"\{([\w,]+)\}", usage).group(1).split(","))  # type: ignore[union-attr]


def regenerate_cli_help() -> None:
    """Write docs/reference/cli/<command>.txt from the CLI's own --help (at 100 columns)."""
    os.environ["COLUMNS"] = "100"
    CLI_HELP.mkdir(parents=True, exist_ok=True)
    (CLI_HELP / "celery-mcp-tasks.txt").write_text(_help(""))
    for command in COMMANDS:
        (CLI_HELP / f"{command}.txt").write_text(_help(command))
        print(f"wrote {CLI_HELP / command}.txt")


if __name__ == "__main__":
    regenerate_cli_help()


def test_the_revision_the_docs_show_is_the_head_this_release_migrates_to() -> None:
    from celery_mcp_tasks.preflight import script_heads

    (head,) = script_heads()[0]
    shown = {
        (page.name, revision)
        for page in (ROOT / "docs").rglob("*.md")
        for revision in re.findall(r"(?:at head|behind) (\d{4})\b", page.read_text())
    }
    assert shown and {revision for _, revision in shown} == {head}, shown
