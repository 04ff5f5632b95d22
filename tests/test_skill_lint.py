"""`ditgate lint`: a clean skill passes; each rule catches a fault planted in a copy of it."""

from __future__ import annotations

import json

import pytest
from skill_fixture import NAME, ROOT, edit, write_skill

from ditgate.skill import LintConfig, lint
from ditgate.skill.markdown import github_slug, heading_slugs
from ditgate.skill.rules.thresholds import GateTable, claim_scopes


@pytest.fixture()
def skill(tmp_path):
    return write_skill(tmp_path)


def rules_of(report, severity="error"):
    return sorted({f.rule for f in report.findings if f.severity == severity})


def only(report, rule):
    """The findings of one rule; fails when any other rule reported an error."""
    assert rules_of(report) in ([rule], []), [f.format() for f in report.findings]
    return [f for f in report.findings if f.rule == rule]


def test_clean_skill_passes(skill):
    report = lint(skill)
    assert report.findings == [], [f.format() for f in report.findings]
    assert report.ok


# --- frontmatter -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("old, new, expected", [
    ("license: Apache-2.0", "license: Apache-2.0\nuser-invocable: true", "`user-invocable` is not in the Agent Skills"),
    ("name: cache-dit-model-integration", "name: cache-dit--model-integration", "single hyphens"),
    ("name: cache-dit-model-integration", "name: Cache-Dit", "lowercase"),
    ("name: cache-dit-model-integration", "name: " + "a" * 65, "at most 64"),
    ("description: Integrate", "description: " + "x" * 1030 + " Integrate", "at most 1024"),
    ('  version: "1"', "  version: 1", "must map a string to a string"),
    ('metadata:\n  version: "1"', "metadata: {version: '1'}", "flow style"),
    ("license: Apache-2.0", "compatibility: " + "y" * 501, "at most 500"),
    ("---\nname:", "name:", "must start with YAML frontmatter"),
])
def test_frontmatter_faults(skill, old, new, expected):
    edit(skill / "SKILL.md", old, new)
    findings = only(lint(skill), "frontmatter")
    assert any(expected in f.message for f in findings), [f.format() for f in findings]


def test_frontmatter_reports_the_line_of_the_key(skill):
    edit(skill / "SKILL.md", "license: Apache-2.0", "license: Apache-2.0\nuser-invocable: true")
    [finding] = only(lint(skill), "frontmatter")
    assert (finding.file, finding.line) == ("SKILL.md", 6)
    assert finding.format().startswith("SKILL.md:6: frontmatter: key `user-invocable`")


def test_name_must_equal_folder_name(tmp_path):
    root = write_skill(tmp_path, name="some-other-folder")
    [finding] = only(lint(root), "frontmatter")
    assert "folder name 'some-other-folder'" in finding.message


def test_folder_name_is_not_checked_in_a_source_tree(tmp_path):
    root = write_skill(tmp_path, name="checkout")
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert lint(root).findings == []


# --- budget ------------------------------------------------------------------------------------------------------

def test_budget_lines(skill):
    with (skill / "SKILL.md").open("a") as f:
        f.write("filler\n" * 480)
    [finding] = only(lint(skill), "budget")
    assert finding.line == 501 and "the budget is 500" in finding.message


def test_budget_tokens_estimated_from_characters(skill):
    with (skill / "SKILL.md").open("a") as f:
        f.write(("word " * 100 + "\n") * 45)
    [finding] = only(lint(skill), "budget")
    assert "estimated as characters / 4" in finding.message and "the budget is 5000" in finding.message


# --- links, anchors, nesting, portability -------------------------------------------------------------------------

def test_broken_link(skill):
    edit(skill / "references" / "tp.md", "# Tensor parallelism\n", "# Tensor parallelism\nSee [x](missing.md).\n")
    [finding] = only(lint(skill), "link")
    assert (finding.file, finding.line) == ("references/tp.md", 2)
    assert "references/missing.md does not exist" in finding.message


def test_broken_anchor(skill):
    edit(skill / "references" / "cache.md", "(cp.md#gate)", "(cp.md#gates)")
    [finding] = only(lint(skill), "anchor")
    assert finding.file == "references/cache.md" and "`#gates` is not a heading of references/cp.md" in finding.message


