"""What ships in deploy/: alert rules that promtool accepts and whose alerts fire as tested, a scrape
config, and a Grafana dashboard whose queries parse and name only metrics this package exports."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from celery_mcp_tasks.ops.metrics import Families, LedgerCollector, LedgerView
from celery_mcp_tasks.store.ledger import SweepRecord
from tests.support import tool

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "celery-mcp-tasks.json"
OURS = re.compile(r"\bmcp_tasks_[a-z0-9_]+\b")
PROMETHEUS_OWN = {"up"}
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def exported() -> set[str]:
    """Every sample name the package can export: the process's families and the store-derived series."""
    registry = CollectorRegistry()
    Families(registry)
    everything = SweepRecord("janitor", 1, 1, 1, {}, {"working": 1}, None, None)
    names: set[str] = set()
    for family in [*registry.collect(), *LedgerCollector(LedgerView(True, everything), 60.0).collect()]:
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(family.type, [""])
        names.update(family.name + suffix for suffix in suffixes)
    return names


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = tool("promtool", "Debian: apt-get install prometheus")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, cwd=PROMETHEUS)


def dashboard_queries() -> list[str]:
    queries: list[str] = []

    def walk(panels: list[dict[str, object]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):  # type: ignore[attr-defined]
                queries.append(target["expr"])
            walk(panel.get("panels", []))  # type: ignore[arg-type]

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return queries


def alert_queries() -> list[str]:
    """Each rule's `expr`, inline or a `|` block (the file's two shapes; no YAML library needed)."""
    queries: list[str] = []
    lines = (PROMETHEUS / "alerts.yml").read_text().splitlines()
    for number, line in enumerate(lines):
        text = line.strip()
        if text == "expr: |":
            indent = " " * (len(line) - len(line.lstrip()) + 2)
            block = itertools.takewhile(lambda following, i=indent: following.startswith(i), lines[number + 1 :])
            queries.append("\n".join(following.strip() for following in block))
        elif text.startswith("expr: "):
            queries.append(text.removeprefix("expr: "))
    return queries


def test_the_dashboard_and_the_alerts_name_only_metrics_this_package_exports() -> None:
    queries = dashboard_queries() + alert_queries()
    named = {name for query in queries for name in OURS.findall(query)}

    assert len(dashboard_queries()) >= 15
    assert named - exported() == set()
    assert {"mcp_tasks_created_total", "mcp_tasks_queue_wait_seconds_bucket", "mcp_tasks_in_status"} <= named


def test_every_exported_metric_is_on_the_dashboard() -> None:
    on_dashboard = {name for query in dashboard_queries() for name in OURS.findall(query)}
    histograms = {name.removesuffix("_bucket") for name in exported() if name.endswith("_bucket")}
    missing = {
        name
        for name in exported()
        if name not in on_dashboard and name.rsplit("_", 1)[0] not in histograms  # a histogram's _bucket is enough
    }
    assert missing == set()


def test_the_dashboard_is_a_grafana_dashboard_over_a_prometheus_datasource_variable() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] == "celery-mcp-tasks" and board["schemaVersion"] >= 36
    assert [v["type"] for v in board["templating"]["list"]] == ["datasource"]
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.integration
def test_the_alert_rules_pass_promtool_check_rules() -> None:
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


@pytest.mark.integration
def test_the_alerts_fire_as_their_unit_tests_say() -> None:
    tested = promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.integration
def test_the_sample_scrape_config_is_valid() -> None:
    checked = promtool("check", "config", "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.integration
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule (Grafana's own variables given values)."""
    rules = []
    for number, query in enumerate(dashboard_queries()):
        for variable, value in GRAFANA_VARIABLES.items():
            query = query.replace(variable, value)
        rules.append({"record": f"dashboard:panel_{number}", "expr": query})
    document = {"groups": [{"name": "dashboard", "rules": rules}]}
    (tmp_path / "dashboard.yml").write_text(json.dumps(document))  # JSON is YAML

    checked = promtool("check", "rules", str(tmp_path / "dashboard.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
