#!/usr/bin/env python3
"""Consistency checks for deploy/ that no off-the-shelf linter does (run by deploy/check.sh).

- The shared overlay's PrometheusRule carries exactly the groups of
  deploy/prometheus/sluice-rules.yml (the source). `--write-prometheusrule` regenerates it.
- The Grafana dashboard is well-formed: unique panel ids, every panel inside the grid, a
  Prometheus query in every target, data source taken from the dashboard's variable.

Whether the metric names the rules and the dashboard use exist is checked against a live
sluice by tests/deploy.rs.
"""
import json
import pathlib
import sys

import yaml

DEPLOY = pathlib.Path(__file__).resolve().parent
RULES = DEPLOY / "prometheus" / "sluice-rules.yml"
PROMETHEUS_RULE = DEPLOY / "kubernetes" / "overlays" / "shared" / "prometheusrule.yaml"
DASHBOARD = DEPLOY / "grafana" / "sluice-dashboard.json"

HEADER = """\
# Generated from deploy/prometheus/sluice-rules.yml, the source; CI fails when the two differ.
# Regenerate with: python3 deploy/check.py --write-prometheusrule
"""


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (PromQL) as literal blocks, as they are in the source."""


_Dumper.add_representer(
    str,
    lambda dumper, s: dumper.represent_scalar(
        "tag:yaml.org,2002:str", s, style="|" if "\n" in s else None),
)


def prometheus_rule() -> dict:
    rules = yaml.safe_load(RULES.read_text())
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "sluice"},
        "spec": {"groups": rules["groups"]},
    }


def check_prometheus_rule() -> list[str]:
    shipped = yaml.safe_load(PROMETHEUS_RULE.read_text())
    if shipped != prometheus_rule():
        return [f"{PROMETHEUS_RULE.relative_to(DEPLOY.parent)} differs from {RULES.name}; "
                "run python3 deploy/check.py --write-prometheusrule"]
    return []


def check_dashboard() -> list[str]:
    problems = []
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dashboard.get("templating", {}).get("list", [])}
    if "datasource" not in variables:
        problems.append("the dashboard has no 'datasource' variable")
    if not dashboard.get("uid"):
        problems.append("the dashboard has no uid")
    seen = set()
    for panel in dashboard["panels"]:
        where = f"panel {panel.get('id')} ({panel.get('title')!r})"
        if panel.get("id") in seen:
            problems.append(f"{where}: duplicate id")
        seen.add(panel.get("id"))
        grid = panel.get("gridPos", {})
        if not all(k in grid for k in "hwxy") or grid["x"] + grid["w"] > 24:
            problems.append(f"{where}: gridPos outside the 24-column grid")
        if panel["type"] == "row":
            continue
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"{where}: data source is not ${{datasource}}")
        targets = panel.get("targets", [])
        if not targets:
            problems.append(f"{where}: no queries")
        for target in targets:
            if not target.get("expr", "").strip():
                problems.append(f"{where}: target {target.get('refId')} has no expr")
            for name in ("job", "route"):
                if f"${name}" in target.get("expr", "") and name not in variables:
                    problems.append(f"{where}: uses ${name}, which is not a variable")
    return problems


def main() -> int:
    if sys.argv[1:] == ["--write-prometheusrule"]:
        PROMETHEUS_RULE.write_text(HEADER + yaml.dump(prometheus_rule(), Dumper=_Dumper,
                                                      sort_keys=False, width=100))
        return 0
    problems = check_prometheus_rule() + check_dashboard()
    for problem in problems:
        print(f"deploy/check.py: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