def test_broken_anchor_in_same_file(skill):
    edit(skill / "SKILL.md", "(#phases)", "(#the-phases)")
    [finding] = only(lint(skill), "anchor")
    assert finding.file == "SKILL.md"


def test_github_slugs():
    assert github_slug("0.6 Phase checklist (TODO)") == "06-phase-checklist-todo"
    assert github_slug("Cache → CP → TP") == "cache--cp--tp"
    assert github_slug("`enable_cache` & friends") == "enable_cache--friends"
    assert github_slug("Übersicht 概要") == "übersicht-概要"
    assert heading_slugs(["Gate", "Gate", "Gate-1"]) == ["gate", "gate-1", "gate-1-1"]


def test_nested_reference(skill):
    (skill / "references" / "deep").mkdir()
    (skill / "references" / "deep" / "x.md").write_text("# Deep\n")
    edit(skill / "SKILL.md", "## Phases\n", "## Phases\nRead [deep](references/deep/x.md) when lost.\n")
    findings = only(lint(skill), "nesting")
    assert {(f.file, f.line) for f in findings} == {("SKILL.md", 16), ("references/deep/x.md", 1)}


@pytest.mark.parametrize("target", ["../README.md", "scripts/run.sh", "/etc/hosts"])
def test_link_leaving_the_installed_skill(skill, target):
    (skill / "scripts").mkdir()
    (skill / "scripts" / "run.sh").write_text("true\n")
    (skill.parent / "README.md").write_text("# Readme\n")
    edit(skill / "SKILL.md", "## Phases\n", f"## Phases\nSee [this]({target}).\n")
    report = lint(skill)
    assert rules_of(report) in (["portable"], ["link", "portable"])
    assert [f.line for f in report.findings if f.rule == "portable"] == [16]


@pytest.mark.parametrize("path, expected", [
    ("examples/plugins/flux_as_new.py", 'relative to the skill\'s folder, so the fence runs only from there; write'
                                        ' "$SKILL_DIR/examples/plugins/flux_as_new.py"'),
    ('"$SKILL_DIR/scripts/run.sh"', "is not in an installed copy, which holds only SKILL.md, references"),
])
def test_runnable_fence_paths_run_from_any_folder(skill, path, expected):
    (skill / "examples" / "plugins").mkdir(parents=True)
    (skill / "examples" / "plugins" / "flux_as_new.py").write_text("x = 1\n")
    (skill / "scripts").mkdir()
    (skill / "scripts" / "run.sh").write_text("true\n")      # in the source tree, not in an installed copy
    edit(skill / "SKILL.md", "ditgate lint --json\n",
         f"ditgate lint --json\nditgate run zoo:flux --integration {path}\n")
    [finding] = only(lint(skill), "portable")
    assert finding.line == 41 and expected in finding.message, finding.format()


def test_runnable_fence_path_that_does_not_resolve_in_the_installed_copy(skill):
    (skill / "examples" / "plugins").mkdir(parents=True)
    (skill / "examples" / "plugins" / "flux_as_new.py").write_text("x = 1\n")
    edit(skill / "SKILL.md", "ditgate lint --json\n", 'ditgate lint --json\n'
         'ditgate run zoo:flux --integration "$SKILL_DIR/examples/plugins/flux_as_new.py" --rows cache\n')
    assert lint(skill).findings == []
    edit(skill / "SKILL.md", "plugins/flux_as_new.py", "plugins/flux_as_old.py")
    [finding] = only(lint(skill), "route")
    assert finding.line == 41
    assert "`examples/plugins/flux_as_old.py` is named here but does not exist" in finding.message


# --- reading path -------------------------------------------------------------------------------------------------

ROUTES = """## Routes
| # | The user wants | Read first | Run first |
|---|---|---|---|
| 1 | A new model | [cache.md](references/cache.md) | `ditgate run MODEL --rows cache` |
| 2 | An audio model | [audio.md](references/audio.md), then route 1 | `ditgate run MODEL --rows calibration` |

## Phases
"""


