"""deploy/monitoring/ checked offline: the Prometheus alert rules and config, the Grafana
dashboard and its provisioning, and the compose profile that wires them.

Always: a schema check in Python (the shape Prometheus and Grafana expect, every expression
balanced and naming only series the broker exports, every alert docs/operations.md asks for
present, the files where the compose profile mounts them). With ``promtool`` (``./dev setup``
puts Debian's in .venv/bin): ``promtool check rules`` and ``check config`` on the files, every
dashboard expression parsed by promtool as a recording rule, and ``promtool test rules`` on a
few alerts with synthetic series.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.component.ops.test_compose import DOCKER_COMPOSE, needs_compose
from tests.component.ops.test_compose import _compose as compose_cli
from tests.component.ops.test_metrics import every_family
from tests.component.ops.topology import ROOT, broker_services, environment_of, load_compose, volumes_of

MONITORING = ROOT / "deploy" / "monitoring"
ALERTS = MONITORING / "alerts.yml"
PROMETHEUS = MONITORING / "prometheus.yml"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "tidelog.json"
PROMTOOL = shutil.which("promtool") or next(
    (str(p) for p in [ROOT / ".venv" / "bin" / "promtool"] if os.access(p, os.X_OK)), None)
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (`./dev setup` puts Debian's in .venv/bin); "
                             "the Python schema checks of this module still ran")

# What docs/operations.md says to alert on, and a family each alert must use.
ALERTED = {"under-replicated partitions": "tidelog_replica_manager_under_replicated_partitions",
           "under min ISR": "tidelog_replica_manager_under_min_isr_partitions",
           "offline partitions": "tidelog_controller_offline_partitions",
           "ISR shrink rate": "tidelog_replica_manager_isr_shrinks_total",
           "controller count": "tidelog_controller_active",
           "request latency": "tidelog_request_duration_seconds_bucket",
           "group lag": "tidelog_group_lag",
           "disk": "tidelog_log_dir_free_bytes",
           "event-loop lag": "tidelog_event_loop_lag_seconds_bucket",
           "follower lag": "tidelog_replica_fetcher_max_lag",
           "failed requests": "tidelog_request_errors_total"}
NOT_TIDELOG = {"up"}  # Prometheus's own series
DURATION = re.compile(r"^\d+(ms|s|m|h|d|w|y)$")
PANEL_TYPES = {"row", "stat", "timeseries", "gauge", "bargauge", "table"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> set[str]:
    """Every series name the broker can export: counters with ``_total``, histograms'
    ``_bucket``/``_sum``/``_count``, summaries' ``_sum``/``_count``."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "summary": ["_sum", "_count"]}
    text = generate_latest(every_family(str(tmp_path_factory.mktemp("logs")))).decode()
    return {f.name + s for f in text_string_to_metric_families(text) for s in suffixes.get(f.type, [""])}


