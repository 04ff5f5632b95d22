"""Facts about the skill (SKILL.md + references/) that can be checked without the linter.

Frontmatter against the Agent Skills specification, the router's size, its links, every cache-dit / diffusers name
the text mentions, gate numbers against checklists/gates.json, and the reference validator `agentskills`.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SKILL = ROOT / "SKILL.md"
REFS = ROOT / "references"
GATES = json.loads((ROOT / "checklists" / "gates.json").read_text())

# Written in parallel by another developer; SKILL.md may link them before they land.
OTHER_REFS = {"audio.md", "custom_models.md", "modular_pipeline.md", "perf_matrix.md", "perf_analysis.md",
              "model_download.md"}
OWN_REFS = {"cache.md", "cp.md", "tp.md", "tep.md", "vaep.md", "cli.md", "testing.md", "install.md",
            "attention.md"}
ALLOWED_KEYS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
TRIGGERS = [
    "full test matrix", "acceptance test", "speed and accuracy comparison", "speedup", "1/2/4/8-GPU acceptance",
    "quantization accuracy loss", "speech", "TTS", "audio diffusion", "text-to-audio", "SI-SDR", "mel PSNR",
    "全量测试矩阵", "验收测试", "性能与精度对比", "加速比", "1/2/4/8 卡验收", "量化精度损失", "语音模型", "音频扩散",
]
FILE_PHASE = {"cache.md": "cache", "cp.md": "cp", "tp.md": "tp", "tep.md": "tep", "vaep.md": "vaep"}


def skill_files() -> list[Path]:
    return [SKILL, *sorted(REFS.glob("*.md"))]


def own_files() -> list[Path]:
    return [SKILL, *(REFS / name for name in sorted(OWN_REFS))]


def frontmatter() -> tuple[dict, str]:
    text = SKILL.read_text(encoding="utf-8")
    match = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
    assert match, "SKILL.md must start with a YAML frontmatter block"
    return yaml.safe_load(match.group(1)), match.group(2)


def fences(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced block, indented ones (inside list items) included and dedented."""
    blocks = re.findall(r"^( *)```([^\n]*)\n(.*?)^\1```", text, re.S | re.M)
    return [(info, textwrap.dedent(body)) for _, info, body in blocks]


# --- frontmatter and size ---------------------------------------------------------------------------------------

def test_frontmatter_keys_and_name():
    meta, _ = frontmatter()
    assert set(meta) <= ALLOWED_KEYS, f"keys outside the spec: {set(meta) - ALLOWED_KEYS}"
    assert meta["name"] == "cache-dit-model-integration"
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.get("metadata", {}).items())
    assert len(meta.get("compatibility", "")) <= 500


def test_description_length_triggers_and_no_angle_brackets():
    meta, _ = frontmatter()
    description = meta["description"]
    assert 0 < len(description) <= 1024, len(description)
    assert "<" not in description and ">" not in description
    missing = [t for t in TRIGGERS if t not in description]
    assert not missing, f"trigger phrases missing from the description: {missing}"


def test_router_size():
    text = SKILL.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 500
    assert len(text) / 4 <= 5500, f"about {len(text) / 4:.0f} tokens; the body should stay near 5k"


# --- links --------------------------------------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_skill_links_every_reference_and_each_exists_or_is_expected():
    _, body = frontmatter()
    linked = {Path(t.split("#")[0]).name for t in LINK.findall(body) if t.startswith("references/")}
    assert OWN_REFS | OTHER_REFS <= linked, f"not linked from SKILL.md: {(OWN_REFS | OTHER_REFS) - linked}"
    for name in linked:
        assert (REFS / name).exists() or name in OTHER_REFS, f"SKILL.md links a missing reference: {name}"


@pytest.mark.parametrize("path", own_files(), ids=lambda p: p.name)
def test_links_are_relative_one_level_and_resolve(path: Path):
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, anchor = target.partition("#")
        assert not file_part.startswith("/"), f"{path.name}: absolute link {target}"
        if file_part.removeprefix("../").startswith("references/") or (path.parent == REFS and "/" not in file_part):
            assert file_part.removeprefix("../").count("/") <= 1, (
                f"{path.name}: reference deeper than one level: {target}")
        dest = (path.parent / file_part).resolve() if file_part else path
        if dest.name in OTHER_REFS and not dest.exists():
            continue
        assert dest.exists(), f"{path.name}: broken link {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{path.name}: no heading for #{anchor} in {dest.name}"


# --- names in the text exist in the installed cache-dit and diffusers ----------------------------------------------