def test_reading_path_per_route_and_its_budget(skill):
    edit(skill / "SKILL.md", "## Phases\n", ROUTES)
    report = lint(skill)
    assert report.findings == []
    skill_lines = len((skill / "SKILL.md").read_text().splitlines())
    assert [(r.number, r.pages) for r in report.routes] == [
        ("1", {"SKILL.md": skill_lines, "references/cache.md": 5}),
        ("2", {"SKILL.md": skill_lines, "references/audio.md": 3, "references/cache.md": 5})]
    with (skill / "references" / "cache.md").open("a") as f:
        f.write("## Long tail\n" + "more\n" * 600)
    findings = only(lint(skill), "reading")
    assert [(f.line, f.message.split(":")[0]) for f in findings] == [(18, "route 1"), (19, "route 2")]
    assert "lines (SKILL.md " in findings[0].message and "the budget is 600" in findings[0].message
    edit(skill / "SKILL.md", "| [cache.md](references/cache.md) |", "| [cache.md](references/cache.md#gate) |")
    report = lint(skill)                   # only the linked section is read: its heading to the next one
    assert report.findings == [] and report.routes[0].pages["references/cache.md#gate"] == 3


def test_cli_prints_the_reading_path_of_every_route(skill, run_cli):
    edit(skill / "SKILL.md", "## Phases\n", ROUTES)
    code, out, _ = run_cli("lint", skill, "--disable", "api")
    assert code == 0 and "reading path: route 1: " in out and "reading path: route 2: " in out
    code, out, _ = run_cli("lint", skill, "--disable", "api", "--json")
    routes = json.loads(out)["routes"]
    assert [r["route"] for r in routes] == ["1", "2"] and routes[1]["pages"]["references/audio.md"] == 3


# --- routes, reachability, phase files ------------------------------------------------------------------------------

def test_unreachable_reference(skill):
    (skill / "references" / "orphan.md").write_text("# Orphan\n")
    [finding] = only(lint(skill), "unreachable")
    assert (finding.file, finding.line) == ("references/orphan.md", 1)


def test_a_read_x_when_y_line_reaches_a_reference(skill):
    (skill / "references" / "perf.md").write_text("# Perf\n")
    edit(skill / "SKILL.md", "## Phases\n", "## Phases\nRead `references/perf.md` when a speedup looks wrong.\n")
    assert lint(skill).findings == []


def test_route_to_missing_file(skill):
    edit(skill / "SKILL.md", "## Phases\n", "## Phases\nRead `./references/perf_matrix.md` when benchmarking.\n")
    [finding] = only(lint(skill), "route")
    assert (finding.file, finding.line) == ("SKILL.md", 16)
    assert "references/perf_matrix.md" in finding.message


def test_phase_without_notebook(skill):
    (skill / "notebooks" / "40_tp.ipynb").unlink()
    [finding] = only(lint(skill), "phase-files")
    assert finding.message == "phase tp has no notebook (notebooks/40_tp.ipynb is missing)"
    assert finding.line == 20            # where SKILL.md routes to references/tp.md


def test_phase_without_checklist_and_the_rule_can_be_disabled_or_demoted(skill):
    (skill / "checklists" / "cp.yaml").unlink()
    edit(skill / "SKILL.md", "`checklists/cp.yaml`", "checklist to come")
    assert rules_of(lint(skill)) == ["phase-files"]
    assert lint(skill, LintConfig(disabled=frozenset({"phase-files"}))).findings == []
    demoted = lint(skill, LintConfig(severity={"phase-files": "warning"}))
    assert demoted.ok and rules_of(demoted, "warning") == ["phase-files"]


# --- thresholds ----------------------------------------------------------------------------------------------------

def test_threshold_disagreeing_with_gates(skill):
    edit(skill / "SKILL.md", "| PSNR > 30 dB and", "| PSNR > 25 dB and")
    [finding] = only(lint(skill), "threshold")
    assert finding.line == 18
    assert finding.message == "`PSNR > 25` for cache disagrees with gates.json (psnr > 30; psnr_frame_min > 30)"


def test_threshold_operator_meaning_matters(skill):
    edit(skill / "references" / "cp.md", "PSNR > 35 dB", "PSNR ≥ 35 dB")
    [finding] = only(lint(skill), "threshold")
    assert finding.file == "references/cp.md" and "for cp disagrees" in finding.message


