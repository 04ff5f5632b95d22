"""The modular route on a modular-only video pipeline: zoo:cosmos3-distilled (Cosmos3DistilledModularPipeline).

- the folder keeps `enable_safety_checker: false` and its `distilled_sigmas` through save_pretrained +
  ModularPipeline.from_pretrained, so it runs with no safety checker and no loader option; set to true, diffusers'
  blocks refuse to run (the guardrail model cannot be built offline);
- with examples/cosmos3/integration.py the baseline is a 9-frame video and the cache row passes (pipeline-level
  adapter, one transformer call per step); the plugin declaring two calls per step (what cache-dit's registered
  Cosmos adapter says) fails on the cache-cfg proof; under a residual threshold the layers cached text stream first
  (no functor) cache every step on a residual diff of 0 and fail on latents;
- without a plugin, cache-dit's registered Cosmos3OmniPatchFunctor cannot be called by the blocks (no return_dict);
- tp-2 passes; cp-ulysses-2 stops at cache-dit's templated CP attention, which refuses causal attention.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "cosmos3" / "integration.py"
WRONG_CFG = ROOT / "examples" / "cosmos3" / "integration_wrong_cfg.py"
TEXT_FIRST = ROOT / "examples" / "cosmos3" / "integration_text_first.py"
THRESHOLD = {"mask": None, "residual_diff_threshold": 0.2, "max_warmup_steps": 1}  # cache-dit decides on residuals
MODEL = "zoo:cosmos3-distilled"


def _run(rows, out, integration=PLUGIN, cache_config=None):
    from ditgate.core.model import Model
    from ditgate.run.define import rows as rows_mod
    from ditgate.run.runner import RunConfig, run

    chosen = rows_mod.with_cache_config(rows_mod.select(rows_mod.DEFAULT_ROWS, rows), cache_config or {})
    cfg = RunConfig(model=Model.open(MODEL), rows=chosen, out=out, integration=integration)
    report = run(cfg, progress=lambda line: None)
    return {r["name"]: r for r in report["rows"]}, out


@pytest.fixture(scope="module")
def cosmos_run(tmp_path_factory):
    return _run("baseline,cache", tmp_path_factory.mktemp("cosmos3") / "run")


def test_safety_checker_config_survives_the_folder(zoo_path, tmp_path):
    import torch

    from ditgate.core import modular
    from ditgate.zoo import modular_video

    index = json.loads((zoo_path("cosmos3-distilled") / "modular_model_index.json").read_text())
    assert index["enable_safety_checker"] is False and index["distilled_sigmas"] == modular_video.COSMOS3_SIGMAS
    pipe = modular.load(zoo_path("cosmos3-distilled"))
    assert pipe.requires_safety_checker is False and getattr(pipe, "safety_checker", None) is None

    folder = tmp_path / "guarded"
    shutil.copytree(zoo_path("cosmos3-distilled"), folder)
    index["enable_safety_checker"] = True
    (folder / "modular_model_index.json").write_text(json.dumps(index))
    guarded = modular.load(folder)
    with pytest.raises(ValueError, match="requires a safety checker"):
        guarded(prompt="x", num_frames=9, height=64, width=64, generator=torch.Generator().manual_seed(0))


def test_cosmos3_baseline_is_a_video_and_cache_passes(cosmos_run):
    rows, out = cosmos_run
    assert {n: r["status"] for n, r in rows.items()} == {"baseline": "reference", "cache": "passed"}
    base = json.loads((out / "rows" / "baseline" / "result.json").read_text())
    assert base["modality"] == "video"
    assert np.load(out / "rows" / "baseline" / "output.npy").shape[-4:] == (9, 64, 64, 3)
    assert base["facts"]["block_shapes"]["transformer.layers"] == [[212, 64], [48, 64]]  # text, vision; no batch
    facts = json.loads((out / "rows" / "cache" / "result.json").read_text())["facts"]
    assert facts["calls_per_step"] == 1.0 and facts["modular"]["guider"] is None
    assert facts["modular"]["adapter_level"] == "pipeline" and facts["modular"]["separate_cfg"] is False
    proofs = {p["feature"]: p for p in rows["cache"]["proofs"]}
    assert proofs["cache"]["passed"] and proofs["cache-cfg"]["passed"], proofs


def test_two_calls_per_step_declared_fails_on_cache_cfg(cosmos_run):
    from ditgate import zoo
    from ditgate.core import plugin, request
    from ditgate.core.model import Model
    from ditgate.run.judge import proofs
    from ditgate.run.exec.execute import run_row
    from ditgate.run.define.rows import DEFAULT_ROWS

    _, out = cosmos_run
    row = next(r for r in DEFAULT_ROWS if r.name == "cache")
    outcome = run_row(row, Model.open(MODEL), integration=plugin.load(WRONG_CFG))
    base = json.loads((out / "rows" / "baseline" / "result.json").read_text())["facts"]
    base_row = next(r for r in DEFAULT_ROWS if r.name == "baseline")
    checked = {p.feature: p for p in proofs.check(row, outcome.facts, base_row, base)}
    assert not checked["cache-cfg"].passed
    assert "has_separate_cfg=True" in checked["cache-cfg"].detail and "made 1 per step" in checked["cache-cfg"].detail


def test_text_stream_first_caches_every_step_and_fails(tmp_path):
    """Under a residual threshold the stream cache-dit decides on matters: the text stream (the layers' first input)
    never changes, so its residual diff is 0 and every step after the warm-up is cached; the vision stream first
    (integration.py's functor) caches only where the vision tokens settle."""
    def cache_row(integration, name):
        rows, out = _run("baseline,cache", tmp_path / name, integration=integration, cache_config=THRESHOLD)
        facts = json.loads((out / "rows" / "cache" / "result.json").read_text())["facts"]["cache"][0]
        return rows["cache"]["status"], facts

    status, facts = cache_row(TEXT_FIRST, "text-first")
    assert status == "failed" and set(facts["residual_diffs"].values()) == {0.0}
    assert facts["cached_steps"] == [1, 2, 3]
    status, facts = cache_row(PLUGIN, "vision-first")
    assert status == "passed" and min(facts["residual_diffs"].values()) > 0.05
    assert facts["cached_steps"] == [1, 3]


def test_registered_cosmos_functor_cannot_be_called_by_the_blocks(tmp_path):
    """cache-dit 1.5.3's Cosmos3OmniPatchFunctor replaces the transformer forward with one that has no return_dict
    (cache_dit/caching/patch_functors/functor_cosmos3.py:77-103); the denoiser passes return_dict=False. When
    cache-dit fixes it this test fails, and the integration file's own functor can go."""
    rows, _ = _run("baseline,cache", tmp_path / "run", integration=None)
    assert rows["cache"]["status"] == "error"
    assert "unexpected keyword argument 'return_dict'" in rows["cache"]["error"]["message"]


def test_tp_passes_and_cp_stops_at_causal_attention(tmp_path):
    rows, _ = _run("baseline,cp-ulysses-2,tp-2", tmp_path / "run")
    assert rows["tp-2"]["status"] == "passed"
    assert rows["cp-ulysses-2"]["status"] == "error"
    assert "Causal attention is not yet supported for templated attention" in rows["cp-ulysses-2"]["error"]["message"]
