"""`ditgate scaffold`: the plugin written from the observed call, and its rows on the float32 twin."""

import importlib.util
import json

import pytest
import torch


def report_rows(run_dir) -> dict:
    """The rows of a run's report.json by name."""
    return {r["name"]: r for r in json.loads((run_dir / "report.json").read_text())["rows"]}


def scaffold_passing(run_cli, tmp_path, model: str, rows: str) -> str:
    """`ditgate scaffold MODEL --rows ROWS` into tmp_path: asserts it ends with 0 and every row passed; the plugin."""
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", model, "--out", out, "--rows", rows, "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    got = report_rows(tmp_path / "run")
    assert all(got[row]["status"] == "passed" for row in rows.split(",")), got
    return out.read_text()


def cache_row_without_functor(run_cli, tmp_path, model: str, text: str) -> tuple[int, dict, str]:
    """The scaffolded plugin `text` with its patch functor cut out, its cache row run on MODEL itself: (exit code,
    the cache row, the plugin run)."""
    bare = tmp_path / "no_functor.py"
    bare.write_text(text.replace(text[text.index(",\n                                  patch_functor="):
                                      text.index("\n\n\ndef cp_plan")], ")"))
    code, stdout, _ = run_cli("run", model, "--rows", "cache", "--twin", "off", "--integration", bare,
                              "--out", tmp_path / "bare", "--json")
    (row,) = [r for r in json.loads(stdout)["rows"] if r["name"] == "cache"]
    return code, row, bare.read_text()


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wan_plugin_splits_at_the_first_block_and_keeps_the_text_whole(run_cli, tmp_path):
    out = tmp_path / "wan_plugin.py"
    code, stdout, err = run_cli("scaffold", "zoo:wan", "--out", out, "--no-run")
    assert code == 0, err
    text = out.read_text()
    plugin = _load(out)  # it is Python that imports
    assert {"block_adapter", "cp_plan", "tp_plan"} <= set(vars(plugin))
    # Wan's forward makes the sequence itself (5-D latents in): split at blocks.0, RoPE split by its output
    assert '"blocks.0": {"hidden_states": _ContextParallelInput(split_dim=1, expected_dims=3' in text
    assert '"rope": {0: _ContextParallelInput(split_dim=1, expected_dims=4, split_output=True)' in text
    assert "cross attention" in text and "encoder_hidden_states\": _ContextParallel" not in text
    assert "cache_dit.ForwardPattern.Pattern_2" in text and '"norm_out": _ContextParallelOutput' in text
    assert 'CP_SPLIT_DIMS = {"blocks": 1}' in text  # read from what the blocks return
    # Wan normalises q/k over all heads: its attention stays whole under TP, the feed-forward pair is sharded
    assert "`attn1` normalises q/k over all heads" in text and "attn1.to_q" not in text
    assert '"ffn.net.0.proj": ColwiseParallel(), "ffn.net.2": RowwiseParallel()' in text


def test_scaffold_refuses_a_folder_as_out(run_cli, tmp_path):
    code, _, err = run_cli("scaffold", "zoo:wan", "--out", tmp_path, "--no-run")
    assert code == 2 and "is a folder" in err


@pytest.mark.full
def test_flux_plugin_passes_its_rows_and_the_opposite_choice_fails_the_named_row(run_cli, tmp_path):
    out = tmp_path / "flux_plugin.py"
    code, stdout, err = run_cli("scaffold", "zoo:flux", "--out", out, "--rows", "cp-ulysses-2,tp-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    assert '"img_ids": _ContextParallelInput(split_dim=0' in text and "pooled_projections" not in text.split(
        "return {")[1].split("}")[0]
    assert "the other choice, text kept whole, is told apart by cp-ulysses-2" in text
    # the opposite choice: the text kept whole under joint attention
    opposite = tmp_path / "flux_text_whole.py"
    opposite.write_text(text.replace('"encoder_hidden_states": _ContextParallelInput(split_dim=1, expected_dims=3, '
                                     'split_output=False), ', "").replace(
        '"txt_ids": _ContextParallelInput(split_dim=0, expected_dims=2, split_output=False)', ""))
    assert opposite.read_text() != text
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    twin_folder = report["model"]
    code, _, _ = run_cli("run", twin_folder, "--rows", "cp-ulysses-2", "--integration", opposite,
                         "--out", tmp_path / "opposite", "-q")
    assert code == 1
    rows = report_rows(tmp_path / "opposite")
    assert rows["cp-ulysses-2"]["status"] != "passed"


