"""The house's layering, checked from the tree: the domain loads no adapter, adapters never import each other,
not even through a shared module (lazy imports inside functions count), `app.py` imports no operations module,
and no module of the package reaches itself through its imports (imports for types only, under
`if TYPE_CHECKING:`, count too, and so do lazy ones named by a string: `import_module("...")`, "module:Attr").
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "celery_mcp_tasks"
DOMAIN = ["model.py", "service.py", "store"]
ADAPTERS = ["mcp", "worker", "client", "console"]
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


@pytest.mark.parametrize("path", _files("notify"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_push_transports_sit_below_the_service(path: Path) -> None:
    """The service calls a `Notifier`; the transports import neither the service nor the app back."""
    above = ("celery_mcp_tasks.service", "celery_mcp_tasks.app")
    wrong = sorted(name for name in _imports(path) if any(_reaches(name, prefix) for prefix in above))
    assert not wrong, f"{path.relative_to(PACKAGE)} imports {wrong}"


@pytest.mark.integration
def test_importing_the_domain_loads_neither_the_sdk_nor_celery() -> None:
    probe = (
        "import sys, celery_mcp_tasks, celery_mcp_tasks.model, celery_mcp_tasks.store.sql, celery_mcp_tasks.service; "
        "print(sorted(m for m in ('mcp', 'mcp_types', 'celery', 'kombu') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "[]"


# -- indirect links: an adapter reaches another through a shared module ------------------------------------


def _runtime_imports(path: Path) -> set[str]:
    """Every package module `path` imports when it runs (lazy imports in functions included, `TYPE_CHECKING`
    blocks not): `from pkg import name` counts `pkg.name` when that is a module of its own."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names if _file(f"{node.module}.{alias.name}"))
    return {name for name in found if _reaches(name, "celery_mcp_tasks") and _file(name)}


def _file(module: str) -> Path | None:
    parts = module.split(".")[1:]
    for candidate in (PACKAGE.joinpath(*parts).with_suffix(".py"), PACKAGE.joinpath(*parts, "__init__.py")):
        if parts and candidate.exists():
            return candidate
    return None


def _loaded_with(module: str) -> set[str]:
    """`module` and its parent packages: importing it runs each of their `__init__`."""
    parts = module.split(".")
    return {".".join(parts[:n]) for n in range(2, len(parts) + 1)}


def _adapter_of(module: str) -> str | None:
    return next((a for a in ADAPTERS if _reaches(module, f"celery_mcp_tasks.{a}")), None)


def _reachable_adapters(adapter: str) -> dict[str, list[str]]:
    """Other adapters (and app) reached from `adapter`'s files through non-adapter modules: the import chain to each."""
    chains: dict[str, list[str]] = {}
    seen: set[str] = set()
    todo: list[tuple[str, list[str]]] = []
    for path in _files(adapter):
        for name in _runtime_imports(path):
            todo += [(loaded, [str(path.relative_to(PACKAGE)), loaded]) for loaded in _loaded_with(name)]
    while todo:
        module, chain = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        owner = _adapter_of(module)
        if owner == adapter:
            continue  # its own modules are checked as its files
        if owner is not None or module == "celery_mcp_tasks.app":
            chains.setdefault(module, chain)
            continue
        path = _file(module)
        for name in _runtime_imports(path) if path else ():
            todo += [(loaded, [*chain, loaded]) for loaded in _loaded_with(name) if loaded not in seen]
    return chains


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_an_adapter_reaches_no_other_through_a_shared_module(adapter: str) -> None:
    """e.g. `mcp/` importing an `ops` module that imports `worker/`, even lazily inside a function."""
    chains = _reachable_adapters(adapter)
    assert not chains, "\n".join(" -> ".join(chain) for chain in chains.values())


@pytest.mark.parametrize("module", ["propagation.py", "ops/root_handler.py"])
def test_the_modules_adapters_share_with_ops_import_neither_celery_nor_the_sdk(module: str) -> None:
    """What `mcp/` and `worker/` import of tracing and logging: opentelemetry-api and the standard library only."""
    outside = ("mcp", "mcp_types", "celery", "kombu", "celery_mcp_tasks.ops.tracing", "celery_mcp_tasks.ops.logs")
    wrong = sorted(name for name in _imports(PACKAGE / module) if any(_reaches(name, p) for p in (*outside, *OUTSIDE)))
    assert not wrong, f"{module} imports {wrong}"


@pytest.mark.parametrize("module", ["ops/logs.py", "ops/redaction.py", "ops/tracing.py", "propagation.py"])
def test_logging_and_tracing_import_nothing_of_the_sdk_adapter(module: str) -> None:
    """The root handler's name lives in `ops.root_handler`, which `mcp.server` imports: not the other way round."""
    wrong = sorted(name for name in _runtime_imports(PACKAGE / module) if _reaches(name, "celery_mcp_tasks.mcp"))
    assert not wrong, f"{module} imports {wrong}"


def _module_of(path: Path) -> str:
    parts = ["celery_mcp_tasks", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


_NAMED = re.compile(r"(celery_mcp_tasks(?:\.\w+)*):\w+")
"""A "module:Attr" string: how a table names what it imports lazily (kombu transports, plugins)."""


def _named_lazily(node: ast.AST) -> str | None:
    """The module a string names for a lazy import: `import_module("pkg.mod")`'s literal, or "pkg.mod:Attr"."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if callee == "import_module" and isinstance(node.args[0].value, str):
            return node.args[0].value
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        named = _NAMED.fullmatch(node.value)
        return named.group(1) if named else None
    return None


def _every_import(path: Path) -> set[str]:
    """Every package module `path` names in an import, wherever it stands: at the top, inside a function,
    under `if TYPE_CHECKING:`, or in a string imported lazily (`_named_lazily`). `from pkg import name`
    names `pkg.name` when that is a module of its own (a submodule), else `pkg` (a name `pkg`'s `__init__`
    defines or hands on); relative imports resolved."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        lazily = _named_lazily(node)
        if lazily is not None:
            found.add(lazily)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if _file(f"{base}.{alias.name}") else base)
    return {
        name for name in found if _reaches(name, "celery_mcp_tasks") and (name == "celery_mcp_tasks" or _file(name))
    }


