"""The chart's alert rules and Grafana dashboard as the tests read them: the unit tier's promtool
and name checks (tests/unit/test_alerts.py) and the kind tier's Prometheus (tests/e2e/promkit.py,
test_alerts.py) load and walk them the same way."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Final

import yaml
from chart import CHART

RULES: Final[Path] = CHART / "files" / "alerts.yaml"
DASHBOARD: Final[Path] = CHART / "files" / "dashboard.json"

Obj = dict[str, Any]


def rules() -> Obj:
    loaded: Obj = yaml.safe_load(RULES.read_text())
    return loaded


def alerts(doc: Obj | None = None) -> dict[str, Obj]:
    """Each alerting rule of `doc` (the chart's rules file when None), by alert name."""
    groups = (doc if doc is not None else rules())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def dashboard() -> Obj:
    loaded: Obj = json.loads(DASHBOARD.read_text())
    return loaded


def panels(items: list[Obj]) -> list[Obj]:
    """Every panel, those inside collapsed rows too."""
    found: list[Obj] = []
    for item in items:
        found.append(item)
        found += panels(item.get("panels") or [])
    return found


def rule_expressions(doc: Obj) -> dict[str, str]:
    """Each rule's expression, by alert (or recording) name."""
    return {
        str(rule.get("alert") or rule.get("record")): str(rule["expr"])
        for group in doc["groups"]
        for rule in group["rules"]
    }


def dashboard_expressions(doc: Obj) -> dict[str, str]:
    """Each panel target's expression (rows' nested panels too) and each query variable's, by a
    name that says where it is."""
    found: dict[str, str] = {}
    for panel in panels(doc.get("panels") or []):
        for index, target in enumerate(panel.get("targets") or []):
            if target.get("expr"):
                found[f"panel {panel.get('title', panel.get('id'))!r} #{index}"] = target["expr"]
    for variable in (doc.get("templating") or {}).get("list") or []:
        query = variable.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        if variable.get("type") == "query" and query:
            inner = re.fullmatch(r"\s*(?:label_values|query_result)\((.*)\)\s*", query, re.S)
            if inner:
                # label_values(expr, label): the expression is everything before the last comma.
                query = (
                    inner.group(1).rsplit(",", 1)[0] if "," in inner.group(1) else inner.group(1)
                )
            found[f"variable {variable.get('name')!r}"] = query
    return found