def test_joint_key_mask_is_put_in_the_order_ulysses_gathers_the_keys():
    """Two ranks, image queries on [image, text] keys: rank r's keys arrive as its image share then its text share."""
    import torch

    from ditgate.scaffold.runtime import HELPERS

    space = {"torch": torch}
    exec(HELPERS.split("class RoutedAttention")[0], space)  # the helper as the plugin holds it
    whole = torch.arange(4 + 6)[None, None, None, :]  # 4 image keys, then 6 text keys
    gathered = space["_key_mask_in_gathered_order"](whole, 2, 5, 2, False)
    assert gathered.flatten().tolist() == [0, 1, 4, 5, 6, 2, 3, 7, 8, 9]
    text_first = torch.arange(6 + 4)[None, None, None, :]  # 6 text keys, then 4 image keys
    assert space["_key_mask_in_gathered_order"](text_first, 2, 5, 2, True).flatten().tolist() == \
        [0, 1, 2, 6, 7, 3, 4, 5, 8, 9]


def test_an_odd_joint_text_is_evened_by_one_more_padded_token():
    from types import SimpleNamespace

    from ditgate.scaffold.cp import even_text_call

    def seen(text, joint=True):
        return SimpleNamespace(anatomy=SimpleNamespace(sequence=SimpleNamespace(joint=joint, text_tokens=text)))

    params = {"max_sequence_length": 256, "prompt": None}
    assert even_text_call(seen(109), {"max_sequence_length": 32}, params) == {"max_sequence_length": 33}
    assert even_text_call(seen(333), {}, params) == {"max_sequence_length": 257}  # the pipeline's default
    assert even_text_call(seen(110), {"max_sequence_length": 33}, params) == {}  # already even
    assert even_text_call(seen(109, joint=False), {}, params) == {}  # a cross-attended text is never split
    assert even_text_call(seen(109), {}, {"prompt": None}) == {}  # no padding length to change


def test_a_chained_pair_is_never_colwise_twice_and_a_fused_gated_pair_stays_whole():
    """inspect's TP rows: `mod_down` feeds `mod_up` (a chained modulation pair, as the trace records it): the first is
    kept whole. The scaffold shards neither the chain's first nor a fused gated pair."""
    from ditgate.inspect.model import Traits
    from ditgate.inspect.traits import revise_tp_layers
    from ditgate.scaffold.write import _tp_layers

    rows = [{"layer": "mod_down", "style": "Colwise (reads the block width)"},
            {"layer": "mod_up", "style": "Colwise (reads the block width)"},
            {"layer": "ff.net.0.proj", "style": "Colwise (reads the block width)"},
            {"layer": "ff.net.2", "style": "Rowwise (writes the block width)"}]
    traits = Traits(chunked_modulation=["t.blocks.*.mod_up (chunk 6)"], gated_mlps=["t.blocks.*.ff.net.0.proj"],
                    linear_chains=[["t.blocks.*.mod_down", "t.blocks.*.mod_up"],
                                   ["t.blocks.*.ff.net.0.proj", "t.blocks.*.ff.net.2"]])
    revise_tp_layers({"Block": rows}, traits)
    styles = {r["layer"]: r["style"] for r in rows}
    assert styles["mod_up"] == "Colwise(output_layouts=Replicate())"
    assert styles["mod_down"].startswith("keep whole: its output feeds `mod_up`")
    plan, notes = _tp_layers(rows, 4, set(), [("mod_down", "mod_up")])
    assert plan == {"mod_up": "ColwiseParallel(output_layouts=Replicate())"}  # mod_down whole, gated pair whole
    assert any("`mod_down` feeds `mod_up` (observed): `mod_down` kept whole" in n for n in notes)


