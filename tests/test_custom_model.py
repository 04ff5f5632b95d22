"""The custom-model route on zoo:tinymm: a DiT outside diffusers, integrated into cache-dit through a plugin file.

One full run of every default row through `examples/tinymm/integration.py` (shared by several tests), one run of the
variant that leaves the attention mask in its original order (it must fail the CP gate with the region reason),
then single-process checks of the pieces.
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import ditgate
from ditgate import zoo
from ditgate.core import examples
from ditgate.core import request
from ditgate.run.define import rows
from ditgate.inspect.anatomy import inspect_model
from ditgate.core.model import Model
from ditgate.run.runner import RunConfig, run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tinymm"
GOOD = EXAMPLE / "integration.py"
MASK_NOT_REORDERED = EXAMPLE / "integration_mask_not_reordered.py"


def _run(names, out, integration):
    cfg = RunConfig(model=Model.open("zoo:tinymm"), rows=rows.select(rows.DEFAULT_ROWS, names), out=out,
                    integration=integration)
    return run(cfg, progress=lambda line: None)


def _by_name(report):
    return {r["name"]: r for r in report["rows"]}


def _plugin_module():
    spec = importlib.util.spec_from_file_location("tinymm_integration_under_test", GOOD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tinymm_report(tmp_path_factory):
    return _run(None, tmp_path_factory.mktemp("tinymm") / "run", GOOD)


# -- the model in the zoo ------------------------------------------------------------------------------------------
def test_zoo_folder_names_the_package():
    path = zoo.materialize("zoo:tinymm")
    assert json.loads((path / "model_index.json").read_text())["_class_name"] == ["tinymm", "TinyMMPipeline"]
    pipe = ditgate.load(path)
    transformer = pipe.transformer
    assert type(pipe).__module__ == "tinymm.pipeline_tinymm"
    assert not type(transformer).__module__.startswith("diffusers")  # what flips cache-dit's diffusers checks
    assert transformer._repeated_blocks == ["TinyMMBlock"]
    attn = transformer.transformer_blocks[0].attn
    assert (attn.heads, attn.kv_heads) == (4, 2)


def test_inspect_reports_gqa_the_mask_and_the_pattern():
    anatomy = inspect_model("zoo:tinymm").to_dict()
    attention = anatomy["attention"]
    assert attention["gqa"] and (attention["heads"], attention["kv_heads"]) == (4, 2)
    assert attention["mask"] and not attention["mask_all_true"]
    assert any("attention_mask" in source for source in attention["mask_sources"])
    (blocks,) = anatomy["block_lists"]
    assert blocks["attribute"] == "transformer_blocks" and blocks["pattern"] == "Pattern_0"
    assert blocks["check_forward_pattern"] is False  # the second input is `context`: the name check must be off
    assert anatomy["has_separate_cfg"] is False  # batched CFG: one transformer call per step
    assert anatomy["cache_dit"]["cp_planners"]["transformer"] is None  # cache-dit knows nothing of TinyMM


def test_example_packages_are_found_only_when_named():
    assert examples.ensure_packages({"_class_name": ["tinymm", "TinyMMPipeline"]}) == ["tinymm"]
    assert examples.ensure_packages({"_class_name": "FluxPipeline", "vae": ["diffusers", "AutoencoderKL"],
                                     "transformer": ["no_such_package_xyz", "Model"]}) == []


# -- the plugin, every default row ---------------------------------------------------------------------------------
@pytest.mark.full  # the fast tier runs the plugin's cache and CP rows in test_request_contract
def test_every_default_row_passes_through_the_plugin(tinymm_report):
    by_name = _by_name(tinymm_report)
    assert set(by_name) == {r.name for r in rows.DEFAULT_ROWS} | {"baseline-tiled"}
    failed = {n: r["reasons"] for n, r in by_name.items() if r["status"] not in ("passed", "reference")}
    assert not failed, failed
    assert tinymm_report["passed"]


@pytest.mark.full
def test_every_feature_acted(tinymm_report):
    by_name = _by_name(tinymm_report)
    proofs = {n: {p["feature"]: p["passed"] for p in r["proofs"]} for n, r in by_name.items()}
    assert proofs["cp-ulysses-2"] == proofs["cp-ring-2"] == {"cp": True}
    assert proofs["tp-2+tep"] == {"tp": True, "tep": True} and proofs["tp-2+vaep"] == {"tp": True, "vaep": True}
    assert proofs["cache+ulysses-2"] == {"cache": True, "cp": True}
    assert proofs["hybrid-u2xtp2"] == {"cp": True, "tp": True}
    # the plan splits at the first block, inside it: half the tokens leave it on each rank
    key = "transformer.transformer_blocks"
    full = by_name["baseline"]["facts"]["block_seq_len"][key]
    assert by_name["cp-ring-2"]["facts"]["block_seq_len"][key] * 2 == full
    assert by_name["cache"]["facts"]["cache"][0]["cached_steps"] == [2, 4, 6]
    for name, r in by_name.items():
        if r["phase"] in ("cp", "tp", "tep", "vaep", "hybrid"):
            assert r["metrics"]["max_abs"] <= 1e-4, (name, r["metrics"])


# -- the mask left in its original order ------------------------------------------------------------------------
def test_mask_not_reordered_fails_the_cp_gate_with_the_region_reason(tmp_path):
    report = _run("cp-ulysses-2", tmp_path / "run", MASK_NOT_REORDERED)
    result = _by_name(report)["cp-ulysses-2"]
    assert not report["passed"] and result["status"] == "failed"
    assert [{k: p[k] for k in ("feature", "passed")} for p in result["proofs"]] == [{"feature": "cp", "passed": True}]
    assert result["proofs"][0]["coverage"] == {"transformer": "acted"}  # the one transformer the pipeline calls
    # the CFG pair pads differently (negative "": 47 of 48 text tokens; the prompt 21): the fault shows in the
    # latents (the tensor rule) and in one region of the picture (the worst tile)
    assert any(r.startswith("latent max-abs error") for r in result["reasons"]), result["reasons"]
    region = [r for r in result["reasons"] if r.startswith("a region is corrupted")]
    assert region and "worst tile (row 0," in region[0], result["reasons"]  # the top of the picture
    metrics = result["metrics"]
    assert metrics["worst_tile_ssim"] < 0.8 < 0.9 < metrics["ssim"]  # the global SSIM alone would pass


# -- single-process checks of the plugin's pieces --------------------------------------------------------------
def test_plugin_processor_keeps_single_device_math():
    """Installing the plugin's processor must not change the output without parallelism."""
    plugin = _plugin_module()
    pipe = ditgate.load("zoo:tinymm")
    call = dict(zoo.get("tinymm").call, num_inference_steps=2, output_type="latent")
    before = pipe(**call, generator=torch.Generator().manual_seed(0)).images
    plugin.install_processors(pipe.transformer)
    assert all(isinstance(b.attn.processor, plugin.ParallelJointAttnProcessor)
               for b in pipe.transformer.transformer_blocks)
    after = pipe(**call, generator=torch.Generator().manual_seed(0)).images
    assert (after - before).abs().max() <= 1e-5


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tp_layouts_keep_every_query_head_on_its_key_value_head(tp):
    """Each rank's (local query head -> key/value head) map is the global GQA map restricted to that rank."""
    plugin = _plugin_module()
    attn = ditgate.load("zoo:tinymm").transformer.transformer_blocks[0].attn
    group = attn.heads // attn.kv_heads
    layout = plugin.attention_layout(attn.heads, attn.kv_heads, tp)
    assert layout == {1: "heads", 2: "heads", 4: "replicate_kv"}[tp]
    for candidate in ("heads", "replicate_kv", "ffn"):
        if candidate == "heads" and attn.kv_heads % tp or candidate == "replicate_kv" and attn.heads % tp:
            continue
        q_per_rank = attn.heads // tp if candidate != "ffn" else attn.heads
        kv_per_rank = attn.kv_heads // tp if candidate == "heads" else attn.kv_heads
        for rank in range(tp):
            index = plugin._kv_index(attn, candidate, tp, rank)
            q_first = rank * q_per_rank if candidate != "ffn" else 0
            kv_first = rank * kv_per_rank if candidate == "heads" else 0
            expected = [(q_first + j) // group - kv_first for j in range(q_per_rank)]
            assert index.tolist() == expected, (candidate, rank)
