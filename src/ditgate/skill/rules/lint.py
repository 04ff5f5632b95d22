"""The skill linter: every rule, its severity, and the run that applies them to a skill folder.

A rule is a function from the parsed skill to problems. Its findings are reported as `file:line: rule: message`;
a rule's default severity can be changed, or the rule turned off, through `LintConfig`. A line holding
`lint-ignore: RULE[,RULE]` (e.g. inside an HTML comment) silences those rules on that line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ditgate.core.errors import DitgateError
from ditgate.skill.rules.apis import check_apis
from ditgate.skill.base import Problem, Skill, load_skill
from ditgate.skill.rules.commandlines import check_commands
from ditgate.skill.rules.links import (check_anchors, check_file_links, check_links, check_nesting, check_phase_files,
                                       check_portable, check_routes, check_unreachable)
from ditgate.skill.rules.reading import READING_BUDGET, Route, check_reading, reading_paths
from ditgate.skill.spec import check_budget, check_frontmatter
from ditgate.skill.rules.thresholds import check_thresholds

ERROR, WARNING = "error", "warning"
_IGNORE = re.compile(r"lint-ignore:\s*([\w-]+(?:\s*,\s*[\w-]+)*)")


class UnknownRuleError(DitgateError, KeyError):
    """A rule id given to the linter does not exist."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Rule:
    id: str
    summary: str
    check: Callable[[Skill], Iterable[Problem]]
    severity: str = ERROR


RULES: tuple[Rule, ...] = (
    Rule("frontmatter", "SKILL.md's frontmatter follows the Agent Skills specification", check_frontmatter),
    Rule("budget", "SKILL.md within 500 lines and about 5000 tokens (characters / 4)", check_budget),
    Rule("nesting", "references one level deep (no references/x/y.md)", check_nesting),
    Rule("link", "relative links point at files that exist", check_links),
    Rule("anchor", "link anchors match a heading (GitHub slug) of the target", check_anchors),
    Rule("portable", "relative links stay inside what an installation holds; runnable fences name the skill's files"
         " as $SKILL_DIR/...", check_portable),
    Rule("file-link", "no file of the skill is a link out of it or a broken link (an installed copy cannot keep "
         "one)", check_file_links),
    Rule("unreachable", "SKILL.md reaches every reference", check_unreachable),
    Rule("route", "paths named in the text (references/, checklists/, notebooks/, examples/) exist", check_routes),
    Rule("phase-files", "each phase has its reference, checklist and notebook", check_phase_files),
    Rule("threshold", "gate claims (PSNR > 30 dB ...) equal checklists/gates.json", check_thresholds),
    Rule("reading", f"each SKILL.md route reaches its first gated row within {READING_BUDGET} lines of reading",
         check_reading),
    Rule("api", "cache_dit / diffusers names in code exist in the installed versions", check_apis),
    Rule("command", "ditgate command lines in shell fences parse (errors in `bash runnable` fences)",
         check_commands),
)
RULE_IDS = tuple(rule.id for rule in RULES)


@dataclass(frozen=True)
class LintConfig:
    """Which rules run and at which severity. Every rule runs at its default severity unless told otherwise."""

    disabled: frozenset[str] = frozenset()
    severity: dict[str, str] = field(default_factory=dict)     # rule id -> "error" | "warning"

    def __post_init__(self) -> None:
        for rule in [*self.disabled, *self.severity]:
            if rule not in RULE_IDS:
                raise UnknownRuleError(f"unknown lint rule {rule!r} (rules: {', '.join(RULE_IDS)})")
        for level in self.severity.values():
            if level not in (ERROR, WARNING):
                raise DitgateError(f"unknown severity {level!r} (use {ERROR} or {WARNING})")


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    rule: str
    severity: str
    message: str

    def format(self) -> str:
        prefix = "warning: " if self.severity == WARNING else ""
        return f"{self.file}:{self.line}: {self.rule}: {prefix}{self.message}"


@dataclass
class LintReport:
    root: Path
    findings: list[Finding]
    rules: list[str]
    routes: list[Route] = field(default_factory=list)     # lines read per route before its first gated row

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> dict:
        return {"root": str(self.root), "ok": self.ok, "errors": len(self.errors), "warnings": len(self.warnings),
                "rules": self.rules, "findings": [asdict(f) for f in self.findings],
                "routes": [{"route": r.number, "lines": r.lines, "pages": r.pages} for r in self.routes]}


def _ignored(skill: Skill, problem: Problem, rule: str) -> bool:
    doc = skill.docs.get(problem.file)
    if doc is None or not 0 < problem.line <= len(doc.lines):
        return False
    match = _IGNORE.search(doc.lines[problem.line - 1])
    return bool(match) and rule in re.split(r"\s*,\s*", match.group(1))


def lint(root: str | Path = ".", config: LintConfig | None = None) -> LintReport:
    config = config or LintConfig()
    skill = load_skill(root)
    if skill.skill_md is None and not skill.docs:  # not a skill at all: one line, not every rule's complaint
        raise DitgateError(f"{skill.root} holds no SKILL.md (nor references/): not a skill folder; give the "
                           "folder of the skill to lint")
    findings: list[Finding] = []
    ran = []
    for rule in RULES:
        if rule.id in config.disabled:
            continue
        ran.append(rule.id)
        for problem in rule.check(skill):
            if _ignored(skill, problem, rule.id):
                continue
            severity = WARNING if problem.warning else config.severity.get(rule.id, rule.severity)
            findings.append(Finding(problem.file, problem.line, rule.id, severity, problem.message))
    findings.sort(key=lambda f: (f.file != "SKILL.md", f.file, f.line, f.rule))
    return LintReport(skill.root, findings, ran, reading_paths(skill))
