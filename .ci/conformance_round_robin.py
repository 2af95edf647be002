"""Prove that haproxy really spread a run over both replicas (exit 1 otherwise).

    python .ci/conformance_round_robin.py STATS_CSV_URL HAPROXY_LOG

- haproxy's own counters (`req_tot` of servers a and b in backend `replicas`): each replica
  answered at least 40 % of the requests;
- its request log (`option httplog`, the captured Mcp-Method and, for tools/call, Mcp-Name):
  the same split, and every multi-round fixture whose later round carries a sealed
  `requestState` had a round answered on the other replica than the one before it: those
  checks passed because the replicas share the request-state secret, not by luck.
"""

from __future__ import annotations

import csv
import io
import itertools
import re
import sys
import urllib.request

LINE = re.compile(r" replicas/(?P<server>\w+) .*?\{(?P<method>[^|}]*)\|?(?P<name>[^}]*)\}")
SEALED_ROUNDS = (  # core fixtures whose round 2 echoes a requestState the SDK sealed in round 1
    "test_input_required_result_request_state",
    "test_input_required_result_multiple_inputs",
    "test_input_required_result_multi_round",
)


def counters(url: str) -> dict[str, int]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode().lstrip("# ")
    rows = csv.DictReader(io.StringIO(text))
    return {row["svname"]: int(row["req_tot"] or 0) for row in rows if row["pxname"] == "replicas"}


def main(stats_url: str, log_path: str) -> int:
    problems: list[str] = []
    stats = counters(stats_url)
    a, b = stats.get("a", 0), stats.get("b", 0)
    print(f"round robin (haproxy counters): a answered {a} requests, b answered {b}")
    if min(a, b) < 0.4 * (a + b) or a + b == 0:
        problems.append(f"the requests were not spread over both replicas (a {a}, b {b})")
    with open(log_path, encoding="utf-8", errors="replace") as log:
        lines = [m for m in map(LINE.search, log) if m]
    logged = {server: sum(1 for m in lines if m["server"] == server) for server in ("a", "b")}
    print(f"round robin (haproxy log): a {logged['a']}, b {logged['b']} of {len(lines)} logged requests")
    if min(logged.values()) < 0.4 * max(len(lines), 1):
        problems.append(f"the request log does not show both replicas answering (a {logged['a']}, b {logged['b']})")
    for tool in SEALED_ROUNDS:
        rounds = [m["server"] for m in lines if m["method"] == "tools/call" and m["name"] == tool]
        crossed = sum(1 for first, then in itertools.pairwise(rounds) if first != then)
        print(f"{tool}: rounds on {' '.join(rounds) or '-'} ({crossed} answered on the other replica)")
        if not crossed:
            problems.append(f"no round of {tool} reached the other replica")
    for problem in problems:
        print("round robin: " + problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
