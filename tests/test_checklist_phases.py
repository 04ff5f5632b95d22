"""Checklists judge what the rows run: modular pipelines' text encoder and VAE, the block lists an integration file
builds, a checklist per phase (hybrid), and rows at the size each needs (VAE-P where the VAE tiles).

- zoo:flux3 (a Flux3ModularPipeline): the planner look-ups of the TE-P and VAE-P checklists find the text encoder
  and the VAE the rows shard (cache-dit's own look-up gives a ModularPipeline no components); a VAE class cache-dit
  has no planner for still fails, named;
- zoo:tinyst with examples/tinyst/integration.py, whose block_adapter builds one list of spatial/temporal pairs: the
  ForwardPattern and PatchFunctor checks judge the pairs as observed after block_adapter ran; the same pairs
  declared Pattern_0 fail;
- (full tier) `ditgate checklist vaep` on zoo:flux at 32x32 (one VAE tile) runs its row at 32x36 and says so;
  `ditgate checklist hybrid` passes on zoo:flux and fails with a TP plan that loads the wrong shard.
"""

from pathlib import Path

import pytest
import yaml

from ditgate.checklists.context import Context
from ditgate.checklists.named import CHECKS
from ditgate.core.model import Model

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).parent / "plugins"
FLUX3 = ROOT / "examples" / "flux3" / "integration.py"
TINYST = ROOT / "examples" / "tinyst" / "integration.py"


def test_modular_pipeline_text_encoder_and_vae_planners_are_found():
    ctx = Context(model=Model.open("zoo:flux3"), integration_path=FLUX3)
    tep = CHECKS["extra-module-planner"].run(ctx, {"module": "text_encoder"})
    vaep = CHECKS["extra-module-planner"].run(ctx, {"module": "vae"})
    assert tep.status == "pass" and "Qwen3VLTextEncoderTensorParallelismPlanner" in tep.evidence, tep
    assert vaep.status == "pass" and "AutoencoderKLFlux2DataParallelismPlanner" in vaep.evidence, vaep
    pipe = ctx.pipe()  # a VAE class cache-dit does not know (its VAE registry matches exact class names)
    renamed = type("RenamedVAE", (type(pipe.vae),), {})
    pipe.vae.__class__ = renamed
    outcome = CHECKS["extra-module-planner"].run(ctx, {"module": "vae"})
    assert outcome.status == "fail" and "RenamedVAE" in outcome.evidence, outcome


def test_pairs_built_by_the_plugin_are_judged_as_observed_after_it():
    ctx = Context(model=Model.open("zoo:tinyst"), integration_path=TINYST)
    pattern = CHECKS["forward-pattern-matches"].run(ctx, {})
    functor = CHECKS["patch-functor-when-needed"].run(ctx, {})
    assert pattern.status == "pass" and "st_pairs Pattern_3" in pattern.evidence, pattern
    assert functor.status == "pass" and "after block_adapter ran" in functor.evidence, functor
    wrong = Context(model=Model.open("zoo:tinyst"), integration_path=PLUGINS / "tinyst_pairs_wrong_pattern.py")
    outcome = CHECKS["forward-pattern-matches"].run(wrong, {})
    assert outcome.status == "fail" and "st_pairs: declared Pattern_0, observed Pattern_3" in outcome.evidence, outcome


@pytest.mark.full  # the fast tier checks the two look-ups above; this runs the rows too
def test_tep_and_vaep_checklists_pass_on_a_modular_pipeline(tmp_path, run_cli):
    code, out, err = run_cli("checklist", "tep,vaep", "--model", "zoo:flux3", "--integration", FLUX3,
                             "--out", tmp_path / "run")
    assert code == 0, out + err[-3000:]
    assert "text_encoder: 14 weights sharded" in out and "planner AutoencoderKLFlux2DataParallelismPlanner" in out


@pytest.mark.full
def test_cache_checklist_passes_on_a_plugin_that_builds_pairs(tmp_path, run_cli):
    code, out, err = run_cli("checklist", "cache", "--model", "zoo:tinyst", "--integration", TINYST,
                             "--out", tmp_path / "run")
    assert code == 0, out + err[-3000:]
    assert "PASS    pattern-matches" in out and "PASS    patch-functor-when-needed" in out