def test_threshold_without_a_phase(skill):
    edit(skill / "SKILL.md", "## Phases\n", "## Phases\nAlways require PSNR > 35 dB.\n")
    [finding] = only(lint(skill), "threshold")
    assert "threshold without a phase" in finding.message


def test_threshold_of_a_rule_in_the_wrong_phase(skill):
    edit(skill / "references" / "cache.md", "against the uncached one.", "and max-abs ≤ 1e-4.")
    [finding] = only(lint(skill), "threshold")
    assert "no max_abs gate for cache" in finding.message


def test_audio_thresholds_follow_the_audio_rule(skill):
    edit(skill / "references" / "cp.md", "Back to", "Under CP an audio model keeps mel SSIM ≥ 0.75. Back to")
    assert lint(skill).findings == []
    edit(skill / "references" / "audio.md", "SI-SDR ≥ −5 dB", "SI-SDR ≥ −3 dB")
    [finding] = only(lint(skill), "threshold")
    assert "si_sdr >= -5" in finding.message


def test_unreadable_gate_table(skill):
    (skill / "checklists" / "gates.json").write_text("{not json")
    [finding] = only(lint(skill), "threshold")
    assert finding.file == "checklists/gates.json" and "cannot read the gate table" in finding.message


def test_garbled_rule(skill):
    edit(skill / "SKILL.md", "## Phases\n", "## Phases\nA garbled image: PSNR ≥ 25 dB while SSIM < 0.5.\n")
    assert lint(skill).findings == []
    edit(skill / "SKILL.md", "PSNR ≥ 25 dB while", "PSNR ≥ 20 dB while")
    [finding] = only(lint(skill), "threshold")
    assert "for garbled disagrees with gates.json (psnr >= 25)" in finding.message


def test_lint_ignore_comment_silences_a_rule_on_its_line(skill):
    edit(skill / "SKILL.md", "## Phases\n",
         "## Phases\ncache-dit's own test used PSNR ≥ 20. <!-- lint-ignore: threshold -->\n")
    assert lint(skill).findings == []


def test_claim_scopes_prefix_and_suffix_styles():
    table = GateTable.load(ROOT / "checklists" / "gates.json")
    line = "cache PSNR > 30 dB and SSIM > 0.90; CP/TP/TE-P/VAE-P PSNR > 35 dB and SSIM > 0.90"
    parallel = {"cp", "tp", "tep", "vaep"}
    assert claim_scopes(line, table.claims(line)) == [{"cache"}, {"cache"}, parallel, parallel]
    line = "PSNR > 30 dB for cache-dit's cache; PSNR > 35 dB in Ulysses mode"
    assert claim_scopes(line, table.claims(line)) == [{"cache"}, {"cp"}]
    line = "it passes PSNR > 35 dB and SSIM > 0.90 (the TP gate), with no garbled or region failure"
    assert claim_scopes(line, table.claims(line)) == [{"tp"}, {"tp"}]          # the nearest name wins
    line = "| TE-P | [tep.md](references/tep.md) | CP and TP: PSNR > 35 dB |"
    assert claim_scopes(line, table.claims(line)) == [{"cp", "tp"}]
    assert table.claims("measured 33.8 dB PSNR, PSNR ≈ 34") == []


# --- API names ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("old, new, expected", [
    ("DBCacheConfig, ForwardPattern", "DBCacheConfig, ForwardPatern", "cache_dit has no attribute `ForwardPatern`"),
    ("ForwardPattern.Pattern_1)", "ForwardPattern.Pattern_9)", "has no attribute `Pattern_9`"),
    ("DBCacheConfig(Fn_compute_blocks=1)", "DBCacheConfig(Fn_compute_block=1)", "takes no argument `Fn_compute_block`"),
    ("`ForwardPattern.Pattern_0`", "`ForwardPattern.Pattern_7`", "has no attribute `Pattern_7`"),
    ("The gate table is", "`cache_dit.enable_caching(pipe)` is gone. The gate table is", "`enable_caching`"),
    ("import cache_dit\n", "import cache_dit\nfrom diffusers.hooks import apply_first_block_cache, no_such_hook\n",
     "no attribute `no_such_hook`"),
    ("The gate table is", "`diffusers.FluxPipeline.transformr` The gate table is", "has no attribute `transformr`"),
])
def test_api_names_must_exist(skill, old, new, expected):
    edit(skill / "SKILL.md", old, new)
    findings = only(lint(skill), "api")
    assert len(findings) == 1 and expected in findings[0].message, [f.format() for f in findings]


