"""The chart's alert rules (charts/pdmtp/files/alerts.yaml) and Grafana dashboard
(charts/pdmtp/files/dashboard.json).

Pure checks: each alert is documented (runbook annotations, a severity, the rules file's header
table), has a firing and a silent case among the promtool tests (tests/unit/alerts/), and every
metric name a rule or a panel queries is one the operator's registry or the engines' exposition
(the emulator speaks vLLM 0.33.0's names) exports. Then promtool's own `check rules` and `test
rules`: the binary is the one hack/prometheus/build.sh builds (`make prometheus-bin`;
PDMTP_PROMETHEUS_DIR names its directory, which `make test-unit` sets); without it those skip,
and fail under PDMTP_REQUIRE_ALL=1. The kind tier (tests/e2e/test_alerts.py) scrapes the same
names from a live install and fires the alerts in their scenarios.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from chart import CHART
from monitoring import RULES, alerts, dashboard, panels
from pdmtp.metrics import Metrics
from prometheus_client.parser import text_string_to_metric_families
from router.emulator import Tuning
from versions import read_versions

RULE_TESTS: Final = sorted((Path(__file__).parent / "alerts").glob("*.yaml"))
SEVERITIES: Final = ("critical", "warning", "info")

Obj = dict[str, Any]


# ---- metric names in PromQL -----------------------------------------------------------------

_KEYWORDS: Final = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan", "atan2"}
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana `label_values(...)` query) selects:
    the identifiers left once strings, label matchers, ranges, grouping clauses, Grafana
    variables and function calls are taken out. Held against Prometheus' own parser on kind."""
    text = re.sub(r"\$\{?\w+\}?", "", expr)
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', text)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    grouping = r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)"
    text = re.sub(grouping, " ", text)
    text = re.sub(r"label_values\s*\(([^,()]*),[^()]*\)", r"\1", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        followed = text[match.end() :].lstrip()
        preceded = text[: match.start()].rstrip()
        if followed.startswith("(") or match.group() in _KEYWORDS:
            continue
        if preceded and (preceded[-1].isdigit() or preceded[-1] == "."):
            continue  # a number's exponent or a duration's unit
        names.add(match.group())
    return names


def test_metric_names_finds_the_selectors_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (name, le) (rate(a:b_bucket{x="y", role=~"p|d"}'
        "[$__rate_interval]))) / ignoring(role) group_left c_total offset 5m"
        " and on (instance) d == 1e3 unless absent(e) > bool 2"
    )
    assert metric_names(expr) == {"a:b_bucket", "c_total", "d", "e"}
    assert metric_names('label_values(f{namespace=~"$namespace"}, name)') == {"f"}


# ---- what is exported -------------------------------------------------------------------------

_SUFFIXES: Final = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def operator_names() -> set[str]:
    """Every sample name the operator's registry can expose, labelled children or not."""
    return {
        family.name + suffix
        for family in Metrics().registry.collect()
        for suffix in _SUFFIXES[family.type]
    }


def engine_names() -> set[str]:
    """The sample names of an MTP engine's /metrics (the emulator's, vLLM 0.33.0's names)."""
    # pdmtp_emulator is on sys.path once router.emulator is imported.
    from pdmtp_emulator.handoff import HandoffCounts
    from pdmtp_emulator.scheduler import Scheduler

    labels = {"model_name": "m", "engine": "0"}
    scheduler = Scheduler(Tuning(), speculative_tokens=2)
    # A decode's hand-off counts too (the fixed connector's and vLLM's failed receives).
    lines = scheduler.metric_lines(labels) + HandoffCounts(2).metric_lines(Tuning(), labels)
    text = "\n".join(lines) + "\n"
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def used_names() -> dict[str, set[str]]:
    """Where each metric name is used: `alert X` or `panel Y`."""
    where: dict[str, set[str]] = {}
    for name, rule in alerts().items():
        for metric in metric_names(rule["expr"]):
            where.setdefault(metric, set()).add(f"alert {name}")
    dash = dashboard()
    for panel in panels(dash["panels"]):
        for target in panel.get("targets", []):
            for metric in metric_names(target["expr"]):
                where.setdefault(metric, set()).add(f"panel {panel['title']}")
    for variable in dash["templating"]["list"]:
        if variable["type"] == "query":
            for metric in metric_names(variable["query"]["query"]):
                where.setdefault(metric, set()).add(f"variable {variable['name']}")
    return where


def test_every_metric_a_rule_or_panel_queries_is_exported() -> None:
    used = used_names()
    exported = operator_names() | engine_names()
    assert not {name: sorted(where) for name, where in used.items() if name not in exported}
    # Both exporters are queried: the operator's conditions and the engines' MTP counters.
    assert {"pdmtp_condition", "vllm:spec_decode_num_accepted_tokens_total"} <= used.keys()


def test_the_exported_names_are_read_from_the_exporters() -> None:
    """The check above would pass vacuously if these sets were empty or guessed."""
    operator = operator_names()
    assert {"pdmtp_leader", "pdmtp_rollbacks_total", "pdmtp_reconcile_duration_seconds_bucket"} <= (
        operator
    )
    assert "pdmtp_rollbacks" not in operator and "vllm:num_requests_waiting" not in operator
    engine = engine_names()
    assert {
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:spec_decode_num_drafts_total",
    } <= engine
    assert not any(name.startswith("pdmtp_") for name in engine)


# ---- the rules ---------------------------------------------------------------------------------


def test_every_alert_says_what_happened_and_what_to_do_with_a_severity() -> None:
    found = alerts()
    assert len(found) >= 15
    for name, rule in found.items():
        assert name.startswith("PDMTP"), name
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert annotations.keys() == {"summary", "description"}, name
        assert len(annotations["description"]) > 100, name


def test_the_rules_files_header_lists_every_alert_with_its_for_and_severity() -> None:
    """The header is what the kind tier and an on-call reader go by: held equal to the rules."""
    header = {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(r"^# (PDMTP\w+)\s+(\d+[smh])\s+(\w+)\s", RULES.read_text(), re.M)
    }
    assert header == {
        name: (rule.get("for", "0m"), rule["labels"]["severity"]) for name, rule in alerts().items()
    }


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for path in RULE_TESTS:
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == [os.path.relpath(RULES, path.parent)], path.name
        for case in doc["tests"]:
            for check in case["alert_rule_test"]:
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    assert firing == alerts().keys()
    assert silent == alerts().keys()


# ---- the dashboard ----------------------------------------------------------------------------


def test_the_dashboard_is_grafana_json_and_every_panel_queries_something() -> None:
    dash = dashboard()
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    graphs = [p for p in panels(dash["panels"]) if p["type"] != "row"]
    assert len(graphs) >= 12
    assert len({p["id"] for p in panels(dash["panels"])}) == len(panels(dash["panels"]))
    for panel in graphs:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert metric_names(target["expr"]), (panel["title"], target["expr"])
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    titles = " ".join(p["title"] for p in graphs)
    for topic in ("Prefill:decode", "Ready vs desired", "Rollout", "MTP acceptance"):
        assert topic in titles
    for topic in ("Time to first token", "Inter-token latency", "Reconcile", "Leader"):
        assert topic in titles


def test_per_role_engine_panels_group_by_the_label_the_chart_scrapes() -> None:
    """The engines' own series carry no role: the chart's PodMonitor relabels pdmtp.io/role
    into `role`, which the per-role panels group by."""
    template = (CHART / "templates" / "podmonitor.yaml").read_text()
    assert "__meta_kubernetes_pod_label_pdmtp_io_role], targetLabel: role" in template
    engine_panels = [
        p
        for p in panels(dashboard()["panels"])
        if any("vllm:" in t["expr"] for t in p.get("targets", []))
    ]
    assert len(engine_panels) >= 4
    for panel in engine_panels:
        for target in panel["targets"]:
            assert "role" in re.findall(r"by \(([^)]*)\)", target["expr"])[0], panel["title"]


# ---- promtool ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def promtool() -> Path:
    named = os.environ.get("PDMTP_PROMETHEUS_DIR")
    cache = Path(os.environ.get("PDMTP_CACHE_DIR") or Path.home() / ".cache" / "pdmtp")
    directory = (
        Path(named) if named else cache / "prometheus" / read_versions()["PROMETHEUS_VERSION"]
    )
    found = directory / "promtool"
    if not os.access(found, os.X_OK):
        why = f"no promtool in {directory}; run `make prometheus-bin`"
        if os.environ.get("PDMTP_REQUIRE_ALL") == "1":
            pytest.fail(f"promtool required (PDMTP_REQUIRE_ALL=1): {why}", pytrace=False)
        pytest.skip(why)
    return found


def run(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_checks_the_rules_file(promtool: Path) -> None:
    done = run(promtool, "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_promtool_rule_tests_pass(promtool: Path) -> None:
    done = run(promtool, "test", "rules", *map(str, RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(RULE_TESTS)


def test_promtool_rule_tests_fail_on_a_rule_that_never_fires(
    promtool: Path, tmp_path: Path
) -> None:
    """The rule tests can fail: with one alert's expression made impossible, they do."""
    broken = yaml.safe_load(RULES.read_text())
    broken["groups"][0]["rules"][0]["expr"] = "vector(1) == 2"
    files = tmp_path / "charts" / "pdmtp" / "files"
    files.mkdir(parents=True)
    (files / RULES.name).write_text(yaml.safe_dump(broken))
    tests = tmp_path / "tests" / "unit" / "alerts"
    tests.mkdir(parents=True)
    for path in RULE_TESTS:
        (tests / path.name).write_text(path.read_text())
    done = run(promtool, "test", "rules", *map(str, sorted(tests.glob("*.yaml"))))
    assert done.returncode != 0
    assert broken["groups"][0]["rules"][0]["alert"] in done.stdout + done.stderr