def test_a_row_item_runs_at_the_size_its_feature_needs():
    from types import SimpleNamespace

    from ditgate.checklists.runner import _row_size

    anatomy = {"sizes": {"tile": 32, "vaep": [32, 36], "cp": [32, 32]}}  # zoo:flux at 32x32 (ditgate inspect)
    vaep = SimpleNamespace(check={"kind": "row", "row": "tp-2+vaep", "size": "vaep"})
    cp = SimpleNamespace(check={"kind": "row", "row": "cp-ulysses-2", "size": "cp"})
    plain = SimpleNamespace(check={"kind": "row", "row": "tp-2"})
    call = {"height": 32, "width": 32}
    assert _row_size(vaep, anatomy, call) == (32, 36)
    assert _row_size(cp, anatomy, call) is None and _row_size(plain, anatomy, call) is None
    assert _row_size(vaep, anatomy, {"height": 32, "width": 36}) is None
    assert _row_size(vaep, None, call) is None  # no anatomy: the call's size (the row's proof says VAE-P idled)


@pytest.mark.full
def test_vaep_checklist_runs_its_row_where_the_vae_tiles_and_says_so(tmp_path, run_cli):
    out = tmp_path / "run"
    code, stdout, err = run_cli("checklist", "vaep", "--model", "zoo:flux", "--height", "32", "--width", "32",
                                "--out", out)
    assert code == 0, stdout + err[-3000:]
    assert "at 32x36, not the call's 32x32, which decodes in one VAE tile of 32 pixels" in stdout
    assert "rank 0 decoded 2 of 4 tiles" in stdout and (out / "at-32x36" / "report.json").is_file()


@pytest.mark.full
def test_hybrid_checklist_passes_and_fails_a_wrong_tp_shard(tmp_path, run_cli):
    code, stdout, err = run_cli("checklist", "hybrid", "--model", "zoo:flux", "--out", tmp_path / "good")
    assert code == 0 and "PASS    hybrid-row" in stdout, stdout + err[-3000:]
    code, stdout, err = run_cli("checklist", "hybrid", "--model", "zoo:flux", "--out", tmp_path / "bad",
                                "--integration", PLUGINS / "flux_tp_wrong_shard.py")
    assert code == 1 and "FAIL    hybrid-row" in stdout and "FAIL    tp-row" in stdout, stdout + err[-3000:]


def test_checklist_takes_the_run_options_of_its_rows(tmp_path, run_cli):
    for option, words in ((["--cache-dit", tmp_path], "no cache_dit package"),
                          (["--cp-split-dims", "bogus"], "write LIST=DIM"), (["--seeds", "0"], "at least 1"),
                          (["--prompts", tmp_path / "none.txt"], "none.txt")):
        code, _, err = run_cli("checklist", "cache", "--model", "zoo:flux", "--out", tmp_path / "o", *option)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (option, err)
    code, _, err = run_cli("checklist", "compile", "--model", "zoo:flux")  # a phase judged by `ditgate matrix`
    assert code == 2 and "rows of `ditgate matrix`" in err and "hybrid" in err


@pytest.mark.full
def test_cache_checklist_judges_the_cache_row_on_every_seed(tmp_path, run_cli):
    import json

    out = tmp_path / "run"
    code, stdout, err = run_cli("checklist", "cache", "--model", "zoo:flux", "--seeds", "2", "--launch", "per-row",
                                "--out", out)
    assert code == 0, stdout + err[-3000:]
    filled = yaml.safe_load((out / "checklist-cache.yaml").read_text())
    assert filled["run"]["command"].endswith("--launch per-row --seeds 2")  # the command that makes it again
    names = {r["name"] for r in json.loads((out / "report.json").read_text())["rows"]}
    assert {"cache", "baseline"} < names and any(n.startswith("cache") and n != "cache" and "s1" in n for n in names)