@pytest.mark.parametrize("old, new, expected", [
    ("import cache_dit\n", 'import cache_dit\nq = cache_dit.QuantizeConfig(quant_type="bnb_4bit")\n',
     "`quant_type='bnb_4bit'` is not a value cache-dit accepts (choose from float8_per_row"),
    ("import cache_dit\n", 'import cache_dit\nq = cache_dit.QuantizeConfig(backend="bitsandbytes")\n',
     "`backend='bitsandbytes'` names no member of QuantizeBackend"),
    ("The gate table is", '`ring_rotate_method="ring"` is not. The gate table is',
     "`ring_rotate_method='ring'` is not a value cache-dit accepts (choose from allgather, p2p)"),
    ("ditgate lint --json\n", "ditgate lint --json\ncache-dit-generate flux --q-type bnb_4bit\n",
     "argument --quantize-type/--q-type: invalid choice: 'bnb_4bit'"),
    ("The gate table is", "`torchrun --nproc_per_node=2 -m cache_dit.generate flux --parallel ulyses` The",
     "invalid choice: 'ulyses'"),
    ("The gate table is", "`cache-dit-generate flux --cache --sumary` The gate table is",
     "unrecognized arguments: --sumary"),
    ("The gate table is", "`--attn` takes `--quantize-type bnb_4bit`. The gate table is",
     "`cache-dit-generate --quantize-type bnb_4bit`: argument --quantize-type/--q-type: invalid choice: 'bnb_4bit'"),
])
def test_values_and_cache_dit_command_lines_must_be_accepted(skill, old, new, expected):
    """Strings and command-line choices are checked against the installed cache-dit, not a list kept here."""
    edit(skill / "SKILL.md", old, new)
    findings = only(lint(skill), "api")
    assert len(findings) == 1 and expected in findings[0].message, [f.format() for f in findings]


def test_class_names_in_code_spans_must_exist(skill):
    (skill / "examples").mkdir()
    (skill / "examples" / "mine.py").write_text("class TinyThingProcessor:\n    pass\n")
    edit(skill / "SKILL.md", "The gate table is", "`FluxTransformer2DModel`, `FluxContextParallelismPlanner`,"
         " `Flux3AttnProcessor`, `T5EncoderModel`, `TinyThingProcessor` and `MyDiTPipeline`. The gate table is")
    assert lint(skill).findings == []
    edit(skill / "SKILL.md", "`FluxTransformer2DModel`", "`FluxTransfomer2DModel`")
    [finding] = only(lint(skill), "api")
    assert "`FluxTransfomer2DModel` is not a class of the installed cache-dit, diffusers" in finding.message


def test_the_right_values_pass(skill):
    edit(skill / "SKILL.md", "import cache_dit\n",
         'import cache_dit\nq = cache_dit.QuantizeConfig(quant_type="float8_per_row", backend="torchao")\n')
    edit(skill / "SKILL.md", "ditgate lint --json\n",
         "ditgate lint --json\ncache-dit-generate my_dit --quantize-type bitsandbytes_4bit --parallel ulysses\n")
    edit(skill / "SKILL.md", "The gate table is",
         '`quant_type="bitsandbytes_4bit"`, `ring_rotate_method="p2p"`. The gate table is')
    assert lint(skill).findings == []


def test_api_ignores_code_that_is_not_cache_dit_or_diffusers(skill):
    edit(skill / "SKILL.md", "import cache_dit\n",
         "import cache_dit\nfrom ...attention import _dispatch_attention_fn\nfrom my_model import MyDiT\n"
         "from diffusers import MyModelPipeline\n"
         "x = MyDiT.whatever + pipe.transformer.nothing\n")
    edit(skill / "SKILL.md", "The gate table is", "`python -m cache_dit.generate flux` works; instance attributes"
         " such as `diffusers.FluxPipeline.transformer` and `cache_dit.BlockAdapter.blocks` exist. The gate table is")
    assert lint(skill).findings == []


