"""Executable checklists: the files validate, their automated items pass on zoo:flux and fail on broken plugins."""

import json
import re
from pathlib import Path

import pytest
import yaml

from ditgate import checklists
from ditgate.checklists import ChecklistError, check_fact, expect_holds, fact_values
from ditgate.checklists.named import CHECKS
from ditgate.core.paths import checklists_dir, data_root
from ditgate.skill.markdown import parse
from ditgate.skill.rules.phases import PHASES

PLUGINS = Path(__file__).parent / "plugins"
EXPECTED = {"gate-check", "cache", "cp", "tp", "tep", "vaep", "hybrid", "cli", "final", "audio", "custom-model", "perf-matrix"}


def _filled(out: Path, name: str) -> dict:
    path = out / f"checklist-{name}.yaml"
    assert checklists.validate(path, data := yaml.safe_load(path.read_text())) == []  # a filled copy validates too
    return data


def _status(filled: dict) -> dict[str, str]:
    return {item["id"]: item["result"]["status"] for item in filled["items"]}


# ------------------------------------------------------------------------------------------------- the files
def test_every_checklist_validates():
    found = {c.name: c for c in checklists.validate_all()}
    assert set(found) == EXPECTED
    for phase in PHASES:  # the linter's phase table names these files
        assert (data_root() / phase.checklist).is_file()
    for checklist in found.values():
        assert any(item.automated for item in checklist.items), checklist.name


def test_every_reference_anchor_exists():
    root = data_root()
    docs = {}
    for path in sorted(checklists_dir().glob("*.yaml")):
        for item in yaml.safe_load(path.read_text())["items"]:
            rel, _, anchor = item["ref"].partition("#")
            if rel not in docs:
                docs[rel] = parse(root / rel, root).anchors()
            assert anchor in docs[rel], f"{path.name}: {item['id']}: {item['ref']}"


def test_every_named_check_is_used_and_listed(run_cli):
    used = {item["check"]["name"] for path in checklists_dir().glob("*.yaml")
            for item in yaml.safe_load(path.read_text())["items"] if item["check"]["kind"] == "named"}
    assert used == set(CHECKS)
    code, out, _ = run_cli("checklist", "--list-checks")
    assert code == 0 and all(name in out for name in CHECKS)


BROKEN = """\
name: broken
title: Broken on purpose
when: never
items:
  - id: wrong-kind
    text: t
    ref: references/cp.md#procedure
    check: {kind: rows, row: cache}
  - id: typo-row
    text: t
    ref: references/cp.md#procedure
    check: {kind: row, row: cp-ulyses-2}
  - id: unknown-check
    text: t
    ref: references/cp.md#procedure
    check: {kind: named, name: looks-fine}
  - id: bad-args
    text: t
    ref: references/cp.md#procedure
    check: {kind: named, name: integration-provides, args: {hook: vae_plan}}
  - id: bad-anchor
    text: t
    ref: references/cp.md#no-such-section
    check: {kind: manual, evidence: e}
  - id: bad-fact
    text: t
    ref: references/cp.md#procedure
    check: {kind: inspect, fact: attention.headz, expect: 4}
  - id: bad-expect
    text: t
    ref: references/cp.md#procedure
    check: {kind: inspect, fact: attention.heads, expect: {between: [1, 2]}}
  - id: bad-fact
    text: t
    ref: references/cp.md#procedure
    check: {kind: manual, evidence: e}
    extra: 1
"""


def test_errors_name_the_file_the_item_and_the_field(tmp_path, run_cli):
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    with pytest.raises(ChecklistError) as caught:
        checklists.load(path)
    lines = str(caught.value).splitlines()
    expected = {
        "item 'wrong-kind' (items[0]): field check.kind": "is not one of",
        "item 'typo-row' (items[1]): field check.row": "unknown row 'cp-ulyses-2'",
        "item 'unknown-check' (items[2]): field check.name": "unknown named check 'looks-fine'",
        "item 'bad-args' (items[3]): field check.args.hook": "'vae_plan' is not one of",
        "item 'bad-anchor' (items[4]): field ref": "no heading with the anchor #no-such-section",
        "item 'bad-fact' (items[5]): field check.fact": "no key 'headz'",
        "item 'bad-expect' (items[6]): field check.expect.between": "unknown field",
        "item 'bad-fact' (items[7]): field extra": "unknown field",
    }
    for where, what in expected.items():
        assert any(line.startswith(f"{path}: {where}: ") and what in line for line in lines), (where, lines)
    assert any("(items[7]): field id: duplicate id 'bad-fact'" in line for line in lines)
    code, _, err = run_cli("checklist", "--validate", path)
    assert code == 2 and "unknown named check 'looks-fine'" in err


def test_a_checklist_with_an_unknown_check_never_runs(tmp_path, run_cli):
    path = tmp_path / "one.yaml"
    path.write_text("name: one\ntitle: t\nwhen: t\nitems:\n  - {id: x, text: t, ref: references/cp.md#procedure,"
                    " check: {kind: named, name: no-such-check}}\n")
    code, out, err = run_cli("checklist", path, "--model", "zoo:flux", "--out", tmp_path / "out")
    assert code == 2 and "unknown named check 'no-such-check'" in err
    assert not (tmp_path / "out").exists()