@pytest.mark.full
def test_nucleusmoe_plugin_passes_and_each_opposite_choice_fails_the_named_row(run_cli, tmp_path):
    """Nucleus-MoE (diffusers' own layers): image queries on image + padded-text keys, packed experts with
    expert-choice routing in blocks 1-2 only. The scaffold splits the text at every block with its RoPE, routes the
    attention through cache-dit's dispatcher (queries padded to the keys' length, the key mask reordered), runs the
    router on the gathered sequence, and shards each block structure with its own plan. Keeping the text whole, or
    routing each rank's share, fails cp-ulysses-2, the row the plugin names for each."""
    out = tmp_path / "nucleus.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/nucleusmoe", "--out", out, "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    rows = {name: r["status"] for name, r in report_rows(tmp_path / "run").items()}
    assert rows == {"baseline": "reference", "cache": "passed", "cp-ulysses-2": "passed", "tp-2": "passed"}, rows
    assert '"transformer_blocks.*": {"encoder_hidden_states": _ContextParallelInput(split_dim=1' in text
    assert "the other choice, text kept whole, is told apart by cp-ulysses-2" in text
    assert "route_attention([block.attn for block in transformer.transformer_blocks], REORDER_MASK" in text
    assert "gather_routing(transformer, [block.img_mlp for block in [transformer.transformer_blocks[i] for i in " \
           "(1, 2)]])" in text and "(GATHER_ROUTING; False, routing each share, is told apart by cp-ulysses-2)" in text
    assert "# NucleusMoEImageTransformerBlock[1-2] (in transformer_blocks):" in text
    assert 'shard_div_attr(block.attn, "inner_dim", tp)' in text  # the processor reads heads from inner_dim
    text_whole = text.replace('        "transformer_blocks.*": {"encoder_hidden_states": _ContextParallelInput('
                              'split_dim=1, expected_dims=3, split_output=False)},\n', "").replace(
        ", 1: _ContextParallelInput(split_dim=0, expected_dims=2, split_output=True)}", "}")
    local_routing = text.replace("GATHER_ROUTING = True", "GATHER_ROUTING = False")
    for name, source in (("text_whole", text_whole), ("local_routing", local_routing)):
        assert source != text
        plugin = tmp_path / f"{name}.py"
        plugin.write_text(source)
        code, _, _ = run_cli("run", "zoo:pipe/nucleusmoe", "--rows", "cp-ulysses-2", "--integration", plugin,
                             "--dtype", "float32", "--out", tmp_path / name, "-q")
        report = json.loads((tmp_path / name / "report.json").read_text())
        (row,) = [r for r in report["rows"] if r["name"] == "cp-ulysses-2"]
        assert code == 1 and row["status"] in ("failed", "error"), (name, row["status"])  # text whole: a crash