@pytest.fixture(scope="module")
def rules() -> list[dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    assert set(doc) == {"groups"} and doc["groups"], "a rule file is a map with one key, groups"
    return [r for g in doc["groups"] for r in g["rules"]]


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def series_in(expr: str) -> set[str]:
    """The metric names an expression reads (identifiers that are not functions, keywords or
    label names)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_labels = re.sub(r"\{[^}]*\}", "", without_strings)
    without_groupings = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", without_labels)
    names = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(?!\s*\()", without_groupings))
    names -= {"and", "or", "unless", "bool", "offset", "inf", "nan"}
    return {n for n in names if not re.fullmatch(r"\d+[smhdwy]|e\d*", n)}


def assert_balanced(expr: str) -> None:
    stack = []
    for ch in re.sub(r'"[^"]*"', '""', expr):
        if ch in "([{":
            stack.append(ch)
        elif ch in ")]}":
            assert stack and "([{"[")]}".index(ch)] == stack.pop(), f"unbalanced {ch!r} in {expr}"
    assert not stack, f"unclosed {stack} in {expr}"


def check_expr(expr: str, exported: set[str], where: str) -> set[str]:
    assert isinstance(expr, str) and expr.strip(), f"{where}: no expression"
    assert_balanced(expr)
    names = series_in(expr)
    unknown = names - exported - NOT_TIDELOG
    assert not unknown, f"{where}: {expr!r} reads {sorted(unknown)}, which the broker does not export"
    assert names, f"{where}: {expr!r} reads no series"
    return names


def test_series_in_reads_names_not_functions_or_labels():
    assert series_in('histogram_quantile(0.99, sum by (le, request) (rate(tidelog_x_bucket{request="P"}[5m])))') \
        == {"tidelog_x_bucket"}
    assert series_in("a / b > 0.1 and sum by (g) (delta(c[10m])) > 0") == {"a", "b", "c"}


# -- alert rules ----------------------------------------------------------------------------------


def test_rule_groups_have_unique_names_and_rules():
    doc = yaml.safe_load(ALERTS.read_text())
    names = [g["name"] for g in doc["groups"]]
    assert len(names) == len(set(names))
    for g in doc["groups"]:
        assert set(g) <= {"name", "interval", "limit", "rules"} and g["rules"], g["name"]


def test_every_alert_is_well_formed(rules, exported):
    alerts = [r["alert"] for r in rules]
    assert len(alerts) == len(set(alerts)) == len(rules), "alerting rules only, each name once"
    for r in rules:
        name = r["alert"]
        assert set(r) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}, name
        assert re.fullmatch(r"Tidelog[A-Z][A-Za-z0-9]+", name), name
        assert DURATION.match(str(r.get("for", "0s"))), name
        assert r["labels"]["severity"] in {"warning", "critical"}, name
        assert {"summary", "description"} <= set(r["annotations"]), name
        for text in r["annotations"].values():
            assert text.count("{{") == text.count("}}"), name
        check_expr(r["expr"], exported, name)


def test_the_alerts_cover_what_the_operations_guide_says_to_alert_on(rules, exported):
    read = set().union(*(series_in(r["expr"]) for r in rules))
    missing = {topic: family for topic, family in ALERTED.items() if family not in read}
    assert not missing, f"no alert on {missing}"
    assert set(ALERTED.values()) <= exported


def test_prometheus_scrapes_every_compose_broker_and_loads_the_rules():
    config = yaml.safe_load(PROMETHEUS.read_text())
    compose = load_compose()
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "tidelog"  # alerts.yml's up{job="tidelog"}
    assert 'up{job="tidelog"}' in ALERTS.read_text()
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {f"{b.hostname}:{environment_of(b.service)['TIDELOG_METRICS_PORT']}"
                       for b in broker_services(compose)}
    mounts = {v.target: v.source for v in volumes_of(compose["services"]["prometheus"])}
    for path in config["rule_files"]:
        assert (ROOT / mounts[path]).resolve() == ALERTS.resolve(), path
    assert (ROOT / mounts["/etc/prometheus/prometheus.yml"]).resolve() == PROMETHEUS.resolve()


# -- the dashboard ----------------------------------------------------------------------------------


def test_the_dashboard_has_what_grafana_needs(dashboard):
    assert {"uid", "title", "schemaVersion", "panels", "templating"} <= set(dashboard)
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 30
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["name"] == "datasource" and variable["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)


def test_panels_fit_the_grid_without_overlapping(dashboard):
    cells: dict[tuple[int, int], str] = {}
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert p["type"] in PANEL_TYPES, p["title"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[x, y]!r}"
                cells[x, y] = p["title"]


def test_every_panel_queries_exported_series_through_the_datasource_variable(dashboard, exported):
    read = set()
    for p in dashboard["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            read |= check_expr(t["expr"], exported, p["title"])
    missing = {topic: family for topic, family in ALERTED.items() if family not in read}
    assert not missing, f"the dashboard shows nothing of {missing}"


def test_grafana_provisioning_points_at_the_mounted_dashboards_and_prometheus():
    compose = load_compose()
    grafana = compose["services"]["grafana"]
    mounts = {v.target: v.source for v in volumes_of(grafana)}
    provisioning = ROOT / mounts["/etc/grafana/provisioning"]
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert datasource["type"] == "prometheus" and datasource["isDefault"]
    assert datasource["url"] == "http://prometheus:9090" and "prometheus" in compose["services"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "tidelog.yml").read_text())["providers"]
    path = provider["options"]["path"]
    assert (ROOT / mounts[path]).resolve() == DASHBOARD.parent.resolve()
    home = environment_of(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).parent.as_posix() == path and (DASHBOARD.parent / Path(home).name).exists()


def test_the_monitoring_profile_starts_prometheus_and_grafana_only_on_demand():
    compose = load_compose()
    monitoring = {n for n, s in compose["services"].items() if "monitoring" in (s.get("profiles") or [])}
    assert monitoring == {"prometheus", "grafana"}
    for name in monitoring:
        assert compose["services"][name]["networks"] == ["tidelog"], name
    assert compose["services"]["grafana"]["depends_on"] == ["prometheus"]


@needs_compose
def test_docker_compose_validates_the_monitoring_profile():
    assert DOCKER_COMPOSE is not None
    r = compose_cli("--profile", "monitoring", "config", "-q")
    assert r.returncode == 0, r.stderr


# -- promtool -----------------------------------------------------------------------------------------


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


@needs_promtool
def test_promtool_checks_the_rules_and_the_config(tmp_path):
    r = promtool("check", "rules", str(ALERTS), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    shutil.copy(ALERTS, tmp_path / "alerts.yml")  # the config names the path inside the container
    (tmp_path / "prometheus.yml").write_text(PROMETHEUS.read_text().replace("/etc/prometheus/alerts.yml", "alerts.yml"))
    r = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_parses_every_dashboard_expression(tmp_path, dashboard):
    """Each panel's query as a recording rule: promtool parses it as Prometheus would."""
    exprs = [t["expr"] for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]
    rules = [{"record": f"tidelog_dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    (tmp_path / "queries.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = promtool("check", "rules", "queries.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_fires_the_alerts_on_synthetic_series(tmp_path):
    """The page-worthy alerts fire when their condition holds past ``for``, and not before."""
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    broker = '{instance="broker-1:9404", job="tidelog"}'
    tests = {"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": f"tidelog_controller_offline_partitions{broker}", "values": "0 0 2 2 2 2"},
            {"series": f"tidelog_controller_active{broker}", "values": "1 1 1 1 1 1"},
            {"series": 'tidelog_controller_active{instance="broker-2:9404", job="tidelog"}',
             "values": "0 0 0 1 1 1"},
            {"series": f"tidelog_replica_manager_under_replicated_partitions{broker}", "values": "0 3 3 3 3 3"},
            {"series": 'tidelog_log_dir_free_bytes{dir="/data", instance="broker-1:9404", job="tidelog"}',
             "values": "50 50 4 4 4 4"},
            {"series": 'tidelog_log_dir_total_bytes{dir="/data", instance="broker-1:9404", job="tidelog"}',
             "values": "100 100 100 100 100 100"},
        ],
        "alert_rule_test": [
            {"eval_time": "2m", "alertname": "TidelogOfflinePartitions", "exp_alerts": []},
            {"eval_time": "3m", "alertname": "TidelogOfflinePartitions",
             "exp_alerts": [{"exp_labels": {"severity": "critical"},
                             "exp_annotations": {"summary": "2 partitions have no live leader",
                                                 "description": _annotation("TidelogOfflinePartitions",
                                                                            "description")}}]},
            {"eval_time": "4m", "alertname": "TidelogActiveControllerCount",
             "exp_alerts": [{"exp_labels": {"severity": "critical"},
                             "exp_annotations": {"summary": "2 active controllers (exactly 1 expected)",
                                                 "description": _annotation("TidelogActiveControllerCount",
                                                                            "description")}}]},
            {"eval_time": "4m", "alertname": "TidelogUnderReplicatedPartitions", "exp_alerts": []},
            {"eval_time": "3m", "alertname": "TidelogDiskCritical",
             "exp_alerts": [{"exp_labels": {"severity": "critical", "dir": "/data",
                                            "instance": "broker-1:9404", "job": "tidelog"},
                             "exp_annotations": {
                                 "summary": "broker-1:9404: log dir /data has less than 5 % free",
                                 "description": _annotation("TidelogDiskCritical", "description")}}]},
        ]}]}
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    r = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def _annotation(alert: str, key: str) -> str:
    doc = yaml.safe_load(ALERTS.read_text())
    (rule,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == alert]
    return rule["annotations"][key]