def test_validate_command(run_cli):
    code, out, _ = run_cli("checklist", "--validate")
    assert code == 0
    assert {line.split()[1] for line in out.splitlines()} == EXPECTED
    code, out, _ = run_cli("checklist", "--validate", "cp,tp")
    assert code == 0 and len(out.splitlines()) == 2
    code, _, err = run_cli("checklist", "--validate", "cq")
    assert code == 2 and "no checklist 'cq'" in err


def test_expectations_and_fact_paths():
    data = {"a": [{"p": "Pattern_1"}, {"p": None}], "d": {"2": {"tp": True}}, "n": 4, "e": []}
    assert fact_values(data, "a.*.p") == [("a.0.p", "Pattern_1"), ("a.1.p", None)]
    assert fact_values(data, "d.2.tp") == [("d.2.tp", True)]
    assert not expect_holds(True, 1) and not expect_holds(1, True)  # True == 1 in Python, not in a checklist
    assert expect_holds({"at_least": 4}, 4) and not expect_holds({"at_least": 4}, "4")
    assert expect_holds({"one_of": ["ok", "x"]}, "ok") and expect_holds({"not_equals": "x"}, "ok")
    assert expect_holds({"empty": True}, []) and expect_holds({"empty": False}, ["x"])
    assert check_fact(data, "a.*.p", {"present": True}).status == "fail"  # one of two is None
    assert check_fact(data, "d.2.tp", True).status == "pass"
    assert check_fact(data, "e.*", 1).status == "fail"  # nothing to check is not a pass
    assert check_fact(data, "missing.key", {"present": True}).status == "fail"


def test_out_folder_must_be_new(tmp_path, run_cli):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    code, _, err = run_cli("checklist", "cache", "--model", "zoo:flux", "--out", tmp_path / "used")
    assert code == 2 and "not empty" in err


# ------------------------------------------------------------------------------------------------- runs
def test_phase_checklists_pass_on_flux(tmp_path, run_cli, flux_default_run):
    """One inspect pass and one runner call for the five phase checklists; the rows come from the session's run of
    the default rows (--from-run), the named checks run here."""
    out = tmp_path / "run"
    code, stdout, err = run_cli("checklist", "cache,cp,tp,tep,vaep", "--model", "zoo:flux", "--out", out,
                                "--from-run", flux_default_run[1])
    filled = {name: _filled(out, name) for name in ("cache", "cp", "tp", "tep", "vaep")}
    not_passed = {f"{n}/{i['id']}": i["result"] for n, f in filled.items() for i in f["items"]
                  if i["result"]["status"] not in ("pass", "manual")}
    assert code == 0 and not not_passed, (not_passed, err[-3000:])
    for name, data in filled.items():
        for item in data["items"]:
            assert (item["result"]["status"] == "manual") == (item["check"]["kind"] == "manual")
        assert data["run"]["passed"] and data["run"]["counts"]["manual"] > 0  # manual items do not fail a run
    assert (out / "report.json").is_file() and "checklist: running rows" in err
    computed = {r["name"] for r in json.loads((out / "report.json").read_text())["rows"] if not r["resumed"]}
    assert computed == {"cache-all-steps"}  # the default rows were reused; only a named check's own row ran here
    evidence = {f"{n}/{i['id']}": i["result"]["evidence"] for n, f in filled.items() for i in f["items"]}
    assert "cached steps [2, 4, 6]" in evidence["cache/cache-row"]
    split = re.search(r"(\d+) tokens split into (\d+) per rank", evidence["cp/ulysses-row"])
    assert split and int(split[1]) == 2 * int(split[2]), evidence["cp/ulysses-row"]
    assert "FluxContextParallelismPlanner" in evidence["cp/plan-consistent"]
    assert "text_encoder_2 (T5EncoderModel)" in evidence["tep/planner-registered"]
    assert "rank 0 decoded" in evidence["vaep/vaep-row"]
    assert "PASS    cache-off-identical" in stdout and "MANUAL  grid-looked-at" in stdout


def test_from_run_must_be_a_matching_run(tmp_path, run_cli, flux_default_run):
    code, _, err = run_cli("checklist", "cp", "--model", "zoo:flux", "--out", tmp_path / "a", "--from-run", tmp_path)
    assert code == 2 and "not a run folder" in err
    code, _, err = run_cli("checklist", "tp", "--model", "zoo:flux", "--out", tmp_path / "b", "--steps", "3",
                           "--from-run", flux_default_run[1])
    assert code == 2 and "cannot resume" in err and "request" in err


