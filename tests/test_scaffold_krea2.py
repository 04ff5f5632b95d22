"""`ditgate scaffold` on Krea 2 (diffusers' Krea2Pipeline): one stream of text and image through single-stream
blocks whose attention counts its heads in `num_heads` / `num_kv_heads` (grouped-query) and gates its heads' output
with a Linear of its own (`to_gate`)."""

import pytest
from test_scaffold import report_rows, scaffold_passing


def _row(run_cli, plugin, row, out):
    code, _, _ = run_cli("run", "zoo:pipe/krea2", "--rows", row, "--integration", plugin, "--dtype", "float32",
                         "--out", out, "-q")
    return code, report_rows(out)[row]


@pytest.mark.full
def test_head_counts_under_other_names_and_the_head_gate_are_sharded_with_the_heads(run_cli, tmp_path):
    """The scaffold divides the attributes whose values are the observed query and key/value head counts (4 and 2,
    named `num_heads` and `num_kv_heads`; never `head_dim`) and shards `to_gate` Colwise, since its output reaches
    `to_out.0` (Rowwise) with the heads: tp-2 passes. On the survey the plugin divided `heads`, which Krea2Attention
    does not have ('no attribute heads' at apply); with `to_gate` kept whole (the rule for a chain whose second
    Linear is not Rowwise) the gate's whole width meets each rank's half of the heads and tp-2 fails."""
    text = scaffold_passing(run_cli, tmp_path, "zoo:pipe/krea2", "tp-2")
    divided = '        shard_div_attr(block.attn, "num_heads", tp)\n        shard_div_attr(block.attn, "num_kv_heads", tp)\n'
    gate = ', "attn.to_gate": ColwiseParallel()'
    assert divided in text and gate in text and '"head_dim"' not in text, text
    opposites = {"heads": text.replace(divided, '        shard_div_attr(block.attn, "heads", tp)\n'),
                 "gate_whole": text.replace(gate, "")}
    for name, opposite in opposites.items():
        assert opposite != text
        plugin = tmp_path / f"{name}.py"
        plugin.write_text(opposite)
        code, row = _row(run_cli, plugin, "tp-2", tmp_path / name)
        assert code == 1 and row["status"] in ("failed", "error"), (name, row)
    assert "no attribute 'heads'" in " ".join(report_rows(tmp_path / "heads")["tp-2"]["reasons"])


@pytest.mark.full
def test_attention_called_before_the_split_runs_whole_without_the_cp_config(run_cli, tmp_path):
    """Krea 2's text fusion (a child of the transformer holding two attention blocks, outside every block list) runs
    on the whole text before the split at `transformer_blocks.0` (observed: `text_fusion` first called before that
    block). Its processor passes on the CP config cache-dit sets on every attention, so the plugin runs those
    attentions without it (local=True): cp-ulysses-2 passes. On the survey the plugin left them as they were, and
    Ulysses gathered the whole text from both ranks against a mask of one copy ('tensor a (464) must match the size
    of tensor b (232)'); the plugin without those lines fails the row again."""
    text = scaffold_passing(run_cli, tmp_path, "zoo:pipe/krea2", "cp-ulysses-2")
    local = [f"    route_attention([transformer.get_submodule('text_fusion.{name}_blocks.0.attn')], local=True)\n"
             for name in ("layerwise", "refiner")]
    assert all(line in text for line in local) and "NOT HANDLED" not in text, text
    opposite = text
    for line in local:
        opposite = opposite.replace(line, "")
    plugin = tmp_path / "opposite.py"
    plugin.write_text(opposite)
    code, row = _row(run_cli, plugin, "cp-ulysses-2", tmp_path / "opposite")
    assert code == 1 and row["status"] in ("failed", "error"), row
