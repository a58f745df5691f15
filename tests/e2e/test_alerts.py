"""The alert rules (deploy/prometheus/ingot-alerts.yml) pass their
`promtool test rules` cases (each fires once and stays quiet once), and
every series the rules and the Grafana dashboard (deploy/grafana/) name is
one the real server exports; the dashboard's queries run in a real
Prometheus scraping it."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tempfile
from pathlib import Path

from ingot_e2e import REPO, wait_for
from test_prometheus import NEEDS_PROMETHEUS, PROMTOOL, _Prometheus, _serve_a_few

RULES = REPO / "deploy" / "prometheus" / "ingot-alerts.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "ingot-alerts.test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "ingot-dashboard.json"
# ingot's and vLLM's series; `up` and friends come from Prometheus itself.
SERIES = re.compile(r"\b(ingot_[a-z0-9_]+|vllm:[a-z0-9_:]+)")


def dashboard_queries() -> list[str]:
    """The panels' PromQL."""
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def dashboard_variables() -> list[str]:
    """Grafana's variable queries (`label_values(...)`, not PromQL)."""
    dash = json.loads(DASHBOARD.read_text())
    return [v["definition"] for v in dash["templating"]["list"] if v.get("definition")]


def rule_queries() -> list[str]:
    return re.findall(r"expr: \|?\n?((?:.+\n)+?)\s+for:", RULES.read_text())


@NEEDS_PROMETHEUS
def test_alert_rules_unit_tests():
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "9 rules found" in check.stdout, check.stdout
    test = subprocess.run([PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                          cwd=RULE_TESTS.parent)
    assert test.returncode == 0, test.stdout + test.stderr
    # Every alert is exercised by the test file.
    alerts = set(re.findall(r"- alert: (\w+)", RULES.read_text()))
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert alerts == tested, f"untested alerts: {alerts - tested}"


@NEEDS_PROMETHEUS
def test_dashboard_and_rules_name_exported_series(server_factory, model_name, tmp_path):
    # One API key, so the per-key series exist.
    key = "sk-dashboard-key"
    config = tmp_path / "ingot.toml"
    config.write_text(f'[[auth.api_keys]]\nid = "dash"\nsha256 = "{hashlib.sha256(key.encode()).hexdigest()}"\n')
    srv = server_factory("--config", str(config))
    _serve_a_few(srv, model_name, n=2, headers={"authorization": f"Bearer {key}"})
    exported = {name for name, _, _ in srv.metrics().samples}
    queries = dashboard_queries() + dashboard_variables() + rule_queries()
    assert len(queries) > 20, queries
    missing = sorted({s for q in queries for s in SERIES.findall(q) if s not in exported})
    assert not missing, f"series the dashboard or alert rules use but the server does not export: {missing}"

    # The dashboard's queries are valid PromQL and return data from a real scrape.
    target = srv.url.removeprefix("http://")
    with tempfile.TemporaryDirectory(prefix="ingot-dash-") as tmp:
        prom = _Prometheus(target, Path(tmp))
        try:
            wait_for(lambda: prom.scalar('up{job="ingot"}') == 1, 60, 0.25,
                     what=f"Prometheus scraping {target}; its log: {prom.log_tail()}")
            wait_for(lambda: prom.scalar("sum(ingot_request_success_total)") == 4, 30, 0.25,
                     what="Prometheus seeing the requests")
            for q in dashboard_queries():
                promql = q.replace("$__rate_interval", "1m").replace("$model", ".*")
                prom.query(promql)  # raises on a syntax or evaluation error
        finally:
            prom.stop()
