"""`ditgate lint [ROOT] [--json] [--disable RULE] [--warn RULE]`: check the skill against the code."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "lint the skill (SKILL.md, references/): spec, links, routes, phases, gates, API names, commands"


def _rules(value: str) -> list[str]:
    return [rule.strip() for rule in value.split(",") if rule.strip()]


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("root", nargs="?", help="the skill's folder (default: the current folder when it holds "
                        "SKILL.md, else the skill ditgate runs from: its checkout or its installed copy)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--disable", type=_rules, action="extend", default=[], metavar="RULE[,RULE]",
                        help="do not run these rules")
    parser.add_argument("--warn", type=_rules, action="extend", default=[], metavar="RULE[,RULE]",
                        help="report these rules' findings as warnings (they do not fail the run)")
    parser.add_argument("--list-rules", action="store_true", help="list the rules and exit")


def _default_root() -> Path:
    from ditgate.core.paths import data_root

    return Path.cwd() if (Path.cwd() / "SKILL.md").is_file() else data_root()


def main(args: argparse.Namespace) -> int:
    from ditgate.skill.rules.lint import RULES, WARNING, LintConfig, lint

    if args.list_rules and args.json:
        print(json.dumps([{"id": r.id, "severity": r.severity, "summary": r.summary} for r in RULES], indent=2))
        return 0
    if args.list_rules:
        width = max(len(rule.id) for rule in RULES)
        for rule in RULES:
            print(f"{rule.id:<{width}}  {rule.severity:<7}  {rule.summary}")
        return 0
    config = LintConfig(disabled=frozenset(args.disable), severity={rule: WARNING for rule in args.warn})
    report = lint(args.root or _default_root(), config)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        for finding in report.findings:
            print(finding.format())
        for route in report.routes:
            print(f"reading path: {route.describe()}")
        print(f"ditgate lint: {len(report.errors)} error(s), {len(report.warnings)} warning(s) in {report.root}")
    return 0 if report.ok else 1
