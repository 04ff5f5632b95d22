"""The modular route: diffusers ModularPipelines loaded, called and gated like any pipeline.

- zoo:flux loaded as FluxModularPipeline runs every default row and passes; its baseline latents equal the
  standard FluxPipeline's (the session's default run on zoo:flux) for the same seeded call;
- zoo:flux3, a FLUX.3 Flux3ModularPipeline (no standard class exists) with examples/flux3/integration.py: baseline,
  cache, cp-ulysses-2 and tp-2 pass; the plugin with the wrong calls-per-step flag fails on the cache-cfg proof;
- bad input (components that cannot load, an output the blocks do not produce) exits 2 with one line;
- the one request object is fitted to the blocks (steps, image, frames, the guider's scale), cache-dit's adapter is
  found by the standard twin's name, the block tree follows the call;
- a transformer-level cache without a refresh between calls of different lengths differs from the pipeline level
  (with the refresh they agree bit for bit).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
FLUX3_PLUGIN = ROOT / "examples" / "flux3" / "integration.py"
FLUX3_WRONG_CFG = ROOT / "examples" / "flux3" / "integration_wrong_cfg.py"


def _run(model, rows, out, **kwargs):
    from ditgate.core.model import Model
    from ditgate.run.define import rows as rows_mod
    from ditgate.run.runner import RunConfig, run

    opened = Model.open(model, pipeline=kwargs.pop("pipeline", None), dtype=kwargs.pop("dtype", "auto"))
    cfg = RunConfig(model=opened, rows=rows_mod.select(rows_mod.DEFAULT_ROWS, rows), out=out, **kwargs)
    return run(cfg, progress=lambda line: None)


@pytest.fixture(scope="session")
def flux_modular_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("flux-modular") / "run"
    return _run("zoo:flux", None, out, pipeline="diffusers:FluxModularPipeline"), out


@pytest.fixture(scope="session")
def flux3_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("flux3") / "run"
    return _run("zoo:flux3", "baseline,cache,cp-ulysses-2,tp-2", out, integration=FLUX3_PLUGIN), out


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("ditgate")]


def _rows(report):
    return {r["name"]: r for r in report["rows"]}


@pytest.mark.full  # fast tier: zoo:flux3's rows here and modular_pipeline.md's commands (test_skill_modular)
def test_flux_as_modular_pipeline_passes_every_default_row(flux_modular_run):
    report, _ = flux_modular_run
    rows = _rows(report)
    failed = {n: (r["status"], r.get("reasons")) for n, r in rows.items() if r["status"] not in ("passed", "reference")}
    assert not failed, failed
    assert report["passed"]
    gated = [r for r in rows.values() if r["phase"]]
    assert {r["phase"] for r in gated} >= {"cache", "cp", "tp", "tep", "vaep", "hybrid"}


@pytest.mark.full
def test_flux_modular_baseline_latents_equal_flux_pipeline(flux_modular_run, flux_default_run):
    _, modular_dir = flux_modular_run
    _, standard_dir = flux_default_run
    modular = np.load(modular_dir / "rows" / "baseline" / "latents.npy")
    standard = np.load(standard_dir / "rows" / "baseline" / "latents.npy")
    assert modular.shape == standard.shape == (1, 1024, 16)  # the packed tokens of both denoise loops
    np.testing.assert_array_equal(modular, standard)
    result = json.loads((modular_dir / "rows" / "baseline" / "result.json").read_text())
    assert result["facts"]["modular"]["pipeline"] == "FluxModularPipeline"
    assert result["facts"]["calls_per_step"] == 1.0  # no guider: guidance is distilled into FLUX.1's transformer


@pytest.mark.full
def test_flux_modular_cache_row_is_pipeline_level(flux_modular_run):
    _, out = flux_modular_run
    facts = json.loads((out / "rows" / "cache" / "result.json").read_text())["facts"]
    assert facts["modular"]["adapter_level"] == "pipeline"
    assert facts["modular"]["separate_cfg"] is False
    assert facts["cache"][0]["cached_steps"]


def test_flux3_modular_only_pipeline_passes_with_its_plugin(flux3_run):
    report, out = flux3_run
    rows = _rows(report)
    assert {n: r["status"] for n, r in rows.items()} == {"baseline": "reference", "cache": "passed",
                                                         "cp-ulysses-2": "passed", "tp-2": "passed"}
    facts = json.loads((out / "rows" / "cache" / "result.json").read_text())["facts"]
    assert facts["calls_per_step"] == 2.0 and facts["modular"]["guider"]["class"] == "ClassifierFreeGuidance"
    proofs = {p["feature"]: p for p in rows["cache"]["proofs"]}
    assert proofs["cache-cfg"]["passed"], proofs


def test_wrong_calls_per_step_flag_fails_on_cache_cfg(flux3_run):
    from ditgate import zoo
    from ditgate.core import plugin, request
    from ditgate.core.model import Model
    from ditgate.run.judge import proofs
    from ditgate.run.exec.execute import run_row
    from ditgate.run.define.rows import DEFAULT_ROWS

    _, out = flux3_run
    path = zoo.materialize("zoo:flux3")
    row = next(r for r in DEFAULT_ROWS if r.name == "cache")
    outcome = run_row(row, Model.open("zoo:flux3"), integration=plugin.load(FLUX3_WRONG_CFG))
    base = json.loads((out / "rows" / "baseline" / "result.json").read_text())["facts"]
    base_row = next(r for r in DEFAULT_ROWS if r.name == "baseline")
    checked = {p.feature: p for p in proofs.check(row, outcome.facts, base_row, base)}
    assert checked["cache"].passed  # steps were cached: the fault hides from that proof
    assert not checked["cache-cfg"].passed
    assert "has_separate_cfg=False" in checked["cache-cfg"].detail and "2 per step" in checked["cache-cfg"].detail


def test_components_that_cannot_load_exit_2(tmp_path, run_cli):
    from ditgate import zoo

    broken = tmp_path / "flux3"
    shutil.copytree(zoo.materialize("zoo:flux3"), broken)
    for weights in (broken / "transformer").glob("*.safetensors"):
        weights.unlink()
    code, out, err = run_cli("run", broken, "--rows", "baseline", "--out", tmp_path / "run")
    assert code == 2
    assert _error_lines(err) == [next(l for l in err.splitlines() if "components cannot load: transformer" in l)]
    assert not (tmp_path / "run").exists()  # nothing half-written


def test_output_the_blocks_do_not_produce_exits_2(tmp_path, run_cli):
    from ditgate import zoo

    folder = tmp_path / "flux3"
    shutil.copytree(zoo.materialize("zoo:flux3"), folder)
    meta = json.loads((folder / zoo.META_FILE).read_text())
    meta["call"]["output"] = "spectrogram"
    (folder / zoo.META_FILE).write_text(json.dumps(meta))
    code, out, err = run_cli("run", folder, "--rows", "baseline", "--out", tmp_path / "run")
    assert code == 2
    assert len(_error_lines(err)) == 1 and "does not produce an output named 'spectrogram'" in err


def test_standard_folder_names_its_modular_counterpart(zoo_path):
    from ditgate.core import modular

    path = zoo_path("flux")
    assert not modular.wants_modular(path, None)
    for pipeline in ("modular", "diffusers:ModularPipeline", "diffusers:FluxModularPipeline"):
        assert modular.wants_modular(path, pipeline)
        assert type(modular.from_pretrained(path, pipeline)).__name__ == "FluxModularPipeline"
    assert modular.wants_modular(zoo_path("flux3"), None)  # modular_model_index.json: modular without being told


def test_custom_blocks_in_the_folder_need_trust_remote_code(tmp_path):
    from ditgate import zoo
    from ditgate.core import loader
    from ditgate.core.errors import RemoteCodeError

    folder = tmp_path / "flux3"
    shutil.copytree(zoo.materialize("zoo:flux3"), folder)
    (folder / "blocks.py").write_text("raise SystemExit('custom block code ran')\n")
    (folder / "modular_config.json").write_text(json.dumps(
        {"_class_name": "MyBlocks", "auto_map": {"ModularPipelineBlocks": "blocks.MyBlocks"}}))
    with pytest.raises(RemoteCodeError, match="--trust-remote-code"):
        loader.load(folder)


def test_request_is_fitted_to_the_blocks(zoo_path):
    """The one request object on a modular pipeline: steps from the blocks' default, an input image where the
    standard twin needs one, a standard pipeline's CFG scale on the guider, arguments and frames no block takes
    refused with the request's own messages."""
    from ditgate.core import modular, request
    from ditgate.core.model import Model
    from ditgate.core.errors import DitgateError

    flux3 = Model.open("zoo:flux3").request
    assert flux3.steps == 8 and flux3.steps_from == "request" and flux3.image is None
    pipe = modular.from_pretrained(zoo_path("flux3"))
    no_steps = request.fit_blocks(request.build({"call": {"prompt": "x"}}), pipe)
    steps = next(p for p in pipe.blocks.inputs if p.name == "num_inference_steps")
    assert isinstance(steps.default, int)  # required, with a default: diffusers fills it in
    assert no_steps.steps == steps.default and no_steps.steps_from == "signature"
    with pytest.raises(DitgateError, match=r"Flux3ModularPipeline \(its blocks\) does not accept bogus"):
        Model.open("zoo:flux3", call={"bogus": 1}).request
    with pytest.raises(DitgateError, match="takes no frame count"):
        Model.open("zoo:flux3", frames=3).request

    qwen = Model.open("zoo:qwen-image", pipeline="modular").request
    assert qwen.call["true_cfg_scale"] == 2.0  # QwenImagePipeline's CFG scale: the modular guider's scale
    pipe = modular.from_pretrained(zoo_path("qwen-image"), "modular")
    assert modular.guider_args(pipe, qwen.call) == {"true_cfg_scale": 2.0}
    modular.configure_guider(pipe, {**qwen.call, "true_cfg_scale": 1.0})
    assert modular.expected_calls_per_step(pipe) == 1  # scale 1: CFG off, one transformer call per step
    modular.configure_guider(pipe, qwen.call)
    assert pipe.guider.guidance_scale == 2.0 and modular.expected_calls_per_step(pipe) == 2


