"""Checklists judge what the rows run: modular pipelines' text encoder and VAE, the block lists an integration file
builds, a checklist per phase, and rows at the size each needs.

- zoo:flux3 (a Flux3ModularPipeline): the planner look-ups of the TE-P and VAE-P checklists find the text encoder
  and the VAE the rows shard (cache-dit's own look-up gives a ModularPipeline no components); a VAE class cache-dit
  has no planner for still fails, named;
- zoo:tinyst with examples/tinyst/integration.py, whose block_adapter builds one list of spatial/temporal pairs: the
  ForwardPattern and PatchFunctor checks judge the pairs as observed after block_adapter ran; the same pairs
  declared Pattern_0 fail.
"""

from pathlib import Path

import pytest

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