@pytest.mark.full
def test_ltx_i2v_per_token_timestep_built_in_forward_is_split_at_every_block(run_cli, tmp_path):
    """LTX-Video I2V holds the first frame with a per-token timestep: its forward builds `temb` [B, tokens, 6 x dim]
    (a view of `time_embed`'s output, so no module makes it) and hands it to every block, and scales the output by a
    per-token table after the blocks. The scaffold splits `temb` at every block, gathers at `norm_out` (before that
    scale), and runs the masked cross-attention without the CP config; `temb` left whole fails cp-ulysses-2."""
    out = tmp_path / "ltx.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/ltx-i2v", "--out", out, "--rows", "cp-ulysses-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    entry = '        "transformer_blocks.*": {"temb": _ContextParallelInput(split_dim=1, expected_dims=3, ' \
            'split_output=False)},\n'
    assert entry in text and '"norm_out": _ContextParallelOutput(gather_dim=1' in text
    assert "route_attention([block.attn2 for block in transformer.transformer_blocks], local=True)" in text
    plugin = tmp_path / "temb_whole.py"
    plugin.write_text(text.replace(entry, ""))
    code, _, _ = run_cli("run", "zoo:pipe/ltx-i2v", "--rows", "cp-ulysses-2", "--integration", plugin,
                         "--dtype", "float32", "--out", tmp_path / "temb_whole", "-q")
    row = report_rows(tmp_path / "temb_whole")["cp-ulysses-2"]
    assert code == 1 and row["status"] in ("failed", "error"), row["status"]


