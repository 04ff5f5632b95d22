"""The side-route references of the skill: they exist, say when to read them, link correctly, name real APIs.

Covers references/{audio,custom_models,modular_pipeline,perf_matrix,perf_analysis,model_download}.md. Every
`cache_dit.X` / `diffusers.Y` dotted name and every `from cache_dit... import Z` is resolved against the installed
packages, so a renamed or invented API fails here rather than in an agent's session.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFS = ROOT / "references"
FILES = ["audio.md", "custom_models.md", "modular_pipeline.md", "perf_matrix.md", "perf_analysis.md",
         "model_download.md"]
# Every reference file the skill's layout plans (the design's list); links may point at any of them.
PLANNED = {"cache.md", "cp.md", "tp.md", "tep.md", "vaep.md", "cli.md", "testing.md", "install.md", "attention.md",
           *FILES}

FENCE = re.compile(r"^[ \t]*```([^\n]*)\n(.*?)^[ \t]*```[ \t]*$", re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]]+\]\(([^)\s]+)\)")
DOTTED = re.compile(r"\b(?:cache_dit|diffusers)(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
FROM_IMPORT = re.compile(r"^\s*from\s+((?:cache_dit|diffusers)[\w.]*)\s+import\s+\(?([^)\n]+)\)?", re.M)


def text(name: str) -> str:
    return (REFS / name).read_text(encoding="utf-8")


def prose(md: str) -> str:
    """The Markdown without fenced code blocks and inline code (links inside them are not links)."""
    md = FENCE.sub("", md)
    return re.sub(r"`[^`\n]*`", "", md)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower-case, drop punctuation except '-' and '_', spaces become '-'."""
    heading = re.sub(r"`", "", heading.strip().lower())
    kept = "".join(ch for ch in heading if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(md: str) -> set[str]:
    slugs, seen = set(), {}
    for line in FENCE.sub("", md).splitlines():
        m = re.match(r"^(#{1,6})\s+(.*)$", line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        slugs.add(slug if n == 0 else f"{slug}-{n}")
    return slugs


def resolve(dotted: str) -> object:
    """Import the longest importable module prefix of `dotted`, then getattr the rest; raise if anything is missing."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)  # AttributeError names the missing piece
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize("name", FILES)
def test_reference_exists_and_says_when_to_read_it(name):
    path = REFS / name
    assert path.is_file(), f"{path} is missing"
    lines = [ln for ln in text(name).splitlines() if ln.strip()]
    assert lines[0].startswith("# "), f"{name} must open with a title"
    assert re.match(r"\*\*Read this when\*\*", lines[1]), (
        f"{name}: the first line after the title must say when to read it")


@pytest.mark.parametrize("name", FILES)
def test_long_references_have_a_table_of_contents(name):
    md = text(name)
    if len(md.splitlines()) > 300:
        assert re.search(r"^## Contents$", md, re.M), f"{name} is over 300 lines and has no table of contents"


@pytest.mark.parametrize("name", FILES)
def test_relative_links_resolve(name):
    md = text(name)
    skill_complete = (ROOT / "SKILL.md").is_file()
    problems = []
    for target in LINK.findall(prose(md)):
        assert not re.match(r"^[a-z]+:", target), f"{name}: only relative links, got {target}"
        path, _, anchor = target.partition("#")
        if path.startswith("./"):
            path = path[2:]
        if "/" in path:
            problems.append(f"{target}: links stay one level deep (a sibling file in references/)")
            continue
        if path and path not in PLANNED:
            problems.append(f"{target}: not a reference file of the skill")
            continue
        file = REFS / path if path else REFS / name
        if not file.is_file():
            # A sibling written on another branch: must exist once the skill is complete (SKILL.md present).
            if skill_complete:
                problems.append(f"{target}: file does not exist")
            continue
        if anchor and anchor not in anchors(file.read_text(encoding="utf-8")):
            problems.append(f"{target}: no heading with anchor #{anchor} in {file.name}")
    assert not problems, f"{name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("name", FILES)
def test_dotted_api_names_exist(name):
    md = text(name)
    missing = []
    for dotted in sorted(set(DOTTED.findall(md))):
        try:
            resolve(dotted)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{dotted} ({exc})")
    for module, names in FROM_IMPORT.findall(md):
        for imported in (n.strip().split(" as ")[0] for n in names.split(",")):
            if imported:
                try:
                    resolve(f"{module}.{imported}")
                except (ImportError, AttributeError) as exc:
                    missing.append(f"from {module} import {imported} ({exc})")
    assert not missing, (f"{name} names APIs that do not exist in the installed cache-dit/diffusers:\n"
                         + "\n".join(missing))


@pytest.mark.parametrize("name", FILES)
def test_python_fences_parse_and_runnable_fences_are_cheap(name):
    for info, body in FENCE.findall(text(name)):
        info = info.strip()
        if info == "python":
            ast.parse(body)
        elif info == "bash runnable":
            for line in body.splitlines():
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                if line.startswith('python "$SKILL_DIR/examples/'):
                    continue                 # a skill example script (tests/test_skill_fences.py runs it)
                assert line.startswith("ditgate "), f"{name}: runnable fences run ditgate only: {line}"
                assert " zoo:" in line, f"{name}: runnable fences use zoo models: {line}"


METRIC = re.compile(r"(mel PSNR|mel SSIM|SI-SDR|PSNR|SSIM)\s*(≥|≤|>=|<=|>|<)\s*([-−]?\d+(?:\.\d+)?)")
PHASES = {"cache": r"\bcache\b(?!-dit)", "cp": r"\bCP\b", "tp": r"\bTP\b", "tep": r"\bTE-P\b", "vaep": r"\bVAE-P\b",
          "hybrid": r"\bhybrid\b", "quantization": r"\bquantization\b", "compile": r"\bcompile phase\b|\bexact phase\b"}
OPS = {"≥": ">=", "≤": "<="}


@pytest.mark.parametrize("name", FILES)
def test_gate_claims_match_gates_json(name):
    gates = json.loads((ROOT / "checklists" / "gates.json").read_text())
    problems = []
    for line in text(name).splitlines():
        for metric, op, value in METRIC.findall(line):
            key = metric.lower().replace("-", "_").replace(" ", "_")
            claim = (key, OPS.get(op, op), float(value.replace("−", "-")))
            if name == "audio.md":
                allowed = [gates["rules"]["audio"]["checks"]]
            else:
                named = [p for p, pattern in PHASES.items() if re.search(pattern, line)]
                if not named:
                    problems.append(f"gate claim without a phase: {line.strip()}")
                    continue
                allowed = [gates["phases"][p]["modalities"]["image"]["checks"] for p in named]
            for checks in allowed:
                if claim not in {(c["metric"], c["op"], float(c["value"])) for c in checks}:
                    problems.append(f"{metric} {op} {value} is not in gates.json for this line: {line.strip()}")
    assert not problems, f"{name}:\n" + "\n".join(problems)
