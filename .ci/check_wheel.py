"""Fail when the built wheel or sdist lacks what a plain `pip install` needs at run time.

    python3 .ci/check_wheel.py DIST_DIR REPO_ROOT

The wheel must carry the alembic environment (`script_location = celery_mcp_tasks:migrations`
resolves inside the installed package), every version the repository's `migrations/versions`
has, `py.typed`, every template and static file of the console (its pages fetch nothing from a
CDN), and the license in its dist-info; the sdist must carry the license too. The
wheel checked is the one built from the sdist, as pip builds it from PyPI (the package's
`migrations` is a symlink to the top-level directory: the sdist must hold real files).
"""

import sys
import tarfile
import zipfile
from pathlib import Path

PACKAGE = "celery_mcp_tasks"


def only(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    if len(found) != 1:
        sys.exit(f"check_wheel: expected exactly one {pattern} in {dist}, found {[p.name for p in found]}")
    return found[0]


def main() -> int:
    dist, root = Path(sys.argv[1]), Path(sys.argv[2])
    wheel, sdist = only(dist, "*.whl"), only(dist, "*.tar.gz")
    versions = sorted(p.name for p in (root / "migrations" / "versions").glob("*.py"))
    if not versions:
        sys.exit(f"check_wheel: {root}/migrations/versions has no *.py: nothing to check against")

    console = root / "src" / PACKAGE / "console"
    assets = sorted(
        p.relative_to(root / "src").as_posix()
        for folder in ("templates", "static")
        for p in (console / folder).iterdir()
        if p.is_file()
    )
    if not any(a.endswith(".html") for a in assets) or not any(a.endswith(".js") for a in assets):
        sys.exit(f"check_wheel: {console} has no templates or no script: nothing to check against")

    names = set(zipfile.ZipFile(wheel).namelist())
    dist_info = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    if len(dist_info) != 1:
        sys.exit(f"check_wheel: {wheel.name} has {len(dist_info)} .dist-info directories")
    (info,) = dist_info
    required = [
        f"{PACKAGE}/migrations/env.py",
        f"{PACKAGE}/migrations/script.py.mako",
        *(f"{PACKAGE}/migrations/versions/{v}" for v in versions),
        f"{PACKAGE}/py.typed",
        *assets,
        f"{info}/licenses/LICENSE",
    ]
    missing = [f"{wheel.name}: missing {name}" for name in required if name not in names]
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    for line in ("License-Expression: Apache-2.0", "License-File: LICENSE"):
        if line not in metadata.splitlines():
            missing.append(f"{wheel.name}: METADATA lacks {line!r}")

    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[-1]: m for m in tar.getmembers()}
    for name in ("LICENSE", f"src/{PACKAGE}/migrations/env.py"):
        if name not in members:
            missing.append(f"{sdist.name}: missing {name}")

    if missing:
        print("\n".join(f"check_wheel: {line}" for line in missing), file=sys.stderr)
        return 1
    print(
        f"check_wheel: {wheel.name} and {sdist.name} hold the migrations ({', '.join(versions)}), py.typed, "
        f"the console's {len(assets)} templates and static files, and LICENSE"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
