"""A row status for a gate that cannot judge: `inconclusive` (exit status 3), neither passed nor failed.

TinyMoE's correct adapter on weights initialised at four times the default scale (its blocks' weight matrices x4):
caching off, the adapter matches the baseline exactly, yet the cached residual changes by more than its own size
between steps (measured 1.15 against rules.residual_change 1.0) and the cache row misses the latent gate (disp_rel
0.197). That row is inconclusive, naming the change; the same weights with an adapter that changes the model fail on
the caching-off check, with the adapter named first and no cache tuning advised.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def volatile_moe(zoo_path, tmp_path_factory):
    from ditgate.core.model import Model

    source = Path(zoo_path("tinymoe"))
    out = tmp_path_factory.mktemp("volatile") / "tinymoe-x4"
    pipe = Model.open(str(source)).load("cpu")
    with torch.no_grad():
        for parameter in pipe.transformer.blocks.parameters():
            if parameter.dim() >= 2:
                parameter.mul_(4.0)
    pipe.save_pretrained(out)
    shutil.copy(source / "ditgate.json", out / "ditgate.json")
    return out


@pytest.fixture(scope="module")
def volatile_run(volatile_moe, tmp_path_factory):
    """`ditgate run` of the cache row with TinyMoE's correct plugin: (exit status, report, run folder, stderr)."""
    import contextlib
    import io

    from ditgate.cli import main

    folder = tmp_path_factory.mktemp("volatile-run") / "run"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["run", str(volatile_moe), "--rows", "cache", "--out", str(folder), "--json",
                     "--integration", str(ROOT / "examples" / "tinymoe" / "integration.py")])
    return code, json.loads(out.getvalue()), folder, err.getvalue()


def test_a_proven_adapter_on_volatile_weights_is_inconclusive(volatile_run):
    from ditgate.gates.verdicts import load_gates

    code, report, folder, err = volatile_run
    cache = {r["name"]: r for r in report["rows"]}["cache"]
    assert code == 3 and report["outcome"] == "inconclusive" and not report["passed"], (code, err[-2000:])
    assert cache["status"] == "inconclusive", cache["reasons"]
    assert cache["verdict"]["cache_off"]["passed"] and cache["verdict"]["cache_off"]["max_abs"] == 0.0
    assert not cache["verdict"]["passed"] and cache["verdict"]["inconclusive"] == cache["reasons"][0]  # gate kept
    change = cache["reasons"][0]
    limit = load_gates()["rules"]["residual_change"]["value"]
    assert change.startswith("inconclusive") and "trained weights" in change and "%" in change, change
    assert not any("try a stricter threshold" in r for r in cache["reasons"])
    facts = json.loads((folder / "rows" / "cache-cache-off" / "result.json").read_text())["facts"]
    measured = facts["residual_change"]["per_list"]["transformer.blocks"]["max"]
    assert measured > limit and f"{measured:.0%}" in change
    # acted is not a verdict: the cache acted (steps were cached) while the row is not passed
    assert cache["acted"]["cache"]["acted"] is True and "cached steps" in cache["acted"]["cache"]["detail"]
    markdown = (folder / "report.md").read_text()
    assert "- cache / cache: acted — " in markdown and "(verdict: inconclusive)" in markdown
    assert "not a verdict" in markdown
    assert "verdict: **INCONCLUSIVE**" in markdown and "could not be judged" in markdown


def test_an_adapter_that_changes_the_model_fails_first_on_the_caching_off_check(volatile_moe, run_cli, tmp_path):
    plugin = ROOT / "tests" / "plugins" / "tinymoe_functor_changes_model.py"
    code, out, err = run_cli("run", volatile_moe, "--rows", "cache", "--out", tmp_path / "run", "--json",
                             "--integration", plugin)
    cache = {r["name"]: r for r in json.loads(out)["rows"]}["cache"]
    assert code == 1 and cache["status"] == "failed", (code, cache["reasons"], err[-2000:])
    assert not cache["verdict"]["cache_off"]["passed"]
    assert "caching off" in cache["reasons"][0] and "patch functor" in cache["reasons"][0], cache["reasons"]
    assert not any("try a stricter threshold" in r for r in cache["reasons"])


def test_checklists_notebooks_and_the_matrix_know_the_status(volatile_run, tmp_path):
    """The same report read by each consumer: a checklist item, a notebook phase, the matrix and JUnit say
    inconclusive (exit 3 where they exit), never passed, never failed."""
    from ditgate.checklists.runner import _row_outcome
    from ditgate.commands.model.run import exit_status
    from ditgate.notebooks import cells
    from ditgate.notebooks.catalog import GateInconclusive
    from ditgate.perf.matrix import markdown, matrix
    from ditgate.run.report import junit

    code, report, folder, _ = volatile_run
    cache = {r["name"]: r for r in report["rows"]}["cache"]
    outcome = _row_outcome(cache, "cache")
    assert outcome.status == "inconclusive" and "trained weights" in outcome.evidence
    with pytest.raises(GateInconclusive, match="could not be judged"):
        cells.finish("cache", report, tmp_path)
    assert json.loads((tmp_path / "cache.json").read_text())["inconclusive"] is True
    data = matrix(report, "A", 0, 1)
    assert data["outcome"] == "inconclusive" and exit_status(data) == 3 and not data["passed"]
    assert "INCONCLUSIVE" in markdown(data) and "could not be judged" in markdown(data)
    assert [c.status for c in junit.row_cases(report["rows"], "t") if c.name == "cache"] == ["skipped"]


@pytest.mark.full
def test_cache_plus_cp_against_the_baseline_is_inconclusive_on_the_same_measure(volatile_moe, run_cli, tmp_path):
    """cache+ulysses-2 matches its cached single-process row (the CP gate) and fails only the cache gate against the
    baseline: inconclusive on the caching-off twin's residual change, like the cache row."""
    code, out, err = run_cli("run", volatile_moe, "--rows", "cache,cache+ulysses-2", "--out", tmp_path / "run",
                             "--json", "--integration", ROOT / "examples" / "tinymoe" / "integration.py")
    rows = {r["name"]: r for r in json.loads(out)["rows"]}
    hybrid = rows["cache+ulysses-2"]
    assert code == 3 and hybrid["status"] == "inconclusive", (code, hybrid["reasons"], err[-2000:])
    assert hybrid["verdict"]["checks"] and all(c["passed"] for c in hybrid["verdict"]["checks"])
    assert "trained weights" in hybrid["reasons"][0]