def test_standard_twin_that_transforms_an_image_gets_one(zoo_path):
    from ditgate.core import request
    from ditgate.core.model import Model

    i2v = Model.open("zoo:pipe/wan-i2v", pipeline="modular").request  # WanImageToVideoPipeline's folder
    assert (i2v.image, i2v.image_key) == ("generated", "image")
    t2v = Model.open("zoo:wan", pipeline="modular").request
    assert t2v.image is None


def test_registered_adapter_found_by_the_standard_twin_name(zoo_path):
    """cache-dit registers adapters by pipeline name prefix: SD3Transformer2DModel's adapter is StableDiffusion3's."""
    from ditgate.core import modular

    pipe = modular.from_pretrained(zoo_path("pipe/sd3"), "modular")
    assert type(pipe).__name__ == "StableDiffusion3ModularPipeline"
    pipe.load_components()
    adapter, why = modular.registered_adapter(pipe, skip_post_init=True)
    assert adapter is not None, why
    assert adapter.transformer is pipe.transformer and adapter.has_separate_cfg  # CFG guider: 2 calls per step
    flux3 = modular.load(zoo_path("flux3"))
    adapter, why = modular.registered_adapter(flux3, skip_post_init=True)
    assert adapter is None and "refuses Flux3Transformer2DModel" in why


