"""`ditgate scaffold` on Sana: blocks that fold their token stream into the image grid (the height and width they are
handed) before a convolution feed-forward, and a linear self-attention no attention kernel is seen in."""

import pytest
from test_scaffold import report_rows, scaffold_passing

GATHER = "gather_grid(transformer, transformer.transformer_blocks, ('hidden_states',))"


def test_grid_blocks_are_seen_from_the_integers_they_fold_the_stream_with(run_cli, tmp_path):
    """The block is handed height 16 and width 16 (observed) and its code unflattens its 256 tokens with them: the
    plugin runs the blocks on the gathered stream, names the halo exchange it does not write, and runs their
    attention whole."""
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/sana", "--out", out, "--no-run")
    assert code == 0, err + stdout
    text = out.read_text()
    assert GATHER in text and "`height` = 16 x `width` = 16, observed" in text, text
    assert "halo exchange" in text and "not written" in text
    assert "`transformer_blocks.*.attn1` (SanaLinearAttnProcessor2_0): its blocks run on the gathered sequence" in text
    assert "NOT HANDLED" not in text.split("def cp_plan")[1].split("def tp_plan")[0]


@pytest.mark.full
def test_grid_blocks_run_on_the_gathered_stream_and_split_they_fail(run_cli, tmp_path):
    """Split at the first block, each rank hands Sana's block half the tokens with the whole grid's sizes (the
    survey's cp-ulysses-2 error: unflatten of 512 tokens into 32 x 32). Run on the gathered stream, where its linear
    attention also sees every key, cp-ulysses-2 passes; the plugin without `gather_grid` (the old
    plugin) fails the row."""
    text = scaffold_passing(run_cli, tmp_path, "zoo:pipe/sana", "cp-ulysses-2")
    assert GATHER in text, text
    plugin = tmp_path / "opposite.py"
    plugin.write_text(text.replace(GATHER, ""))  # the blocks run on each rank's share, as before
    code, _, _ = run_cli("run", "zoo:pipe/sana", "--rows", "cp-ulysses-2", "--integration", plugin, "--dtype",
                         "float32", "--out", tmp_path / "opposite", "-q")
    row = report_rows(tmp_path / "opposite")["cp-ulysses-2"]
    assert code == 1 and row["status"] in ("failed", "error") and "unflatten" in " ".join(row["reasons"]), row
