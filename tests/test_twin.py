"""`ditgate twin`: from a folder of configs and tokenizers alone, a loadable float32 copy with the source's widths
and fewer blocks, whose output depends on its input; every kind of pipeline; bad input refused in one line.

The fast tier twins a configs-only copy of zoo:flux (the build loads the twin and runs its call: that is its own
check) and refuses bad input without building anything; the full tier twins a video, an audio, a modular, a custom,
and a two-transformer pipeline, and a source whose own initialisation zeroes its output layers.
"""

import json
import shutil

import pytest

WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")


def configs_only(source, dest):
    """A copy of a model folder without one weight file: what a user has before downloading the weights."""
    shutil.copytree(source, dest, ignore=lambda folder, names: [n for n in names if n.endswith(WEIGHTS)])
    assert not [p for p in dest.rglob("*") if p.name.endswith(WEIGHTS)]
    return dest


def config(folder, component):
    return json.loads((folder / component / "config.json").read_text())


def twin_json(run_cli, source, out, *extra):
    code, stdout, err = run_cli("twin", source, out, "--json", *extra)
    assert code == 0, err
    return json.loads(stdout)


def test_configs_and_tokenizers_alone_make_a_twin_with_the_same_widths(run_cli, zoo_path, tmp_path):
    source = configs_only(zoo_path("flux"), tmp_path / "flux-configs")
    made = twin_json(run_cli, source, tmp_path / "twin")
    twin = tmp_path / "twin"
    before, after = config(source, "transformer"), config(twin, "transformer")
    for width in ("num_attention_heads", "attention_head_dim", "joint_attention_dim", "in_channels", "patch_size",
                  "pooled_projection_dim", "axes_dims_rope"):
        assert after[width] == before[width], width
    # one block of each list, two of the smaller-block list: a cache computes each list's first block
    assert (after["num_layers"], after["num_single_layers"]) == (1, 2) < (before["num_layers"],
                                                                        before["num_single_layers"])
    assert config(twin, "vae")["latent_channels"] == config(source, "vae")["latent_channels"]
    assert any(p.name.endswith(".safetensors") for p in (twin / "transformer").iterdir())
    # the build ran the twin at its call: every feature can act, and the output depends on the input
    assert made["checks"]["calls"] == {"transformer": made["call"]["num_inference_steps"]}
    assert made["checks"]["output_change"] > 1e-3
    assert made["params"] < 1_000_000 and made["modality"] == "image"
    assert json.loads((twin / "ditgate.json").read_text())["call"]["height"] == made["call"]["height"]


