"""`ditgate scaffold` on Cosmos 3 distilled (a modular pipeline): a joint text/vision decoder layer whose streams are
packed [tokens, features] (no batch dimension), its attention projections and head counts under their own names."""

import pytest
from test_scaffold import report_rows

MODEL = "zoo:cosmos3-distilled"


@pytest.mark.full
def test_tp_shards_packed_attention_and_both_mlps(run_cli, tmp_path):
    """The attention's output projection is a Linear `to_out` (no `to_out.0`), its head counts are
    `num_attention_heads` / `num_key_value_heads` (read as q width / head_dim), its q/k norms are per head on packed
    [tokens, heads, head_dim] tensors (observed width 16, not a projection's), and its MLPs are gate/up/down with
    both gate and up observed reaching down. The plugin shards all of them and divides both head counts: tp-2 passes.
    The old plan (nothing sharded) fails tp-2 as 'did not act'; the same plan without the head counts divided fails
    too (the processor views each rank's shard with the whole head count)."""
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", MODEL, "--out", out, "--rows", "tp-2", "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    for entry in ('"self_attn.to_out": RowwiseParallel()', '"self_attn.to_add_out": RowwiseParallel()',
                  '"mlp.up_proj": ColwiseParallel()', '"mlp_moe_gen.down_proj": RowwiseParallel()',
                  'shard_div_attr(block.self_attn, "num_key_value_heads", tp)'):
        assert entry in text, text
    plan_line = next(line for line in text.splitlines() if line.startswith("    plan = {"))
    undivided = "\n".join(line for line in text.splitlines() if "shard_div_attr" not in line)
    for name, plugin_text in (("whole", undivided.replace(plan_line, "    plan = {}")), ("heads", undivided)):
        plugin = tmp_path / f"{name}.py"
        plugin.write_text(plugin_text)
        code, _, _ = run_cli("run", MODEL, "--rows", "tp-2", "--integration", plugin, "--dtype", "float32",
                             "--out", tmp_path / name, "-q")
        row = report_rows(tmp_path / name)["tp-2"]
        assert code == 1 and row["status"] in ("failed", "error"), (name, row)
        if name == "whole":
            assert "did not act" in " ".join(row["reasons"]), row


@pytest.mark.full
def test_cp_splits_packed_streams_and_makes_the_causal_text_attention_exact(run_cli, tmp_path):
    """The blocks take batch-less [tokens, features] streams (212 text, 48 vision tokens) and a RoPE tuple of
    [tokens, 16] tables: each split on dim 0 (the streams at `layers.0`, the tables at every block), gathered at the
    norms after the blocks. The text attends to itself with is_causal=True: under Ulysses every rank holds the whole
    text in order after the all-to-all, so the routed kernel hands an explicit causal mask over the gathered tokens
    (and GQA through cache-dit's replicate_kv_sequence): cp-ulysses-2 passes. Handing is_causal on to cache-dit as
    before fails the row (its CP refuses causal attention), and so does GQA handed on without a strategy."""
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", MODEL, "--out", out, "--rows", "cp-ulysses-2", "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    for entry in ('"und_seq": _ContextParallelInput(split_dim=0, expected_dims=2', '"layers.*": {"rotary_emb": [',
                  '"norm_moe_gen": _ContextParallelOutput(gather_dim=0, expected_dims=2)',
                  "route_attention([block.self_attn for block in transformer.layers])",
                  'CP_SPLIT_DIMS = {"layers": (0, 0)}'):
        assert entry in text, text
    causal = "if cp is not None and is_causal and one_stream and cp.ulysses_degree > 1 and cp.ring_degree == 1:"
    assert causal in text
    gqa = 'gqa = {"cp_gqa_strategy": "replicate_kv_sequence"} if cp is not None and enable_gqa else {}'
    assert gqa in text
    for name, opposite, error in (("causal", text.replace(causal, "if False:"), "Causal attention is not yet"),
                                  ("gqa", text.replace(gqa, "gqa = {}"), "GQA is not yet supported")):
        plugin = tmp_path / f"{name}.py"  # is_causal, or GQA without a strategy, handed on to cache-dit as before
        plugin.write_text(opposite)
        code, _, _ = run_cli("run", MODEL, "--rows", "cp-ulysses-2", "--integration", plugin, "--dtype", "float32",
                             "--out", tmp_path / name, "-q")
        row = report_rows(tmp_path / name)["cp-ulysses-2"]
        assert code == 1 and error in " ".join(row["reasons"]), (name, row)