def test_transformer_level_cache_needs_a_refresh_between_calls():
    """What run.modular's refresh rests on (benchmarks/modular_adapter_level.py, two calls of 6 then 4 steps on one
    pipeline): the pipeline level and the transformer level refreshed before each call agree bit for bit and skip
    the same steps; without the refresh the second call runs on the first call's step count and differs."""
    import sys

    import torch

    from ditgate.core import request

    from ditgate.core.model import Model
    from ditgate.core.loader import load

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import modular_adapter_level as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    req = Model.open("zoo:flux", pipeline=bench.PIPELINE).request
    pristine = load("zoo:flux", pipeline=bench.PIPELINE)
    runs = {level: bench.run_level(pristine, level, "static", [6, 4], req)
            for level in ("pipeline", "transformer+refresh", "transformer")}
    for pipeline_call, refreshed in zip(runs["pipeline"], runs["transformer+refresh"]):
        assert torch.equal(pipeline_call["latents"], refreshed["latents"])
        assert pipeline_call["skipped"] == refreshed["skipped"] and pipeline_call["skipped"]
    first, second = runs["transformer"]
    assert torch.equal(first["latents"], runs["pipeline"][0]["latents"])  # the first call is the same
    assert second["skipped"] != runs["pipeline"][1]["skipped"]
    assert not torch.equal(second["latents"], runs["pipeline"][1]["latents"])


def test_block_tree_follows_the_call(zoo_path):
    """inspect's block tree: a conditional block runs the branch its trigger selects, also when an earlier step that
    runs produces the trigger (LTX: `image` -> the VAE encoder step's `image_latents` -> the image-to-video branch)."""
    from ditgate.core import modular

    pipe = modular.from_pretrained(zoo_path("pipe/ltx-i2v"), "modular")
    runs = lambda call: {r["path"] for r in modular.block_tree(pipe, call) if r["runs"]}  # noqa: E731
    with_image, text_only = runs({"prompt": "x", "image": object()}), runs({"prompt": "x"})
    assert "denoise.image2video.denoise" in with_image and "denoise.text2video" not in with_image
    assert "denoise.text2video.denoise" in text_only and "denoise.image2video" not in text_only
    assert modular.denoise_loops(pipe) == ["denoise.image2video.denoise", "denoise.text2video.denoise"]