# --- command lines --------------------------------------------------------------------------------------------------

def test_runnable_fence_with_unknown_flag(skill):
    edit(skill / "SKILL.md", "ditgate lint --json", "ditgate lint --jsn")
    [finding] = only(lint(skill), "command")
    assert finding.severity == "error" and finding.line == 40
    assert "unrecognized arguments: --jsn" in finding.message


def test_runnable_fence_with_unknown_subcommand_and_continued_line(skill):
    edit(skill / "SKILL.md", "    --force", "    --forse")
    [finding] = only(lint(skill), "command")
    assert finding.line == 41 and "--forse" in finding.message


def test_plain_bash_fence_only_warns(skill):
    with (skill / "SKILL.md").open("a") as f:
        f.write("\n```bash\nditgate frobnicate zoo:flux\nFOO=1 python -m ditgate zoo list | head\n```\n")
    report = lint(skill)
    assert report.ok and rules_of(report, "warning") == ["command"]
    [warning] = report.warnings
    assert "invalid choice: 'frobnicate'" in warning.message


def test_shell_variables_and_placeholders_are_not_judged(skill):
    with (skill / "SKILL.md").open("a") as f:
        f.write("\n```bash runnable\nditgate zoo build \"$MODEL\" $OUT --seed $SEED 2>&1 > log.txt\n```\n")
        f.write("\n```bash\nditgate zoo build NAME <dir> --seed N [--overwrite]\n```\n")
    assert lint(skill).findings == []
    edit(skill / "SKILL.md", "[--overwrite]", "--overwrite --seeed 1")
    [warning] = lint(skill).warnings
    assert "unrecognized arguments: --seeed 1" in warning.message


@pytest.mark.parametrize("span, expected", [
    ("ditgate run MODEL --rws cache", "`ditgate run` has no option --rws"),
    ("ditgate run MODEL --launch twice", "--launch twice: not one of once, per-row"),
    ("ditgate frobnicate MODEL", "no ditgate command `frobnicate`"),
    ("ditgate skill install --layot all", "`ditgate skill install` has no option --layot"),
])
def test_partial_commands_in_code_spans(skill, span, expected):
    edit(skill / "SKILL.md", "The gate table is", "`ditgate run MODEL --rows cache`, `ditgate gate` and"
         " `ditgate run --height H --launch per-row`. The gate table is")
    assert lint(skill).findings == []                   # what a span leaves out is not judged
    edit(skill / "SKILL.md", "The gate table is", f"`{span}`. The gate table is")
    [finding] = only(lint(skill), "command")
    assert finding.severity == "error" and expected in finding.message, finding.format()


# --- the command ----------------------------------------------------------------------------------------------------

def test_cli_reports_and_exit_codes(skill, run_cli):
    code, out, _ = run_cli("lint", skill)
    assert code == 0 and "0 error(s)" in out
    (skill / "references" / "orphan.md").write_text("# Orphan\n")
    code, out, _ = run_cli("lint", skill)
    assert code == 1 and "references/orphan.md:1: unreachable: no route" in out
    code, out, _ = run_cli("lint", skill, "--json", "--warn", "unreachable")
    data = json.loads(out)
    assert code == 0 and data["ok"] and data["warnings"] == 1 and data["findings"][0]["rule"] == "unreachable"
    code, _, err = run_cli("lint", skill, "--disable", "nosuchrule")
    assert code == 2 and "unknown lint rule" in err


def test_cli_missing_skill(tmp_path, run_cli):
    code, out, err = run_cli("lint", tmp_path)  # not a skill: one line, not every rule's complaint
    assert code == 2 and not out and len(err.splitlines()) == 1 and "holds no SKILL.md" in err, err
    (tmp_path / "references").mkdir()
    (tmp_path / "references" / "a.md").write_text("# A\n")
    code, out, _ = run_cli("lint", tmp_path)  # a skill that lost its SKILL.md
    assert code == 1 and "SKILL.md:1: frontmatter: the skill has no SKILL.md" in out
    code, _, err = run_cli("lint", tmp_path / "absent")
    assert code == 2 and "does not exist" in err


def test_fixture_folder_is_named_after_the_skill(skill):
    assert skill.name == NAME