@pytest.mark.full
def test_tinymoe_long_skip_is_split_where_the_stream_is_made(run_cli, tmp_path):
    """zoo:tinymoe adds the first block's input back after the blocks (a long skip), builds its RoPE table in forward,
    routes expert-choice, and its processor calls SDPA itself (it has a `_cp_config` attribute it never hands on).
    The scaffold splits at `x_embedder`'s output, the table at every block, runs the MoE on the gathered sequence and
    routes the attention through cache-dit's dispatcher; a split at `blocks.0` leaves the skip whole and fails."""
    out = tmp_path / "tinymoe.py"
    code, stdout, err = run_cli("scaffold", "zoo:tinymoe", "--out", out, "--rows", "cp-ulysses-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    entry = '        "x_embedder": {0: _ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)},\n'
    assert entry in text and "route_attention([block.attn for block in transformer.blocks]" in text
    plugin = tmp_path / "block0.py"
    plugin.write_text(text.replace(entry, '        "blocks.0": {"hidden_states": _ContextParallelInput(split_dim=1, '
                                          'expected_dims=3, split_output=False)},\n'))
    code, _, _ = run_cli("run", "zoo:tinymoe", "--rows", "cp-ulysses-2", "--integration", plugin,
                         "--dtype", "float32", "--out", tmp_path / "block0", "-q")
    row = report_rows(tmp_path / "block0")["cp-ulysses-2"]
    assert code == 1 and row["status"] in ("failed", "error"), row["status"]


@pytest.mark.full
def test_wan22_plugin_adapts_both_experts_and_one_left_out_fails_naming_it(run_cli, tmp_path):
    """Wan 2.2 (zoo:pipe/wan22, diffusers' WanPipeline with two experts): the scaffold's adapter names both
    transformers, with the steps each serves, and its cache, cp-ulysses-2 and tp-2 act on both and pass; the same
    plugin adapting only `transformer` (a Wan 2.1 adapter) fails the three rows naming transformer_2."""
    out = tmp_path / "wan22.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/wan22", "--steps", "8", "--out", out, "--run-dir",
                                tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    assert "# transformer: 6 calls, steps 0-2, 2 per step (cond and uncond)" in text
    assert "# transformer_2: 10 calls, steps 3-7, 2 per step (cond and uncond)" in text
    assert "transformer=[pipe.transformer, pipe.transformer_2]" in text and "NOT HANDLED" not in text
    assert "`transformer`, `transformer_2`: class WanTransformer3DModel, the same block lists" in text
    rows = report_rows(tmp_path / "run")
    for name, feature in (("cache", "cache"), ("cp-ulysses-2", "cp"), ("tp-2", "tp")):
        proof = next(p for p in rows[name]["proofs"] if p["feature"] == feature)
        assert rows[name]["status"] == "passed" and proof["coverage"] == {"transformer": "acted",
                                                                          "transformer_2": "acted"}, proof
    one = tmp_path / "wan22_first_only.py"
    one.write_text(text.replace("transformer=[pipe.transformer, pipe.transformer_2]", "transformer=pipe.transformer")
                   .replace("blocks=[[pipe.transformer.blocks], [pipe.transformer_2.blocks]]",
                            "blocks=[pipe.transformer.blocks]")
                   .replace("forward_pattern=[[cache_dit.ForwardPattern.Pattern_2], "
                            "[cache_dit.ForwardPattern.Pattern_2]]", "forward_pattern=[cache_dit.ForwardPattern.Pattern_2]"))
    assert "pipe.transformer_2.blocks" not in one.read_text()
    code, stdout, _ = run_cli("run", "zoo:pipe/wan22", "--rows", "cache,cp-ulysses-2,tp-2", "--twin", "off",
                              "--steps", "8", "--integration", one, "--out", tmp_path / "one", "--json")
    assert code == 1
    rows = {r["name"]: r for r in json.loads(stdout)["rows"]}
    for name, feature in (("cache", "cache"), ("cp-ulysses-2", "cp"), ("tp-2", "tp")):
        assert rows[name]["status"] == "failed", (name, rows[name]["status"])
        assert any(r.startswith(f"{feature} left a transformer out: {feature} acted on transformer (6 calls, steps "
                                "0-2) and not on transformer_2 (10 calls, steps 3-7)") for r in rows[name]["reasons"])


CHAIN_CALL = ("--dtype", "float32", "--height", "32", "--width", "32", "--steps", "4", "--prompt", "a red cube")


@pytest.mark.full
def test_a_chained_modulation_pair_is_reported_and_its_first_kept_whole_passes_tp(run_cli, tmp_path):
    """diffusers' FluxPipeline with examples/tinychain's transformer (FLUX.1's, its double blocks' AdaLayerNormZero
    modulation a Linear(64, 16) feeding a Linear(16, 384)): inspect reports the chain; the scaffold keeps the first
    whole and shards the second Colwise with a replicated output, and tp-2 passes; both Colwise crashes tp-2 in the
    second Linear (it receives half of the first's features)."""
    import torch

    from ditgate.core.examples import ensure_importable
    from ditgate.zoo import builders

    ensure_importable("tinychain")
    from tinychain import TinyChainTransformer2DModel

    pipe = builders.build_flux(0)
    torch.manual_seed(0)
    pipe.register_modules(transformer=TinyChainTransformer2DModel(modulation_rank=16))
    folder = tmp_path / "tinychain"
    pipe.save_pretrained(folder)
    code, stdout, err = run_cli("inspect", folder, *CHAIN_CALL, "--json")
    assert code == 0, err
    anatomy = json.loads(stdout)
    assert ["transformer.transformer_blocks.*.norm1.linear.0", "transformer.transformer_blocks.*.norm1.linear.1"] \
        in anatomy["traits"]["linear_chains"]
    styles = {r["layer"]: r["style"] for r in anatomy["tp_layers"]["FluxTransformerBlock"]}
    assert styles["norm1.linear.0"].startswith("keep whole: its output feeds `norm1.linear.1`"), styles
    out = tmp_path / "chain.py"
    code, _, err = run_cli("scaffold", folder, *CHAIN_CALL, "--out", out, "--no-run")
    assert code == 0, err
    text = out.read_text()
    assert "`norm1.linear.0` feeds `norm1.linear.1` (observed): `norm1.linear.0` kept whole" in text
    assert '"norm1.linear.1": ColwiseParallel(output_layouts=Replicate())' in text and '"norm1.linear.0"' not in text
    both = tmp_path / "chain_both_colwise.py"
    both.write_text(text.replace('plan = {"attn.to_q"', 'plan = {"norm1.linear.0": ColwiseParallel(), "attn.to_q"'))
    assert '"norm1.linear.0": ColwiseParallel()' in both.read_text()
    statuses = {}
    for plugin in (out, both):
        code, stdout, _ = run_cli("run", folder, *CHAIN_CALL, "--rows", "tp-2", "--twin", "off", "--integration",
                                  plugin, "--out", tmp_path / plugin.stem, "--json")
        (row,) = [r for r in json.loads(stdout)["rows"] if r["name"] == "tp-2"]
        statuses[plugin.stem] = (code, row["status"], " ".join(row["reasons"]))
    assert statuses["chain"][:2] == (0, "passed"), statuses
    code, status, reasons = statuses["chain_both_colwise"]
    assert code == 1 and status == "error" and "norm1.linear.1" in reasons, statuses


# model -> (an entry the scaffold writes, the text that replaces it in the opposite plugin, why)
_TABLES = {
    # LTX-Video's RoPE module reads the frame grid, not the tokens: split at its output, not at the root
    "pipe/ltx": ('"rope": {0: _ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)',
                 '"rope": {0: None', "root"),
    # Stable Audio's RoPE tuple (cos, sin) reaches every block whole: each element split at every block
    "stable-audio": ('"transformer_blocks.*": {"rotary_embedding": [_ContextParallelInput(split_dim=0, '
                     'expected_dims=2, split_output=False), _ContextParallelInput(split_dim=0, expected_dims=2, '
                     'split_output=False)]},', "", "tuple"),
    # FLUX.2's joint RoPE is concatenated in forward from the text's and the image's positions: split both at the root
    # AnyFlow's RoPE module returns a dict ({'query', 'key'}), which no CP plan entry splits: cut where it is made
    "pipe/anyflow": ("    split_dict_output(transformer, transformer.rope, {'query': 2, 'key': 2})\n", "", "dict"),
    "pipe/flux2-klein": ('"img_ids": _ContextParallelInput(split_dim=1, expected_dims=3, split_output=False), '
                         '"txt_ids": _ContextParallelInput(split_dim=1, expected_dims=3, split_output=False)', "",
                         "joint"),
}


@pytest.mark.full
@pytest.mark.parametrize("name", sorted(_TABLES))
def test_per_token_tables_are_split_where_their_rows_follow_the_tokens(run_cli, tmp_path, name):
    """Each plugin passes cp-ulysses-2 (on the survey it crashed: a root split left LTX's RoPE whole, Stable Audio's
    RoPE tuple was left whole, FLUX.2-klein's joint RoPE was not split at all, AnyFlow's dict of RoPE tables reached
    cache-dit's output split); the plugin without that entry fails."""
    entry, replacement, _ = _TABLES[name]
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", f"zoo:{name}", "--out", out, "--rows", "cp-ulysses-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    assert entry in text, text
    if name == "pipe/ltx":  # the opposite: the table's module left alone, the stream split at the root
        opposite = text.replace('"transformer_blocks.0": {"hidden_states"', '"": {"hidden_states"').replace(
            text[text.index('        "rope": {'):].split("\n", 1)[0] + "\n", "")
    else:
        opposite = text.replace(entry, replacement)
    assert opposite != text
    plugin = tmp_path / "opposite.py"
    plugin.write_text(opposite)
    code, _, _ = run_cli("run", f"zoo:{name}", "--rows", "cp-ulysses-2", "--integration", plugin, "--dtype",
                         "float32", "--out", tmp_path / "opposite", "-q")
    row = report_rows(tmp_path / "opposite")["cp-ulysses-2"]
    assert code == 1 and row["status"] in ("failed", "error"), row["status"]


@pytest.mark.full
def test_a_rope_learned_per_head_is_cut_to_each_ranks_heads_under_tp(run_cli, tmp_path):
    """Mochi's RoPE is learned per head ([tokens, heads, dim]) and handed to its attention: the scaffold observes the
    heads dimension and cuts the table to each rank's heads (on the survey, tp-2 crashed: 'size of tensor a (2) must
    match b (4)'); without that line tp-2 fails again."""
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/mochi", "--out", out, "--rows", "tp-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    line = "        cut_head_tables(block.attn1, 4, tp_mesh, ('image_rotary_emb',))\n"
    assert line in text, text
    plugin = tmp_path / "opposite.py"
    plugin.write_text(text.replace(line, ""))
    code, _, _ = run_cli("run", "zoo:pipe/mochi", "--rows", "tp-2", "--integration", plugin, "--dtype", "float32",
                         "--out", tmp_path / "opposite", "-q")
    row = report_rows(tmp_path / "opposite")["tp-2"]
    assert code == 1 and row["status"] in ("failed", "error"), row["status"]


@pytest.mark.full
def test_chroma_per_block_arguments_get_a_patch_functor_and_without_it_caching_off_departs(run_cli, tmp_path):
    """Chroma (zoo:pipe/chroma, diffusers' ChromaPipeline): its loop hands each block its own slice of the
    modulation table (`temb`), observed as block 1 getting another `temb` than block 0. The scaffold writes
    BlockLoop, which records what each block is handed and gives it back under cache-dit's cached block
    list: the cache row passes with caching off exactly equal to the baseline; the same plugin without the functor
    fails the cache row's caching-off check."""
    out = tmp_path / "chroma.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/chroma", "--out", out, "--rows", "cache", "--run-dir",
                                tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    assert "`transformer_blocks`: block 1 was handed other ['temb'] than block 0 (observed)" in text
    assert ("patch_functor=BlockLoop({\"transformer_blocks\": (['temb'], ['encoder_hidden_states', "
            "'hidden_states']), \"single_transformer_blocks\": (['temb'], ['hidden_states'])})") in text
    row = report_rows(tmp_path / "run")["cache"]
    assert row["status"] == "passed" and row["verdict"]["cache_off"]["max_abs"] == 0.0, row["verdict"]
    code, row, bare = cache_row_without_functor(run_cli, tmp_path, "zoo:pipe/chroma", text)
    assert "patch_functor=" not in bare
    assert code == 1 and row["status"] == "failed" and not row["verdict"]["cache_off"]["passed"], row["verdict"]
    assert any(r.startswith("caching off, the adapter's latents differ") for r in row["reasons"]), row["reasons"]


@pytest.mark.full
def test_a_second_transformer_of_another_class_is_adapted_and_its_plans_refuse_it(tmp_path):
    """What the scaffold writes when the pipeline's second transformer is of another class than the first (Wan 2.2's
    observation with transformer_2's class renamed): both are adapted for cache (each list has its observed
    pattern), and the CP/TP plans, derived from the first transformer's call, raise on the other class, naming it,
    instead of applying paths of the first one's layout."""
    from ditgate.core.model import Model
    from ditgate.scaffold.write import observe, plugin_source

    observed = observe(Model.open("zoo:pipe/wan22", dtype="float32", device="cpu", steps=4))
    second = next(c for c in observed.anatomy.components["transformers"] if c.name == "transformer_2")
    second.cls = "OtherTransformer3DModel"
    text = plugin_source(observed)
    assert "transformer=[pipe.transformer, pipe.transformer_2]" in text
    assert "NOT HANDLED: ['transformer_2'] are of another class or block layout" in text
    space = {}
    exec(compile(text, "plugin.py", "exec"), space)
    other = type("OtherTransformer3DModel", (torch.nn.Module,), {})()
    with pytest.raises(NotImplementedError, match="no plan for OtherTransformer3DModel"):
        space["cp_plan"](other, None)
    with pytest.raises(NotImplementedError, match="no plan for OtherTransformer3DModel"):
        space["tp_plan"](other, None, None)


@pytest.mark.full
def test_dit_block_read_outside_the_loop_gets_it_from_the_functor(run_cli, tmp_path):
    """DiT (zoo:pipe/dit, diffusers' DiTPipeline): the forward runs `transformer_blocks[0].norm1.emb` after the loop
    (observed: called while block 0 was not running). The scaffold's BlockLoop hands cache-dit's wrapper, which
    holds that place during a call, the block's `norm1`: the adapter is proven (caching off equals the baseline,
    max-abs 0); without it the cache row errors on the missing attribute."""
    out = tmp_path / "dit.py"
    run_cli("scaffold", "zoo:pipe/dit", "--out", out, "--rows", "cache", "--run-dir", tmp_path / "run")
    text = out.read_text()
    assert "patch_functor=BlockLoop({}, outside={'transformer_blocks': [(0, 'norm1')]})" in text
    assert "(observed: `transformer_blocks.0.norm1.emb` ran while block 0 was not running)" in text
    row = report_rows(tmp_path / "run")["cache"]
    assert row["status"] in ("passed", "inconclusive") and row["verdict"]["cache_off"]["max_abs"] == 0.0, row["status"]
    code, row, _ = cache_row_without_functor(run_cli, tmp_path, "zoo:pipe/dit", text)
    assert code == 1 and row["status"] == "error" and "has no attribute 'norm1'" in row["reasons"][0], row["reasons"]


@pytest.mark.full
def test_an_odd_joint_text_gets_a_twin_call_where_cp_splits_it(run_cli, zoo_path, tmp_path):
    """SD3 (a folder, so its rows run on its twin): 77 CLIP tokens + max_sequence_length T5 tokens attend jointly with
    the image; at the folder's call (max_sequence_length 32) the 109 text tokens do not split over 2 ranks and
    cp-ulysses-2 crashed on the survey. The scaffold gives the twin max_sequence_length 33 (110 tokens) and the row
    passes; the plugin still names the user's uneven text NOT HANDLED."""
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", zoo_path("pipe/sd3"), "--out", out, "--rows", "cp-ulysses-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    assert "max_sequence_length=33" in err and "the 109 text tokens do not split evenly" in out.read_text()
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["request"]["call"]["max_sequence_length"] == 33


def test_the_text_order_is_read_from_the_processors_concatenation():
    import inspect

    from diffusers.models.attention_processor import JointAttnProcessor2_0
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    from ditgate.scaffold.write import _text_first

    assert _text_first(inspect.getsource(FluxAttnProcessor.__call__)) is True  # cat([encoder_query, query])
    assert _text_first(inspect.getsource(JointAttnProcessor2_0.__call__)) is False  # cat([query, encoder_query])
    assert _text_first("hidden = torch.cat([a, b], dim=1)") is None


@pytest.mark.full
def test_chroma_joint_mask_in_text_first_order_over_queries_and_keys(run_cli, tmp_path):
    """Chroma's blocks hand their processor a [B, 1, S, S] mask over [text, image] (queries and keys); no padded key
    is seen at the call, so the order comes from the processor's code (torch.cat([encoder_query, query])). Under
    Ulysses the mask's rows and columns are put in the gathered order, the single-stream blocks using the text length
    the joint blocks saw: cp-ulysses-2 passes (on the survey: latents off 0.117; cache-dit's own plan: 0.165); with
    the text taken to come after the image it fails."""
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/chroma", "--out", out, "--rows", "cp-ulysses-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    assert text.count("REORDER_MASK, text_first=True)") == 2 and "its processor's code concatenates the text" in text
    plugin = tmp_path / "opposite.py"
    plugin.write_text(text.replace("text_first=True)", "text_first=False)"))
    code, _, _ = run_cli("run", "zoo:pipe/chroma", "--rows", "cp-ulysses-2", "--integration", plugin, "--dtype",
                         "float32", "--out", tmp_path / "opposite", "-q")
    row = report_rows(tmp_path / "opposite")["cp-ulysses-2"]
    assert code == 1 and row["status"] in ("failed", "error"), row["status"]
