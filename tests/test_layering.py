"""The house's layering, checked from the tree: the domain loads no adapter, adapters never import each other."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "celery_mcp_tasks"
DOMAIN = ["model.py", "service.py", "store"]
ADAPTERS = ["mcp", "worker", "client"]
OUTSIDE = (
    "mcp",
    "mcp_types",
    "celery",
    "kombu",
    "celery_mcp_tasks.mcp",
    "celery_mcp_tasks.worker",
    "celery_mcp_tasks.client",
    "celery_mcp_tasks.protocol",
    "celery_mcp_tasks.app",
)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _files(*parts: str) -> list[Path]:
    files: list[Path] = []
    for part in parts:
        target = PACKAGE / part
        files.extend(sorted(target.rglob("*.py")) if target.is_dir() else [target] if target.exists() else [])
    return files


def _reaches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("path", _files(*DOMAIN), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_domain_imports_no_adapter(path: Path) -> None:
    wrong = sorted(name for name in _imports(path) if any(_reaches(name, prefix) for prefix in OUTSIDE))
    assert not wrong, f"{path.name} imports {wrong}: the domain speaks neither the SDK nor Celery"


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_an_adapter_never_imports_another(adapter: str) -> None:
    others = [f"celery_mcp_tasks.{other}" for other in ADAPTERS if other != adapter] + ["celery_mcp_tasks.app"]
    for path in _files(adapter):
        wrong = sorted(name for name in _imports(path) if any(_reaches(name, prefix) for prefix in others))
        assert not wrong, f"{path.relative_to(PACKAGE)} imports {wrong}"


@pytest.mark.integration
def test_importing_the_domain_loads_neither_the_sdk_nor_celery() -> None:
    probe = (
        "import sys, celery_mcp_tasks, celery_mcp_tasks.model, celery_mcp_tasks.store.sql, celery_mcp_tasks.service; "
        "print(sorted(m for m in ('mcp', 'mcp_types', 'celery', 'kombu') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "[]"
