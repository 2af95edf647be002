"""What the install-path checks share: a fresh venv, the user's app copied outside the checkout,
an environment with none of our settings, and processes whose stop is proven, not assumed.

Standard library only: it runs with the interpreter that runs CI, never the venv under test.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Failure(Exception):
    """One install-path check failed; the message is the line CI prints."""


def step(text: str) -> None:
    print(f"-- {text}", flush=True)


def make_venv(venv: Path, requirement: str) -> Path:
    """A fresh venv (no system site-packages) with `requirement` (the wheel, maybe with extras) installed."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", requirement],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if result.returncode != 0:
        raise Failure(f"pip install {requirement} into a fresh venv failed:\n{result.stdout}")
    return python


def check_imports(python: Path, cwd: Path, extras: str = "") -> None:
    """.ci/check_imports.py in the venv of `python`, away from the checkout (no source-tree imports)."""
    venv = python.parent.parent
    result = subprocess.run(
        [str(python), str(ROOT / ".ci" / "check_imports.py"), "--extras", extras],
        cwd=cwd,
        env=clean_env(venv),
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        raise Failure(
            f"the installed package imports what its dependencies"
            f"{' with [' + extras + ']' if extras else ''} do not bring (see above)"
        )


def copy_app(examples: Path, dest: Path) -> Path:
    """The user's app and nothing else of the checkout: examples/__init__.py and examples/quickstart/."""
    target = dest / "examples"
    target.mkdir(parents=True)
    shutil.copy2(examples / "__init__.py", target / "__init__.py")
    shutil.copytree(examples / "quickstart", target / "quickstart", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def clean_env(venv: Path, **settings: str) -> dict[str, str]:
    """The caller's environment without MCP_TASKS_*/CELERY_*, PYTHONPATH or an active venv; VENV's bin first."""
    caller_venv = os.environ.get("VIRTUAL_ENV")
    path = [
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if p and not (caller_venv and Path(p) == Path(caller_venv) / "bin")
    ]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MCP_TASKS_", "CELERY_")) and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(PATH=os.pathsep.join([str(venv / "bin"), *path]), VIRTUAL_ENV=str(venv), PYTHONNOUSERSITE="1")
    env.update(settings)
    return env


def package_location(python: Path, cwd: Path, env: dict[str, str]) -> Path:
    """Where `import celery_mcp_tasks` comes from when run as the user runs it; it must be the venv."""
    out = subprocess.run(
        [str(python), "-c", "import celery_mcp_tasks; print(celery_mcp_tasks.__file__)"],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise Failure(f"import celery_mcp_tasks failed in {python.parent.parent}:\n{out.stderr}")
    where = Path(out.stdout.strip()).resolve()
    venv = python.parent.parent.resolve()
    if not where.is_relative_to(venv) or where.is_relative_to(ROOT):
        raise Failure(f"celery_mcp_tasks was imported from {where}, not from the wheel installed in {venv}")
    return where


def leftovers(cwd: Path) -> dict[int, str]:
    """Processes still running in `cwd` (every process these checks start runs there), pid -> command line."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if Path(os.readlink(proc / "cwd")).is_relative_to(cwd):
                found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return found


def kill_leftovers(cwd: Path) -> dict[int, str]:
    """SIGKILL whatever still runs in `cwd`; returns what was found."""
    found = leftovers(cwd)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return found


class Proc:
    """A process in its own process group (as a supervisor would start it), its output in a log file."""

    def __init__(self, name: str, argv: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def group_alive(self) -> bool:
        try:
            os.killpg(self.popen.pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except OSError:
            pass
        self.popen.wait()

    def wait(self, timeout: float) -> int:
        """Wait for the process to end by itself; on timeout its group is killed and this raises."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise Failure(f"{self.name} did not finish within {timeout:g} s (killed)") from None

    def stop(self, timeout: float = 15.0) -> str | None:
        """SIGTERM to the process, as a supervisor sends it. None when it and every process of its group
        ended within `timeout`, cleanly, else what went wrong (the rest of the group is killed)."""
        if self.popen.poll() is not None:
            return f"{self.name} had already exited (status {self.popen.returncode}) before SIGTERM"
        started = time.monotonic()
        self.popen.send_signal(signal.SIGTERM)
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return f"{self.name} did not exit within {timeout:g} s of SIGTERM (killed)"
        while self.group_alive() and time.monotonic() - started < timeout:
            time.sleep(0.1)
        if self.group_alive():
            self.kill()
            return f"{self.name} exited but left processes of its group running {timeout:g} s after SIGTERM (killed)"
        took = time.monotonic() - started
        # uvicorn re-raises the SIGTERM it handled once its graceful shutdown is done: that is a clean stop too.
        if code not in (0, -signal.SIGTERM):
            return f"{self.name} exited with status {code} {took:.1f} s after SIGTERM"
        how = "status 0" if code == 0 else "re-raised SIGTERM"
        print(f"   {self.name} stopped in {took:.1f} s ({how}), nothing of its process group left", flush=True)
        return None
