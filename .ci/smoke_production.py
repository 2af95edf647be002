"""The production install, proven: the wheel with [postgres,redis] only, on PostgreSQL and Redis.

    python3 .ci/smoke_production.py --wheel DIST/x.whl --work DIR [--postgres URL] [--redis URL]

In a fresh venv outside the checkout (no test extra, so nothing a test tool drags in can hide a
missing dependency), from a directory holding only the README's app, with a throwaway database:
`celery-mcp-tasks db upgrade`; then web (`serve --no-migrate`), `celery worker` and `celery beat`
(which must send the janitor); one task created over HTTP with the package's own
`celery-mcp-tasks call` must reach `completed`; then SIGTERM to each, which must end it and every
process of its group within 15 s, cleanly (status 0, or uvicorn's re-raised SIGTERM). Logs are
printed on failure; the database is dropped whatever happens.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
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

APP = "examples.quickstart.app"
EXTRAS = "postgres,redis"
JANITOR_SENT = re.compile(r"Sending due task .*\(celery_mcp_tasks\.janitor\)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def psql(admin_url: str, sql: str) -> None:
    subprocess.run(
        ["psql", admin_url, "-v", "ON_ERROR_STOP=1", "-qc", sql],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


def wait_until(what: str, ready, procs: list[Proc], timeout: float) -> None:
    """Poll `ready()` until true; fail early when one of `procs` has died meanwhile."""
    deadline = time.monotonic() + timeout
    while not ready():
        for proc in procs:
            if proc.popen.poll() is not None:
                raise Failure(f"{proc.name} exited with status {proc.popen.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


def healthz(url: str) -> bool:
    """The docker-compose healthcheck, verbatim in spirit: the Health plugin's probe answers 200 on the ops port."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def smoke(python: Path, app: Path, env: dict[str, str], work: Path) -> None:
    bin_dir = python.parent
    step("celery-mcp-tasks db upgrade")
    upgrade = subprocess.run(
        [str(bin_dir / "celery-mcp-tasks"), "db", "upgrade"],
        cwd=app,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if upgrade.returncode != 0:
        raise Failure(
            f"celery-mcp-tasks db upgrade exited with {upgrade.returncode}:\n{upgrade.stdout}{upgrade.stderr}"
        )

    port, ops_port = free_port(), free_port()
    step(f"web (serve --port {port} --ops-port {ops_port} --no-migrate, MCP_TASKS_HEALTH=on), worker and beat")
    procs = [
        Proc(
            "web",
            [
                str(bin_dir / "celery-mcp-tasks"),
                *("serve", APP, "--port", str(port), "--ops-port", str(ops_port), "--no-migrate"),
            ],
            cwd=app,
            env={**env, "MCP_TASKS_HEALTH": "on"},
            log=work / "web.log",
        ),
        Proc(
            "worker",
            [str(bin_dir / "celery"), "-A", APP, "worker", "--loglevel", "INFO"],
            cwd=app,
            env=env,
            log=work / "worker.log",
        ),
        Proc(
            "beat",
            [str(bin_dir / "celery"), "-A", APP, "beat", "--loglevel", "INFO"],
            cwd=app,
            env=env,
            log=work / "beat.log",
        ),
    ]
    _web, worker, beat = procs
    try:
        wait_until(
            f"GET http://127.0.0.1:{ops_port}/readyz to answer 200 (the ops port; the MCP port serves /mcp only)",
            lambda: healthz(f"http://127.0.0.1:{ops_port}/readyz"),
            procs,
            60,
        )
        wait_until("the worker to be ready", lambda: " ready." in worker.output(), procs, 60)
        wait_until(
            "beat to send the janitor (celery_mcp_tasks.janitor)",
            lambda: JANITOR_SENT.search(beat.output()) is not None,
            procs,
            30,
        )
        print("   web healthy, worker ready, beat sent the janitor", flush=True)

        arguments = '{"topic": "smoke", "sections": 1}'
        step(f"celery-mcp-tasks call http://127.0.0.1:{port}/mcp write_report '{arguments}'")
        call = subprocess.run(
            [str(bin_dir / "celery-mcp-tasks"), "call", f"http://127.0.0.1:{port}/mcp", "write_report", arguments],
            cwd=app,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=90,
        )
        print("\n".join(f"   | {line}" for line in (call.stdout + call.stderr).splitlines()), flush=True)
        if call.returncode != 0 or "status=completed" not in call.stdout:
            raise Failure(f"the task did not reach completed (call exited with {call.returncode})")

        step("SIGTERM to web, worker and beat")
        problems = [problem for proc in procs if (problem := proc.stop(15.0))]
        if problems:
            raise Failure("; ".join(problems))
    except BaseException:
        for proc in procs:
            proc.kill()
            print(
                f"== {proc.name} log (last 60 lines)\n" + "\n".join(proc.output().splitlines()[-60:]), file=sys.stderr
            )
        raise


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True, help="an empty directory outside the checkout")
    parser.add_argument(
        "--postgres",
        default=os.environ.get("MCP_TASKS_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
        help="a PostgreSQL URL allowed to CREATE DATABASE (a throwaway one is made)",
    )
    parser.add_argument("--redis", default=os.environ.get("MCP_TASKS_SMOKE_REDIS_URL", "redis://127.0.0.1:6379/14"))
    args = parser.parse_args()
    work = args.work.resolve()
    database = f"mcp_tasks_smoke_{os.getpid()}"
    created = False
    try:
        step(f"production smoke: pip install {args.wheel.name}[{EXTRAS}] (no test extra) into a fresh venv")
        venv = work / "venv"
        python = make_venv(venv, f"{args.wheel.resolve()}[{EXTRAS}]")
        check_imports(python, work, EXTRAS)
        app = copy_app(ROOT / "examples", work / "app")
        services = subprocess.run(
            [str(python), str(ROOT / ".ci" / "check_services.py")],
            cwd=work,
            env=clean_env(venv, MCP_TASKS_TEST_POSTGRES_URL=args.postgres, MCP_TASKS_TEST_REDIS_URL=args.redis),
            stdin=subprocess.DEVNULL,
        )
        if services.returncode != 0:
            raise Failure("PostgreSQL or Redis does not answer (see above)")
        psql(args.postgres, f"CREATE DATABASE {database}")
        created = True
        env = clean_env(
            venv,
            MCP_TASKS_DATABASE_URL=f"{args.postgres.rsplit('/', 1)[0]}/{database}",
            CELERY_BROKER_URL=args.redis,
            MCP_TASKS_JANITOR_INTERVAL_S="2",
        )
        print(f"   celery_mcp_tasks from {package_location(python, app, env)}; store {database}, broker {args.redis}")
        smoke(python, app, env, work)
    except (Failure, subprocess.TimeoutExpired) as failure:
        print(f"FAILED: {failure}", file=sys.stderr, flush=True)
        return 1
    finally:
        left = kill_leftovers(work)
        if left:
            print(
                "production smoke: killed leftover processes: " + "; ".join(f"{p}: {c}" for p, c in left.items()),
                file=sys.stderr,
            )
        if created:
            psql(args.postgres, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    if left:
        print("FAILED: processes were left running after the stop", file=sys.stderr)
        return 1
    print("production smoke: ok (db upgrade, web + worker + beat, a task completed over HTTP, clean stop)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