def _import_graph() -> dict[str, set[str]]:
    """Module -> every package module it imports (type-only and lazy imports included): the structure a
    reader (or a structure tool) sees, not only what runs. Every `.py` file of the package is a node."""
    return {
        _module_of(path): {name for name in _every_import(path) if name != _module_of(path)}
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_the_package_has_no_import_circle() -> None:
    """Modules by concept: no two modules (or longer loops) import each other, whatever the import: at the
    top, lazily inside a function, or for types only under `if TYPE_CHECKING:`."""
    circles = _cycles(_import_graph())
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_circle_check_sees_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_the_import_graph_counts_every_kind_of_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Type-only, lazy and relative imports are edges; `from pkg import module` is an edge to the module."""
    package = tmp_path / "celery_mcp_tasks"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from celery_mcp_tasks.sub.low import Value\n")
    (package / "sub" / "low.py").write_text("class Value: ...\n")
    (package / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from celery_mcp_tasks.lazy import f\n"
    )
    (package / "lazy.py").write_text("def f():\n    from . import typed\n")
    (package / "named.py").write_text("from celery_mcp_tasks.sub import low, Value\n")
    (package / "table.py").write_text('PLUGINS = {"one": "celery_mcp_tasks.sub.low:Value", "text": "not: a module"}\n')
    (package / "loader.py").write_text(
        "import importlib\ndef load():\n    return importlib.import_module('celery_mcp_tasks.table')\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    graph = _import_graph()
    assert graph["celery_mcp_tasks.typed"] == {"celery_mcp_tasks.lazy"}
    assert graph["celery_mcp_tasks.lazy"] == {"celery_mcp_tasks.typed"}
    assert graph["celery_mcp_tasks.named"] == {"celery_mcp_tasks.sub.low", "celery_mcp_tasks.sub"}
    assert graph["celery_mcp_tasks.sub"] == {"celery_mcp_tasks.sub.low"}
    assert graph["celery_mcp_tasks.table"] == {"celery_mcp_tasks.sub.low"}
    assert graph["celery_mcp_tasks.loader"] == {"celery_mcp_tasks.table"}
    assert _cycles(graph) == [["celery_mcp_tasks.lazy", "celery_mcp_tasks.typed", "celery_mcp_tasks.lazy"]]


def _seam_files() -> list[Path]:
    """Every module but the store's own and the service (which holds the store)."""
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] not in ("store", "service.py")]


@pytest.mark.parametrize("path", _seam_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_the_service_touches_the_store(path: Path) -> None:
    """Adapters, operations and the janitor go through `TaskService`; the concrete `SqlStore` is the
    composition root's alone (it builds one per process). Push's polling transport (`notify/push.py`) is
    bound to the store itself: it reads row versions for the notifier the service is built with."""
    tree = ast.parse(path.read_text())
    behind = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in ("store", "_store")]
    assert path.name == "push.py" or not behind, f"{path.name}:{behind} reads a store behind the service's back"
    if path.name != "app.py":
        concrete = [
            n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Name, ast.alias)) and "SqlStore" in ast.unparse(n)
        ]
        assert not concrete, f"{path.name}:{concrete} names SqlStore: use the Store protocol through the service"


def test_a_lazy_circle_named_by_strings_is_a_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table of "module:Attr" strings loaded with `import_module` hides no circle from the check."""
    package = tmp_path / "celery_mcp_tasks"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "root.py").write_text("from celery_mcp_tasks import plugins\n")
    (package / "plugins.py").write_text('WHERE = {"P": "celery_mcp_tasks.plugin_impl:P"}\n')
    (package / "plugin_impl.py").write_text("def f():\n    from celery_mcp_tasks.root import x\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert _cycles(_import_graph()) == [
        [
            "celery_mcp_tasks.plugin_impl",
            "celery_mcp_tasks.root",
            "celery_mcp_tasks.plugins",
            "celery_mcp_tasks.plugin_impl",
        ]
    ]


def test_app_imports_no_operations_module() -> None:
    """The composition root names no `ops` module, not even lazily by a string: it asks the `ops` package."""
    wrong = sorted(name for name in _every_import(PACKAGE / "app.py") if name.startswith("celery_mcp_tasks.ops."))
    assert not wrong, f"app.py imports {wrong}"


def test_the_ops_package_imports_none_of_its_modules_when_imported() -> None:
    """What `app.py` imports of `ops` (its `__init__`) loads no operations module: each is a string until asked."""
    loaded = sorted(
        name for name in _runtime_imports(PACKAGE / "ops" / "__init__.py") if name != "celery_mcp_tasks.ops"
    )
    assert not loaded, f"ops/__init__.py imports {loaded}"


def test_every_built_in_plugin_is_named_by_a_string_that_resolves() -> None:
    from celery_mcp_tasks import ops
    from celery_mcp_tasks.plugin import Plugin

    for name, where in ops.BUILT_IN.items():
        assert where.endswith(f":{name}")
        assert issubclass(getattr(ops, name), Plugin)