DOTTED = re.compile(r"\b((?:cache_dit|diffusers)(?:\.[A-Za-z_]\w*)+)")


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def mentioned_names() -> set[str]:
    names: set[str] = set()
    for path in skill_files():
        text = path.read_text(encoding="utf-8")
        names.update(DOTTED.findall(text))
        for info, body in fences(text):
            if info.strip().split(" ")[0] != "python":
                continue
            for node in ast.walk(ast.parse(body)):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in (
                        "cache_dit", "diffusers"):
                    names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_every_cache_dit_and_diffusers_name_exists():
    pytest.importorskip("cache_dit")
    missing = sorted(name for name in mentioned_names() if not resolves(name))
    assert not missing, f"names that do not exist in the installed versions: {missing}"


def test_python_fences_parse():
    for path in skill_files():
        for info, body in fences(path.read_text(encoding="utf-8")):
            if info.strip().split(" ")[0] == "python":
                ast.parse(body)  # raises SyntaxError with the line


# --- gate numbers agree with checklists/gates.json ------------------------------------------------------------------

CLAIM = re.compile(r"(PSNR|SSIM|max-abs|disp_rel_error)\W{0,3}\s*(>=|<=|≥|≤|>|<)\s*(\d+(?:\.\d+)?(?:e-?\d+)?)")
PHASE_WORD = re.compile(r"\b(cache|cp|tp|tep|vaep|hybrid)\b")
OPS = {"≥": ">=", "≤": "<="}
METRIC = {"PSNR": ("psnr", "psnr_frame_min"), "SSIM": ("ssim", "ssim_frame_min"), "max-abs": ("max_abs",),
          "disp_rel_error": ("disp_rel_error",)}


def allowed_checks(phase: str) -> set[tuple[str, str, float]]:
    spec = GATES["phases"][phase]
    checks = [c for modality in spec["modalities"].values() for c in modality["checks"]]
    if spec["exact"]:
        checks += GATES["rules"]["tensor"]["checks"]
    return {(c["metric"], c["op"], float(c["value"])) for c in checks}


@pytest.mark.parametrize("path", own_files(), ids=lambda p: p.name)
def test_gate_claims_match_gates_json(path: Path):
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        claims = CLAIM.findall(line)
        if not claims:
            continue
        phases = PHASE_WORD.findall(line.replace("`", " ")) or [FILE_PHASE.get(path.name)]
        assert phases[0], f"{path.name}:{number}: a gate claim without a phase: {line.strip()}"
        for metric, op, value in claims:
            op = OPS.get(op, op)
            ok = any((m, op, float(value)) in allowed_checks(phases[0]) for m in METRIC[metric])
            assert ok, f"{path.name}:{number}: {metric} {op} {value} is not a {phases[0]} gate: {line.strip()}"


# --- runnable fences, charts, portability ----------------------------------------------------------------------------

def test_runnable_fences_are_cheap_zoo_commands():
    for path in skill_files():
        for info, body in fences(path.read_text(encoding="utf-8")):
            if info.strip() != "bash runnable":
                continue
            for line in filter(None, (raw.strip() for raw in body.splitlines())):
                zoo = line.startswith("ditgate ") and " zoo:" in line
                example = re.match(r'^python "\$SKILL_DIR/examples/[\w/.-]+\.py"', line) is not None
                assert zoo or example, f"{path.name}: neither a zoo command nor a skill example: {line}"


@pytest.mark.parametrize("name", ["SKILL.md", "cache.md", "cp.md", "tp.md"])
def test_decision_charts_are_mermaid(name: str):
    path = SKILL if name == "SKILL.md" else REFS / name
    assert any(info.strip() == "mermaid" for info, _ in fences(path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("path", own_files(), ids=lambda p: p.name)
def test_long_references_have_contents_and_nothing_site_specific(path: Path):
    text = path.read_text(encoding="utf-8")
    if path != SKILL and len(text.splitlines()) > 300:
        assert "## Contents" in text, f"{path.name} is long and has no table of contents"
    for needle in ("vscode_askQuestions", "/workspace/", "conda activate", "CUDA_VISIBLE_DEVICES=", "/home/"):
        assert needle not in text, f"{path.name}: site-specific text {needle!r}"


# --- the reference validator -----------------------------------------------------------------------------------------

def test_agentskills_validate(tmp_path: Path):
    cli = shutil.which("agentskills") or str(Path(sys.executable).with_name("agentskills"))
    if not Path(cli).exists():
        pytest.skip("skills-ref (agentskills) is not installed")
    target = tmp_path / "cache-dit-model-integration"
    target.mkdir()
    shutil.copy(SKILL, target / "SKILL.md")
    shutil.copytree(REFS, target / "references")
    result = subprocess.run([cli, "validate", str(target)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