@pytest.mark.parametrize("case, words", [
    ("missing", "does not exist"),
    ("bad-config", "config.json"),
    ("out-holds-a-model", "--overwrite"),
    ("bf16", "float32"),
    ("gpu", "CPU"),
])
def test_bad_input_is_refused_in_one_line(run_cli, zoo_path, tmp_path, case, words):
    source, out, extra = zoo_path("flux"), tmp_path / "twin", []
    if case == "missing":
        source = tmp_path / "nowhere"
    elif case == "bad-config":
        source = configs_only(zoo_path("flux"), tmp_path / "broken")
        (source / "transformer" / "config.json").write_text("{not json")
    elif case == "out-holds-a-model":
        shutil.copytree(zoo_path("flux"), out)
    elif case == "bf16":
        extra = ["--dtype", "bf16"]
    else:
        extra = ["--device", "cuda"]
    code, stdout, err = run_cli("twin", source, out, *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert words.lower() in err.lower(), err
    if case != "out-holds-a-model":
        assert not out.exists()


@pytest.mark.full
@pytest.mark.parametrize("name, modality, lists", [
    ("wan", "video", ["blocks"]),
    ("stable-audio", "audio", ["transformer_blocks"]),
    ("flux3", "image", ["single_transformer_blocks"]),  # a modular-only pipeline (modular_model_index.json)
    ("tinyst", "video", ["spatial_blocks", "temporal_blocks"]),  # a custom pipeline: factorized blocks stay pairs
    ("pipe/wan22", "video", ["blocks"]),  # two transformers: both twinned
])
def test_every_kind_of_pipeline_twins(run_cli, zoo_path, tmp_path, name, modality, lists):
    source = configs_only(zoo_path(name), tmp_path / "source")
    made = twin_json(run_cli, source, tmp_path / "twin")
    assert made["modality"] == modality
    cut = {c["list"]: c for comp in made["components"] for c in comp.get("cuts", [])}
    whole = {k: why for comp in made["components"] for k, why in (comp.get("whole_lists") or {}).items()}
    for block_list in lists:  # cut, or (two blocks deep already) kept whole so a cache has a block to skip
        assert cut[block_list]["after"] < cut[block_list]["before"] if block_list in cut else \
            "all 2 kept" in whole[block_list] and "skip" in whole[block_list], (cut, whole)
    if name == "wan":  # a denoiser with one block list keeps a block behind the one a cache computes
        assert cut["blocks"]["after"] == 2 and "cache" in cut["blocks"]["why"], cut["blocks"]
    assert made["checks"]["output_change"] > 1e-3
    if name == "pipe/wan22":
        calls = made["checks"]["calls"]
        assert set(calls) == {"transformer", "transformer_2"} and all(calls.values()), calls
        assert config(tmp_path / "twin", "transformer_2")["num_attention_heads"] == \
            config(source, "transformer_2")["num_attention_heads"]



@pytest.mark.full
def test_a_pipeline_named_with_the_pipeline_option_twins(run_cli, zoo_path, tmp_path, capsys):
    """A folder whose index names a pipeline class diffusers does not have (a third-party package's, importable):
    refused without `--pipeline` (the error says so), twinned with `--pipeline module:Class`; the twin records it,
    keeps the query/KV heads and loads with it."""
    from ditgate.core.model import Model

    source = configs_only(zoo_path("tinymm"), tmp_path / "source")
    index = json.loads((source / "model_index.json").read_text())
    index["_class_name"] = "TinyMMPipeline"  # a bare name: diffusers' lookup, which does not know it
    (source / "model_index.json").write_text(json.dumps(index))
    capsys.readouterr()  # the zoo build's progress
    code, _, err = run_cli("twin", source, tmp_path / "refused")
    assert code == 2 and "--pipeline" in err and len(err.strip().splitlines()) == 1, err
    made = twin_json(run_cli, source, tmp_path / "twin", "--pipeline", "tinymm:TinyMMPipeline")
    assert made["pipeline"] == "tinymm:TinyMMPipeline" and made["pipeline_class"] == "TinyMMPipeline"
    assert made["checks"]["output_change"] > 1e-3 and all(made["checks"]["calls"].values())
    before, after = config(source, "transformer"), config(tmp_path / "twin", "transformer")
    heads = [k for k in before if "head" in k]
    assert heads and all(after[k] == before[k] for k in heads), (heads, before, after)
    pipe = Model.open(str(tmp_path / "twin"), pipeline="tinymm:TinyMMPipeline").load()
    assert type(pipe).__name__ == "TinyMMPipeline"


ZERO_INIT_MODULE = '''
import functools

from diffusers import FluxTransformer2DModel


class ZeroOutFlux(FluxTransformer2DModel):
    """FLUX's transformer initialised as adaLN-zero DiTs are: output layer and output modulation at zero."""

    @functools.wraps(FluxTransformer2DModel.__init__)  # keeps the signature diffusers reads the config by
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for layer in (self.proj_out, self.norm_out.linear):
            layer.weight.data.zero_()
            layer.bias.data.zero_()
'''


@pytest.mark.full
def test_a_source_that_zero_initialises_its_output_still_discriminates(run_cli, zoo_path, tmp_path):
    """The source class zeroes its output layer, so built from its own init it outputs a constant and no fault
    could show in it; the twin draws those layers again, and a CP fault that raises nothing (the position table
    restarted on each rank) fails on the twin's tensor rule."""
    import torch

    source = configs_only(zoo_path("flux"), tmp_path / "zero-flux")
    (source / "transformer" / "zeroflux.py").write_text(ZERO_INIT_MODULE)  # where diffusers loads custom code
    index = json.loads((source / "model_index.json").read_text())
    index["transformer"] = ["zeroflux", "ZeroOutFlux"]
    (source / "model_index.json").write_text(json.dumps(index))
    cfg = config(source, "transformer") | {"_class_name": "ZeroOutFlux"}
    (source / "transformer" / "config.json").write_text(json.dumps(cfg))

    import importlib.util
    spec = importlib.util.spec_from_file_location("zeroflux", source / "transformer" / "zeroflux.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    own = module.ZeroOutFlux.from_config({k: v for k, v in cfg.items() if not k.startswith("_")})
    assert not own.proj_out.weight.any()  # the source's own init: a constant output

    code, _, err = run_cli("twin", source, tmp_path / "no-consent")
    assert code == 2 and "--trust-remote-code" in err, err
    made = twin_json(run_cli, source, tmp_path / "twin", "--trust-remote-code")
    notes = " ".join(n for c in made["components"] for n in c.get("notes", []))
    assert "zero-initialised" in notes and "proj_out" in notes, notes
    assert made["checks"]["output_change"] > 1e-3
    twin = module.ZeroOutFlux.from_pretrained(tmp_path / "twin" / "transformer")
    assert torch.count_nonzero(twin.proj_out.weight) == twin.proj_out.weight.numel()

    plugins = __import__("pathlib").Path(__file__).parent / "plugins"
    code, out, err = run_cli("run", tmp_path / "twin", "--trust-remote-code", "--rows", "cp-ulysses-2",
                             "--integration", plugins / "flux_cp_rope_restarted.py", "--out", tmp_path / "run")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    row = next(r for r in report["rows"] if r["name"] == "cp-ulysses-2")
    assert code == 1 and row["status"] == "failed", (row, err[-2000:])


def test_diffusers_own_zero_initialised_layers_are_drawn_again():
    """diffusers' ErnieImage transformer zeroes its shared adaLN modulation and its final linear layer: built as
    diffusers makes it, its output is zero whatever the input; the twin's weights draw exactly those layers again
    (and no layer diffusers draws itself), after which the output depends on the input."""
    import torch
    from diffusers import ErnieImageTransformer2DModel

    from ditgate.twin.weights import redraw_zeros

    torch.manual_seed(0)
    model = ErnieImageTransformer2DModel(hidden_size=32, num_attention_heads=2, num_layers=1, ffn_hidden_size=64,
                                         in_channels=4, out_channels=4, text_in_dim=16, rope_axes_dim=(4, 6, 6))
    inputs = [torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    text, lens, t = torch.randn(1, 3, 16), torch.tensor([3]), torch.tensor([500.0])

    def outputs():
        with torch.no_grad():
            return [model(x, t, text, lens, return_dict=False)[0] for x in inputs]

    assert all(not o.any() for o in outputs())  # diffusers' own init: a constant (zero) output
    before = {n: p.clone() for n, p in model.named_parameters()}
    drawn = redraw_zeros(model, seed=1)
    assert set(drawn) == {"adaLN_modulation.1.weight", "adaLN_modulation.1.bias", "final_linear.weight",
                          "final_linear.bias"}, drawn
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if n not in drawn)
    first, second = outputs()
    assert (first - second).abs().max() > 1e-2


def test_a_clip_tokenizer_without_files_stops_at_its_encoders_positions(tmp_path):
    """SD3.5-Large's folder has no tokenizer files; the pipeline pads each CLIP prompt to its tokenizer's limit, so
    a stand-in longer than CLIP's 77 positions made every call of the twin fail. The stand-in takes the paired
    encoder's position table (the T5 one, which has none, keeps its own limit)."""
    from pathlib import Path

    from ditgate.twin import assemble, source as source_mod

    src = source_mod.read(str(Path(source_mod.__file__).parent / "configs" / "sd3.5-large"))
    assert not any(src.components[t].has_tokenizer_files for t in ("tokenizer", "tokenizer_2", "tokenizer_3"))
    summaries, _, vocab = assemble._tokenizers(src, tmp_path, lambda message: None)
    assert vocab["text_encoder"].model_max_length == vocab["text_encoder_2"].model_max_length == 77
    assert vocab["text_encoder_3"].model_max_length > 77 and set(summaries) == {"tokenizer", "tokenizer_2",
                                                                                 "tokenizer_3"}


def test_a_class_conditioned_pipeline_twins_without_a_prompt(run_cli, zoo_path, tmp_path):
    """DiTPipeline takes class labels, no prompt: the twin's call keeps the source's labels and adds no prompt (it
    was refused at every size: 'does not accept prompt')."""
    made = twin_json(run_cli, zoo_path("pipe/dit"), tmp_path / "twin")
    assert "prompt" not in made["call"] and made["call"]["class_labels"] == [0], made["call"]
    assert made["checks"]["output_change"] > 1e-3


def test_a_processor_without_files_gets_a_chat_processor_stand_in(tmp_path):
    """FLUX.2-dev's folder names a PixtralProcessor and ships no tokenizer folder (and Pixtral's class needs
    torchvision): the twin refused it ("has no folder"). A processor without files now gets a chat processor that
    loads offline: the index names the class that reads it, the paired encoder's vocabulary fits it, and the
    pipeline's chat-template call pads the prompt to the asked length."""
    from pathlib import Path

    import transformers
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input

    from ditgate.twin import assemble, source as source_mod, text

    src = source_mod.read(str(Path(source_mod.__file__).parent / "configs" / "flux2-dev"))
    assert src.components["tokenizer"].kind == "tokenizer" and src.components["tokenizer"].folder is None
    summaries, rewrites, vocab = assemble._tokenizers(src, tmp_path, lambda message: None)
    assert summaries["tokenizer"]["action"] == "stand-in" and set(vocab) == {"text_encoder"}
    cls = getattr(transformers, rewrites.get("tokenizer", "PixtralProcessor"))
    processor = cls.from_pretrained(str(tmp_path / "tokenizer"))
    inputs = processor.apply_chat_template(format_input(prompts=["a red cube"], system_message="be brief"),
                                           add_generation_prompt=False, tokenize=True, return_dict=True,
                                           return_tensors="pt", padding="max_length", truncation=True, max_length=64)
    assert inputs["input_ids"].shape == (1, 64) and 0 < int(inputs["attention_mask"].sum()) < 64
    encoder = json.loads((Path(source_mod.__file__).parent / "configs" / "flux2-dev" / "text_encoder" /
                          "config.json").read_text())
    changes = text.vocab_changes(encoder, vocab["text_encoder"])
    assert changes[("text_config", "vocab_size")] >= int(inputs["input_ids"].max()) + 1


def test_lists_that_run_over_two_block_lists_are_cut_with_them():
    """HiDream's transformer has a caption projection per double- and single-stream block (their counts summed) and
    a `llama_layers` list with one Llama hidden-state index per block of both lists: the single-stream list was kept
    whole ("no shorter count rebuilds its kinds"), a 10.6 B-parameter transformer twin, and the build was killed at
    22.8 GiB. Both lists are now cut (one of them to two blocks), `llama_layers` to the kept blocks' entries mapped
    into the twin's cut Llama, and the twin runs on a 1-layer encoder's hidden states."""
    import torch
    from diffusers import HiDreamImageTransformer2DModel

    from ditgate.twin import cut
    from ditgate.twin.meta import DIFFUSERS, instantiate

    config = dict(patch_size=2, in_channels=4, out_channels=4, num_layers=3, num_single_layers=5,
                  attention_head_dim=16, num_attention_heads=2, caption_channels=[16, 16], text_emb_dim=16,
                  num_routed_experts=2, num_activated_experts=1, axes_dims_rope=(8, 4, 4), max_resolution=(8, 8),
                  llama_layers=[0, 1, 2, 3, 4, 5, 5, 5])
    plan = cut.plan(HiDreamImageTransformer2DModel, DIFFUSERS, config, "transformer", denoiser=True,
                    encoder_depths=[(6, 1), (4, 2)])
    twin = plan.config
    # one block of each list, two of the smaller-block one (a cache has a block to skip)
    assert sorted([twin["num_layers"], twin["num_single_layers"]]) == [1, 2] and not plan.whole, plan.whole
    blocks = twin["num_layers"] + twin["num_single_layers"]
    assert twin["llama_layers"] == [0] * blocks, twin["llama_layers"]  # layers 0..4 of 6 -> layer 0 of the cut 1
    torch.manual_seed(0)
    model = instantiate(HiDreamImageTransformer2DModel, DIFFUSERS, twin).eval()
    assert len(model.caption_projection) == blocks + 1
    with torch.no_grad():
        out = model(hidden_states=torch.randn(1, 4, 8, 8), timesteps=torch.tensor([500.0]),
                    encoder_hidden_states_t5=torch.randn(1, 3, 16), encoder_hidden_states_llama3=torch.randn(1, 1, 3, 16),
                    pooled_embeds=torch.randn(1, 16), return_dict=False)[0]
    assert out.shape == (1, 4, 8, 8)


@pytest.mark.full  # about 40 s on 2 loaded cores: the twin's whole call at 4, 6 and 8 steps
def test_each_of_two_transformers_takes_enough_steps_for_a_cache(run_cli, zoo_path, tmp_path):
    """Wan 2.2's second transformer takes the steps after its boundary: at the twin's 4 steps each expert took 2,
    which a cache's 2 warm-up steps covered, and the cache row said "did not act" on a twin run directly. Steps
    are added until each transformer takes 3 of its own."""
    made = twin_json(run_cli, zoo_path("pipe/wan22"), tmp_path / "twin")
    steps, calls = made["call"]["num_inference_steps"], made["checks"]["calls"]
    per_step = sum(calls.values()) / steps
    assert steps > 4 and min(calls.values()) / per_step >= 3, (steps, calls)


@pytest.mark.full
@pytest.mark.parametrize("source, why", [
    ("pipe/wan22", "two transformers: each takes its own steps"),
    ("pipe/hunyuanvideo", "two block lists, each cached with its first block computed"),
    ("pipe/chroma", "two block lists (Flux-like, no dummy blocks)"),
    ("pipe/ovis", "two block lists (Flux-like, no dummy blocks)"),
    ("pipe/lumina2", "refiner lists beside the main list: the main list keeps two"),
    ("pipe/zimage", "refiner lists beside the main list: the main list keeps two"),
    ("qwen-image", "no negative prompt in the source call: one call per step, cache-dit assumes two"),
])
def test_a_cache_row_acts_on_a_twin_run_directly(run_cli, zoo_path, tmp_path, source, why):
    """The twin's call lets a run's default cache row act: `ditgate run TWIN --rows cache` proves it acted (it said
    "did not act" on qwen-image, wan2.2 and hunyuanvideo's real configurations, and on the survey's chroma/ovis)."""
    folder = configs_only(zoo_path(source), tmp_path / "source")
    meta = json.loads((folder / "ditgate.json").read_text())
    meta["call"].pop("negative_prompt", None)
    (folder / "ditgate.json").write_text(json.dumps(meta))
    twin_json(run_cli, folder, tmp_path / "twin")
    code, out, err = run_cli("run", tmp_path / "twin", "--rows", "cache", "--dtype", "float32", "--device", "cpu",
                             "--out", tmp_path / "run", "--json")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    row = next(r for r in report["rows"] if r["name"] == "cache")
    assert [p for p in row["proofs"] if p["feature"] == "cache"][0]["passed"], (why, row["proofs"])


def test_a_denoiser_with_an_embedder_list_keeps_a_block_for_the_cache_to_skip():
    """Wan image-to-video's transformer holds a second ModuleList (its image embedder's feed-forward `net`) that no
    config key counts: it is no block list, so the one block list keeps two blocks (with one, a cache computing
    the first block had nothing to skip: 'cache did not act' on the twins of wan-i2v and chronoedit)."""
    from diffusers import WanTransformer3DModel

    from ditgate.twin import cut
    from ditgate.twin.meta import DIFFUSERS

    config = {"attention_head_dim": 12, "ffn_dim": 32, "freq_dim": 256, "image_dim": 16, "in_channels": 36,
              "num_attention_heads": 4, "num_layers": 3, "out_channels": 16, "patch_size": [1, 2, 2],
              "rope_max_seq_len": 32, "text_dim": 32, "qk_norm": "rms_norm_across_heads", "cross_attn_norm": True}
    plan = cut.plan(WanTransformer3DModel, DIFFUSERS, config, "transformer", denoiser=True)
    blocks = next(c for c in plan.cuts if c.path == "blocks")
    assert blocks.after == 2 and "skip" in blocks.why, blocks
    assert "condition_embedder.image_embedder.ff.net" in plan.whole


@pytest.mark.full
@pytest.mark.parametrize("source, why", [
    ("pipe/krea2", "a pipeline setting (model_index.json) names encoder layers: text_encoder_select_layers"),
    ("pipe/cogvideox", "a text position table as long as the source call's max_sequence_length"),
    ("pipe/cogvideox-i2v", "the same, refused as 'a different resolution than the defaults'"),
])
def test_twins_the_survey_could_not_build(run_cli, zoo_path, tmp_path, source, why):
    """The survey's 'no twin' rows: Krea2's index was refused ('not a [library, class] pair') and its select layers
    then indexed past the cut encoder; CogVideoX 2B's twin failed at every size with its own text length."""
    made = twin_json(run_cli, configs_only(zoo_path(source), tmp_path / "source"), tmp_path / "twin")
    assert made["checks"]["output_change"] > 1e-3, why


def test_a_modular_folder_of_configs_alone_opens_for_its_twin(zoo_path, tmp_path):
    """`ditgate twin` and `--twin only` need configs alone; a run of the model itself needs the weight files."""
    from ditgate.core.errors import DitgateError
    from ditgate.core.model import Model

    source = configs_only(zoo_path("flux3"), tmp_path / "source")
    with pytest.raises(DitgateError, match="components cannot load: .*transformer"):
        Model.open(source)
    assert Model.open(source, weights=False).is_modular


@pytest.mark.full
def test_a_forward_that_pairs_its_blocks_gets_a_deeper_cut(run_cli, zoo_path, tmp_path):
    """Hunyuan-DiT's blocks push a skip in the first half and pop it in the second: an odd block count (the fewest
    that keep both kinds) fails its own forward ('pop from empty list'); the twin tries deeper cuts until its call
    runs, and says so."""
    made = twin_json(run_cli, configs_only(zoo_path("pipe/hunyuandit"), tmp_path / "source"), tmp_path / "twin")
    blocks = config(tmp_path / "twin", "transformer")["num_layers"]
    assert blocks % 2 == 0 and blocks > 3, blocks
    assert any("the call failed on the fewest" in note for note in made["notes"]), made["notes"]
