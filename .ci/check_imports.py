"""Fail when the installed package imports something its declared dependencies do not bring.

    VENV/bin/python .ci/check_imports.py [--extras postgres,redis]

Run in a fresh venv holding only the wheel (and the extras named). Every absolute import in the
installed `celery_mcp_tasks` (the CLI and the alembic environment included) must be the standard
library, the package itself, or a module of a distribution in the base dependencies' closure (read
from the installed metadata, so a test extra cannot hide a missing one), and be importable here.
An import only an extra brings (psycopg: `postgres`) must be guarded: inside a function, a `try`
or `if TYPE_CHECKING`, never at a module's top level, since the base install would fail to import
that module; when its extra is named it must be importable too. The one exception is a module
only its extra's tool loads (the pytest plugin, `testing`: pytest).
"""

import argparse
import ast
import importlib.util
import re
import sys
from importlib import metadata
from pathlib import Path

DIST = "celery-mcp-tasks"
PACKAGE = "celery_mcp_tasks"
NOT_RUNTIME_EXTRAS = {"test"}
# Modules that only their extra's tool loads (a pytest plugin, through its entry point): their
# top-level imports of that extra are fine, since nothing else imports them.
LOADED_BY_EXTRA = {"celery_mcp_tasks/testing.py": "testing"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(dist: str, extras: frozenset[str]) -> list[tuple[str, frozenset[str]]]:
    """(name, extras) of what `dist[extras]` requires; platform markers are kept (over-inclusive)."""
    out = []
    for req in metadata.requires(dist) or []:
        spec, _, marker = req.partition(";")
        wanted = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        if wanted and norm(wanted.group(1)) not in extras:
            continue
        found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", spec)
        if found:
            out.append(
                (norm(found.group(1)), frozenset(norm(e) for e in (found.group(2) or "").split(",") if e.strip()))
            )
    return out


def closure(extras: frozenset[str]) -> set[str]:
    """Every distribution `celery-mcp-tasks[extras]` brings, followed through its dependencies' extras."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(norm(DIST), extras)]
    while todo:
        item = todo.pop()
        if item in seen:
            continue
        seen.add(item)
        try:
            todo += requirements(*item)
        except metadata.PackageNotFoundError:
            pass  # not installed here (another platform's marker); find_spec decides below
    return {name for name, _ in seen}


def modules_of(dists: set[str]) -> set[str]:
    """Top-level modules of `dists`; one not installed here (an extra) is taken to be named after itself."""
    installed = {m for m, owners in metadata.packages_distributions().items() if any(norm(d) in dists for d in owners)}
    absent = set()
    for name in dists:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            absent.add(name.replace("-", "_"))
    return installed | absent


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(tree: ast.AST, guarded: bool = False):
    """(top-level module, line, guarded) for each absolute import; guarded = not run at module import."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], node.lineno, guarded
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0], node.lineno, guarded
        inner = (
            guarded
            or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            or (isinstance(node, ast.Try) and bool(node.handlers))
            or (isinstance(node, ast.If) and is_type_checking(node.test))
        )
        yield from imports(node, inner)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--extras", default="", help="extras installed alongside the wheel, e.g. postgres,redis")
    named = frozenset(norm(e) for e in parser.parse_args().extras.split(",") if e.strip())

    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        sys.exit(f"check_imports: {PACKAGE} is not installed in {sys.prefix}")
    root = Path(spec.origin).parent
    declared = {norm(e) for e in metadata.metadata(DIST).get_all("Provides-Extra") or []}
    if not named <= declared:
        sys.exit(f"check_imports: unknown extras {sorted(named - declared)}; {DIST} declares {sorted(declared)}")
    base = modules_of(closure(frozenset()))
    by_extra = {extra: modules_of(closure(frozenset({extra}))) - base for extra in declared - NOT_RUNTIME_EXTRAS}
    direct = modules_of({name for name, _ in requirements(DIST, frozenset())})

    problems, transitive = [], set()
    files = sorted(root.rglob("*.py"))
    for path in files:
        where = path.relative_to(root.parent)
        for top, line, guarded in imports(ast.parse(path.read_text(), str(path))):
            if top in sys.stdlib_module_names or top == PACKAGE or top == "__future__":
                continue
            extras = sorted(e for e, mods in by_extra.items() if top in mods)
            if top in base:
                if importlib.util.find_spec(top) is None:
                    problems.append(f"{where}:{line}: {top} is declared but not importable here")
                if top not in direct:
                    transitive.add(top)
            elif not extras:
                problems.append(f"{where}:{line}: {top} is brought by no base dependency and no extra")
            elif not guarded and LOADED_BY_EXTRA.get(str(where)) in extras:
                continue
            elif not guarded:
                problems.append(
                    f"{where}:{line}: {top} (extra {'/'.join(extras)}) is imported at module level: "
                    "the base install cannot import this module"
                )
            elif set(extras) & named and importlib.util.find_spec(top) is None:
                problems.append(
                    f"{where}:{line}: {top} is not importable although [{','.join(sorted(named))}] is installed"
                )
    if problems:
        print("\n".join(f"check_imports: {p}" for p in problems), file=sys.stderr)
        return 1
    if transitive:
        print(
            f"check_imports: note: imported directly but only a dependency of a dependency: {', '.join(sorted(transitive))}"
        )
    print(
        f"check_imports: {len(files)} files under {root}: every import is covered"
        f" by the base dependencies{' and [' + ','.join(sorted(named)) + ']' if named else ''}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
