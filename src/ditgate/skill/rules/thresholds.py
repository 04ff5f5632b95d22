"""The `threshold` rule: every gate claim in the prose must equal a check in `checklists/gates.json`.

A gate claim is a metric name, a comparison operator and a number: `PSNR > 30 dB`, `SSIM ≥ 0.90`,
`max-abs ≤ 1e-4`, `mel PSNR >= 21`, `SI-SDR ≥ −5 dB`. A number without an operator ("measured 33.8 dB") is not a
claim. The claim's scope is the phase the line names nearest to it (see `claim_scopes`; "audio" and "garbled" name
the rules of those names), else the phase of the file (references/cp.md -> cp), else, for metrics that only a rule
of gates.json owns (max-abs, worst-tile SSIM, the audio metrics), that rule; anything else is a threshold without a
phase. The claim must equal a check of every phase in its scope: same metric, same operator, same value.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ditgate.skill.base import Problem, Skill
from ditgate.skill.rules.phases import file_scope, named_scopes

GATES_FILE = "checklists/gates.json"

# Prose names of metrics -> the gates.json metrics they may stand for (any modality). Longest names first.
METRIC_NAMES: tuple[tuple[str, frozenset[str]], ...] = (
    (r"worst[- _]tile[- _]SSIM", frozenset({"worst_tile_ssim"})),
    (r"mel[- _]PSNR", frozenset({"mel_psnr"})),
    (r"mel[- _]SSIM", frozenset({"mel_ssim"})),
    (r"SI[- _]SDR", frozenset({"si_sdr"})),
    (r"max[- _]abs(?:[- _]error)?", frozenset({"max_abs"})),
    (r"PSNR", frozenset({"psnr", "psnr_frame_min"})),
    (r"SSIM", frozenset({"ssim", "ssim_frame_min"})),
)
OPERATORS = {">": ">", ">=": ">=", "≥": ">=", "⩾": ">=", "&gt;": ">", "&gt;=": ">=",
             "<": "<", "<=": "<=", "≤": "<=", "⩽": "<=", "&lt;": "<", "&lt;=": "<="}
_OP = "|".join(re.escape(op) for op in sorted(OPERATORS, key=len, reverse=True))
_NUMBER = r"[−-]?\d+(?:\.\d+)?(?:[eE][−+-]?\d+)?"


@dataclass(frozen=True)
class Check:
    metric: str
    op: str
    value: float

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


@dataclass(frozen=True)
class Claim:
    start: int
    end: int
    text: str
    metrics: frozenset[str]
    op: str
    value: float


class GateTable:
    """The checks of gates.json by scope: each phase (all modalities, the tensor rule when the phase is exact, the
    region and audio rules), "audio" (the audio rule) and "garbled" (PSNR at least a value while SSIM is below one)."""

    def __init__(self, data: dict):
        rules = data.get("rules", {})

        def checks(entries) -> list[Check]:
            return [Check(c["metric"], c["op"], float(c["value"])) for c in entries or []]

        tensor = checks(rules.get("tensor", {}).get("checks"))
        region = checks(rules.get("region", {}).get("checks"))
        audio = checks(rules.get("audio", {}).get("checks"))
        self.scopes: dict[str, list[Check]] = {}
        phase_metrics: set[str] = set()
        for key, phase in data.get("phases", {}).items():
            own = [c for m in phase.get("modalities", {}).values() for c in checks(m.get("checks"))]
            phase_metrics |= {c.metric for c in own}
            self.scopes[key] = own + (tensor if phase.get("exact") else []) + region + audio
        if "audio" in rules:
            self.scopes["audio"] = audio
        garbled = rules.get("garbled", {})
        if "psnr_at_least" in garbled and "ssim_below" in garbled:    # garbled: PSNR >= a while SSIM < b
            self.scopes["garbled"] = [Check("psnr", ">=", float(garbled["psnr_at_least"])),
                                      Check("ssim", "<", float(garbled["ssim_below"]))]
        self.rule_checks = tensor + region + audio
        self.rule_only_metrics = {c.metric for c in self.rule_checks} - phase_metrics
        self.metrics = phase_metrics | {c.metric for c in self.rule_checks}
        names = list(METRIC_NAMES)
        covered = set().union(*(metrics for _, metrics in names))
        names += [(re.escape(m), frozenset({m})) for m in self.metrics - covered]     # gates.json's own ids
        self._names = sorted(names, key=lambda item: len(item[0]), reverse=True)
        alternatives = "|".join(f"(?P<m{i}>{pattern})" for i, (pattern, _) in enumerate(self._names))
        self._pattern = re.compile(rf"(?<![\w-])(?:{alternatives})(?!\w)\s*(?:\([^)]{{0,24}}\)\s*)?"
                                   rf"(?P<op>{_OP})\s*(?P<value>{_NUMBER})(?![\d.]*\d)", re.IGNORECASE)

    @classmethod
    def load(cls, path: Path) -> GateTable:
        return cls(json.loads(path.read_text(encoding="utf-8")))

    def claims(self, line: str) -> list[Claim]:
        found = []
        for match in self._pattern.finditer(line):
            index = next(int(k[1:]) for k, v in match.groupdict().items() if k.startswith("m") and v)
            value = float(match.group("value").replace("−", "-"))
            found.append(Claim(match.start(), match.end(), match.group(0).strip(), self._names[index][1],
                               OPERATORS[match.group("op").lower()], value))
        return found

    def disagreement(self, claim: Claim, scope: str | None) -> str | None:
        checks = self.rule_checks if scope is None else self.scopes.get(scope)
        if checks is None:
            return f"`{claim.text}`: gates.json has no gates for {scope}"
        relevant = [c for c in checks if c.metric in claim.metrics]
        where = "its rules" if scope is None else scope
        if not relevant:
            return f"`{claim.text}`: gates.json has no {' or '.join(sorted(claim.metrics))} gate for {where}"
        if any(c.op == claim.op and math.isclose(c.value, claim.value, rel_tol=1e-9) for c in relevant):
            return None
        return (f"`{claim.text}` for {where} disagrees with gates.json "
                f"({'; '.join(str(c) for c in relevant)})")


_CONNECTOR = re.compile(r"^(?:[\s/,+&|]|\band\b|\bor\b)*$", re.IGNORECASE)


def _nearest(line: str, names: list[tuple[int, int, str]], last: bool) -> set[str]:
    """The phase name nearest a claim (the last of `names` when the claim follows them, else the first), with the
    names listed together with it: "CP/TP/TE-P", "CP and TP"."""
    if not names:
        return set()
    run = [names[-1] if last else names[0]]
    others = reversed(names[:-1]) if last else iter(names[1:])
    for name in others:
        gap = line[name[1]:run[-1][0]] if last else line[run[-1][1]:name[0]]
        if not _CONNECTOR.match(gap):
            break
        run.append(name)
    return {scope for _, _, scope in run}


def claim_scopes(line: str, claims: list[Claim]) -> list[set[str]]:
    """The phases each claim on a line belongs to, from the phase names on that line.

    When the line names a phase before its first claim, a claim takes the nearest names since the previous claim
    (or inherits the previous claim's); otherwise it takes the nearest names up to the next claim (or inherits the
    next claim's).
    """
    names = named_scopes(line)
    if not names or not claims:
        return [set() for _ in claims]
    scopes: list[set[str]] = [set() for _ in claims]
    if names[0][0] < claims[0].start:
        previous: set[str] = set()
        for i, claim in enumerate(claims):
            start = claims[i - 1].end if i else 0
            previous = _nearest(line, [n for n in names if n[0] >= start and n[1] <= claim.start], True) or previous
            scopes[i] = previous
        return scopes
    following: set[str] = set()
    for i in range(len(claims) - 1, -1, -1):
        end = claims[i + 1].start if i + 1 < len(claims) else len(line)
        following = _nearest(line, [n for n in names if n[0] >= claims[i].end and n[1] <= end], False) or following
        scopes[i] = following
    return scopes


def check_thresholds(skill: Skill) -> Iterator[Problem]:
    path = skill.root / GATES_FILE
    if not path.is_file():
        yield Problem(GATES_FILE, 1, "the gate table is missing; no threshold in the prose can be checked")
        return
    try:
        table = GateTable.load(path)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        yield Problem(GATES_FILE, 1, f"cannot read the gate table: {exc!r}")
        return
    for doc in skill.docs.values():
        default = file_scope(doc.rel)
        for number, line in enumerate(doc.lines, start=1):
            claims = table.claims(line)
            for claim, scopes in zip(claims, claim_scopes(line, claims)):
                if not scopes and default is not None:
                    scopes = {default}
                if not scopes:
                    if claim.metrics <= table.rule_only_metrics:
                        scopes = {None}
                    else:
                        yield Problem(doc.rel, number, f"`{claim.text}`: threshold without a phase (name the"
                                                       f" phase on the same line)")
                        continue
                for scope in sorted(scopes, key=str):
                    message = table.disagreement(claim, scope)
                    if message:
                        yield Problem(doc.rel, number, message)
