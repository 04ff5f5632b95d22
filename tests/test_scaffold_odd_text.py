"""`ditgate scaffold` on a joint text whose length the ranks do not divide and no call argument sets
(HunyuanVideo 1.5: 1000 + 256 + 729 text tokens, fixed in the pipeline)."""

import pytest
from test_scaffold import report_rows


@pytest.mark.full
def test_an_odd_masked_text_is_padded_with_masked_tokens_and_split_with_its_mask(run_cli, tmp_path):
    """The plugin pads the text and its mask with masked zero tokens up to a length the ranks divide, splits the mask
    with the text, and the routed attention gathers every rank's key mask in Ulysses' order: cp-ulysses-2 passes (on
    the survey cache-dit's split refused the 1985 tokens). Without the padding the row fails."""
    out = tmp_path / "plugin.py"
    code, stdout, err = run_cli("scaffold", "zoo:pipe/hunyuanvideo15", "--out", out, "--rows", "cp-ulysses-2",
                                "--run-dir", tmp_path / "run")
    assert code == 0, err + stdout
    text = out.read_text()
    pad = [line for line in text.splitlines(keepends=True) if line.startswith("    pad_text(transformer, ")]
    assert len(pad) == 1 and '"transformer_blocks.*": {"attention_mask": _ContextParallelInput(split_dim=1' in text
    plugin = tmp_path / "opposite.py"
    plugin.write_text(text.replace(pad[0], ""))
    code, _, _ = run_cli("run", "zoo:pipe/hunyuanvideo15", "--rows", "cp-ulysses-2", "--integration", plugin,
                         "--dtype", "float32", "--out", tmp_path / "opposite", "-q")
    row = report_rows(tmp_path / "opposite")["cp-ulysses-2"]
    assert code == 1 and row["status"] in ("failed", "error"), row["status"]
