"""The alert rules (deploy/prometheus/ingot-alerts.yml) pass their
`promtool test rules` cases (each fires once and stays quiet once), and
every series the rules and the Grafana dashboard (deploy/grafana/) name is
one the real server exports; in a real Prometheus scraping it, every panel
of ingot's dashboard and every panel of vLLM's published Grafana dashboard
(its queries below) returns data."""

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


def dashboard_panels() -> dict[str, list[str]]:
    """Each panel's title and PromQL."""
    dash = json.loads(DASHBOARD.read_text())
    return {p["title"]: [t["expr"] for t in p["targets"]] for p in dash["panels"]}


def dashboard_queries() -> list[str]:
    """The panels' PromQL."""
    return [q for qs in dashboard_panels().values() for q in qs]


# The panels of vLLM's Grafana dashboard (examples/online_serving/
# prometheus_grafana/grafana.json in vllm-project/vllm; its 12 panels, with
# the series names of current vLLM: inter-token latency and KV-cache usage),
# which users of vLLM point at any server that claims its metrics.
_M = '{model_name="$model_name"}'
_R = "[$__rate_interval]"
VLLM_PANELS = {
    "E2E Request Latency": [
        f"histogram_quantile(0.99, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{_M}{_R})))",
        f"rate(vllm:e2e_request_latency_seconds_sum{_M}{_R})\n/\nrate(vllm:e2e_request_latency_seconds_count{_M}{_R})",
    ],
    "Token Throughput": [
        f"rate(vllm:prompt_tokens_total{_M}{_R})",
        f"rate(vllm:generation_tokens_total{_M}{_R})",
    ],
    "Time Per Output Token Latency": [
        f"histogram_quantile(0.99, sum by(le) (rate(vllm:inter_token_latency_seconds_bucket{_M}{_R})))",
        f"rate(vllm:inter_token_latency_seconds_sum{_M}{_R})\n/\nrate(vllm:inter_token_latency_seconds_count{_M}{_R})",
    ],
    "Scheduler State": [f"vllm:num_requests_running{_M}", f"vllm:num_requests_waiting{_M}"],
    "Time To First Token Latency": [
        f"histogram_quantile(0.99, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{_M}{_R})))",
        f"rate(vllm:time_to_first_token_seconds_sum{_M}{_R})\n/\nrate(vllm:time_to_first_token_seconds_count{_M}{_R})",
    ],
    "Cache Utilization": [f"vllm:kv_cache_usage_perc{_M}"],
    "Request Prompt Length": [f"sum by(le) (increase(vllm:request_prompt_tokens_bucket{_M}{_R}))"],
    "Request Generation Length": [f"sum by(le) (increase(vllm:request_generation_tokens_bucket{_M}{_R}))"],
    "Finish Reason": [f"sum by(finished_reason) (increase(vllm:request_success_total{_M}{_R}))"],
    "Queue Time": [f"rate(vllm:request_queue_time_seconds_sum{_M}{_R})"],
    "Requests Prefill and Decode Time": [
        f"rate(vllm:request_prefill_time_seconds_sum{_M}{_R})",
        f"rate(vllm:request_decode_time_seconds_sum{_M}{_R})",
    ],
    "Max Generation Token in Sequence Group": [f"rate(vllm:request_max_num_generation_tokens_sum{_M}{_R})"],
}


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
    vllm_queries = [q for qs in VLLM_PANELS.values() for q in qs]
    queries = dashboard_queries() + dashboard_variables() + rule_queries() + vllm_queries
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
            def has_data(q: str) -> bool:
                promql = (q.replace("$__rate_interval", "1m").replace("$model_name", model_name)
                          .replace("$model", ".*").replace("$instance", ".*"))
                return bool(prom.query(promql))  # raises on a syntax or evaluation error

            # Rates need two scrapes of a series: wait for them, boundedly.
            for title, qs in dashboard_panels().items():
                wait_for(lambda: any(has_data(q) for q in qs), 15, 0.25, what=f"data in ingot's panel {title!r}")
            for title, qs in VLLM_PANELS.items():
                for q in qs:
                    wait_for(lambda: has_data(q), 15, 0.25, what=f"data in vLLM's panel {title!r}: {q}")
        finally:
            prom.stop()