def test_wrong_forward_pattern_fails_the_cache_items(tmp_path, run_cli):
    out = tmp_path / "run"
    code, _, _ = run_cli("checklist", "cache", "--model", "zoo:flux", "--out", out,
                         "--integration", PLUGINS / "flux_wrong_pattern.py")
    status = _status(_filled(out, "cache"))
    assert code == 1
    assert status["pattern-matches"] == status["cache-off-identical"] == status["cache-row"] == "fail"
    assert status["adapter-exists"] == status["separate-cfg-matches"] == status["every-list-has-a-pattern"] == "pass"
    evidence = {i["id"]: i["result"]["evidence"] for i in _filled(out, "cache")["items"]}
    assert "declared Pattern_0, observed Pattern_1" in evidence["pattern-matches"]


def test_plan_without_gather_fails_the_cp_items(tmp_path, run_cli):
    out = tmp_path / "run"
    code, _, _ = run_cli("checklist", "cp", "--model", "zoo:flux", "--out", out,
                         "--integration", PLUGINS / "flux_cp_no_gather.py")
    status = _status(_filled(out, "cp"))
    assert code == 1
    assert status["plan-consistent"] == status["ulysses-row"] == status["ring-row"] == "fail"
    assert status["plan-exists"] == status["ulysses-divides"] == status["ring-divides"] == "pass"


def test_gate_check_and_cli_checklists_pass_on_flux(tmp_path, run_cli):
    out = tmp_path / "run"
    code, _, err = run_cli("checklist", "gate-check,cli", "--model", "zoo:flux", "--out", out)
    gate, cli = _filled(out, "gate-check"), _filled(out, "cli")
    assert code == 0, (_status(gate), _status(cli), err[-3000:])
    evidence = {i["id"]: i["result"]["evidence"] for i in gate["items"]}
    assert "a second baseline run equals the baseline" in evidence["baseline-reproducible"]
    assert "max_abs 0" in evidence["baseline-reproducible"]
    assert _status(cli)["example-registered"] == "pass"


def _context(model_path, **kwargs):
    from ditgate.checklists.context import Context
    from ditgate.core.model import Model

    return Context(model=Model.open(model_path), **kwargs)


def test_model_folder_fails_without_weights(tmp_path, zoo_path):
    import shutil

    source = zoo_path("flux")
    assert CHECKS["model-folder"].run(_context(source), {}).status == "pass"
    copy = tmp_path / "flux"
    shutil.copytree(source, copy)
    for weights in (copy / "vae").glob("*.safetensors"):
        weights.unlink()
    outcome = CHECKS["model-folder"].run(_context(copy), {})
    assert outcome.status == "fail" and "vae/ has a config.json but no weights" in outcome.evidence


def test_model_contract_fails_on_unmatched_repeated_blocks(zoo_path):
    ctx = _context(zoo_path("flux"))
    assert CHECKS["model-contract"].run(ctx, {}).status == "pass"
    ctx.pipe().transformer._repeated_blocks = ["FluxTransformerBlock", "RenamedSingleBlock"]
    outcome = CHECKS["model-contract"].run(ctx, {})
    assert outcome.status == "fail" and "_repeated_blocks names RenamedSingleBlock" in outcome.evidence


@pytest.mark.full  # three cache checklists on zoo:flux
def test_a_second_checklist_reuses_the_stored_rows_and_never_a_changed_plugin(tmp_path, run_cli, monkeypatch):
    """`ditgate checklist` uses the result store as `run` does: a second checklist takes the baseline and its
    sensitivity row from it (the same keys; --fresh computes them), while the rows of the plugin always run, so an
    edited plugin is judged again (here made wrong: the cache items fail although the store holds passing rows)."""
    import shutil

    monkeypatch.setenv("DITGATE_REUSE", "on")
    monkeypatch.setenv("DITGATE_STORE", str(tmp_path / "store"))
    plugin = tmp_path / "plugin.py"
    shutil.copy(PLUGINS / "flux_good.py", plugin)
    small = ["--height", "64", "--width", "64", "--steps", "6"]

    def checklist(name, *extra):
        code, _, err = run_cli("checklist", "cache", "--model", "zoo:flux", "--out", tmp_path / name,
                               "--integration", plugin, *small, *extra)
        report = json.loads((tmp_path / name / "report.json").read_text())
        return code, err, report, _status(_filled(tmp_path / name, "cache"))

    code, err, first, status = checklist("a")
    assert code == 0 and not first["reused"], (status, err[-3000:])
    code, err, second, again = checklist("b")
    assert code == 0 and again == status, err[-3000:]
    assert set(second["reused"]) == {"baseline", "sensitivity"} and "reused from" in err
    computed = {r["name"] for r in second["rows"] if not r.get("reused_from")}
    assert "cache" in computed and "baseline" not in computed  # the plugin's row ran again
    assert not checklist("c", "--fresh")[2]["reused"]

    shutil.copy(PLUGINS / "flux_wrong_pattern.py", plugin)  # the plugin edited: its rows are judged anew
    code, _, changed, wrong = checklist("d")
    assert code == 1 and wrong["cache-row"] == wrong["pattern-matches"] == "fail"
    assert "cache" not in changed["reused"]
