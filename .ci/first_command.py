"""The README's first command, run as a newcomer runs it: the wheel alone, outside the checkout.

    python3 .ci/first_command.py --wheel DIST/x.whl --work DIR [--readme README.md]

The command and its expected output are read from the README so the two cannot drift:

    <!-- ci:first-command -->
    ```sh
    pip install . && celery-mcp-tasks dev examples.quickstart.app --call ...
    ```
    <!-- ci:first-command-output -->
    ```
    created task: status=working
    ...
    ```

`pip install . && ` becomes "install the built wheel, no extras, into a fresh venv"; the rest runs
with that venv's bin first on PATH and no MCP_TASKS_*/CELERY_* variable, from a directory holding
only a copy of the README's app (examples/quickstart). It must exit 0, print every expected line
in order (other lines may come between), and leave no process behind.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from outside import (
    ROOT,
    Failure,
    Proc,
    check_imports,
    clean_env,
    copy_app,
    kill_leftovers,
    make_venv,
    package_location,
    step,
)

PREFIX = "pip install . && "
COMMAND_MARKER = "<!-- ci:first-command -->"
OUTPUT_MARKER = "<!-- ci:first-command-output -->"
TIMEOUT_S = 180.0


def block_after(readme: Path, marker: str, fence: str) -> list[str]:
    """The lines of the fenced block that follows `marker` (its opening fence must be `fence`)."""
    lines = readme.read_text().splitlines()
    at = [i for i, line in enumerate(lines) if line.strip() == marker]
    if len(at) != 1:
        raise Failure(f"{readme}: expected the marker {marker} exactly once, found it {len(at)} times")
    rest = iter(lines[at[0] + 1 :])
    opening = next((line for line in rest if line.strip()), "")
    if opening.strip() != fence:
        raise Failure(f"{readme}: the line after {marker} must open a {fence} block, found {opening!r}")
    block = []
    for line in rest:
        if line.strip() == "```":
            return block
        block.append(line)
    raise Failure(f"{readme}: the block after {marker} is never closed")


def first_command(readme: Path) -> str:
    lines = [line.strip() for line in block_after(readme, COMMAND_MARKER, "```sh") if line.strip()]
    if len(lines) != 1:
        raise Failure(
            f"{readme}: the block after {COMMAND_MARKER} must hold exactly one command line, found {len(lines)}"
        )
    if not lines[0].startswith(PREFIX):
        raise Failure(
            f"{readme}: the first command must start with {PREFIX!r} (CI replaces it by installing the "
            f"wheel), found {lines[0]!r}"
        )
    return lines[0][len(PREFIX) :]


def missing_in_order(expected: list[str], output: list[str]) -> str | None:
    """The first expected line that does not appear, in order, in `output`; None when all do."""
    remaining = iter(line.rstrip() for line in output)
    for line in expected:
        if not any(got == line for got in remaining):
            return line
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True, help="an empty directory outside the checkout")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = parser.parse_args()
    work = args.work.resolve()
    try:
        command = first_command(args.readme)
        expected = [line.rstrip() for line in block_after(args.readme, OUTPUT_MARKER, "```") if line.strip()]
        if not expected:
            raise Failure(f"{args.readme}: the block after {OUTPUT_MARKER} is empty")
        step(f"first command: `{PREFIX.strip(' &')}` = pip install {args.wheel.name} (no extras) into a fresh venv")
        venv = work / "venv"
        python = make_venv(venv, str(args.wheel.resolve()))
        check_imports(python, work)
        app = copy_app(ROOT / "examples", work / "app")
        env = clean_env(venv)
        print(f"   celery_mcp_tasks from {package_location(python, app, env)}")
        step(f"first command: {command}   (in {app})")
        started = time.monotonic()
        run = Proc("the first command", ["bash", "-c", command], cwd=app, env=env, log=work / "first-command.log")
        try:
            code = run.wait(TIMEOUT_S)
        finally:
            output = run.output()
            print("\n".join(f"   | {line}" for line in output.splitlines()), flush=True)
        print(f"   exit status {code} after {time.monotonic() - started:.1f} s")
        if code != 0:
            raise Failure(f"the README's first command exited with status {code}")
        missing = missing_in_order(expected, output.splitlines())
        if missing is not None:
            raise Failure(f"the README's first command did not print (in the README's order) the line {missing!r}")
        time.sleep(1.0)  # anything it started has had time to end
        left = kill_leftovers(app)
        if left or run.group_alive():
            run.kill()
            raise Failure(
                "the first command left processes running after it exited (killed): "
                + "; ".join(f"{pid}: {cmd}" for pid, cmd in left.items())
            )
    except Failure as failure:
        print(f"FAILED: {failure}", file=sys.stderr, flush=True)
        kill_leftovers(work)
        return 1
    print("first command: ok (its output holds every line the README shows, in order)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
