#!/usr/bin/env bash
# The install paths a user meets, proven before any test extra is installed (CI runs this from
# .ci/run; run it alone while developing: `bash .ci/install_paths.sh`):
#   1. the sdist and, from it, the wheel (as pip builds it from PyPI), in a throwaway venv;
#   2. the wheel's and the sdist's contents (migrations, py.typed, LICENSE);
#   3. the README's first command, taken from the README, with the wheel and no extras;
#   4. the production smoke: the wheel with [postgres,redis] only, on PostgreSQL and Redis.
# Everything runs under a temporary directory outside the checkout; any failure exits non-zero.
#   $1                          work directory (default: a fresh temporary one, removed at exit)
#   FIRST_COMMAND_README        the README to read the first command from (default README.md)
#   MCP_TASKS_TEST_POSTGRES_URL where the smoke creates (and drops) its database
#   MCP_TASKS_SMOKE_REDIS_URL   the smoke's broker (default redis://127.0.0.1:6379/14)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${1:-}" ]; then
  WORK=$1
  mkdir -p "$WORK"
else
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
fi
WORK=$(cd "$WORK" && pwd -P)/install-paths
case "$WORK/" in "$(cd "$ROOT" && pwd -P)"/*)
  echo "install paths: the work directory $WORK must be outside the checkout $ROOT" >&2; exit 1 ;;
esac
rm -rf "$WORK" && mkdir -p "$WORK"
started=$SECONDS

echo "== install paths: build the sdist, then the wheel from it"
# What a commit holds (tracked plus new files, nothing ignored such as venvs or egg-info), so a
# stale build artefact of this checkout cannot end up in the distributions.
mkdir "$WORK/source"
git -C "$ROOT" ls-files -z --cached --others --exclude-standard \
  | (cd "$ROOT" && xargs -0 sh -c 'for f; do if [ -e "$f" ] || [ -L "$f" ]; then printf "%s\0" "$f"; fi; done' sh) \
  | tar -C "$ROOT" --null --no-recursion -T - -cf - | tar -C "$WORK/source" -xf -
python3 -m venv "$WORK/build-venv"
"$WORK/build-venv/bin/python" -m pip install -q build
# `python -m build` with neither --sdist nor --wheel builds the sdist, then the wheel from it.
"$WORK/build-venv/bin/python" -m build --outdir "$WORK/dist" "$WORK/source" >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; echo "install paths: python -m build failed" >&2; exit 1; }
python3 "$ROOT/.ci/check_wheel.py" "$WORK/dist" "$ROOT"
WHEEL=$(ls "$WORK"/dist/*.whl)

echo "== install paths: the README's first command (the wheel, no extras)"
mkdir "$WORK/first"
python3 "$ROOT/.ci/first_command.py" --wheel "$WHEEL" --work "$WORK/first" \
  --readme "${FIRST_COMMAND_README:-$ROOT/README.md}"

echo "== install paths: production smoke (the wheel with [postgres,redis] only)"
mkdir "$WORK/prod"
python3 "$ROOT/.ci/smoke_production.py" --wheel "$WHEEL" --work "$WORK/prod"

echo "== install paths: ok in $((SECONDS - started)) s"
